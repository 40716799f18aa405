"""A local cluster: one master and N worker daemons as processes on this host."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil

from harmony import dilation as dil
from harmony.client import Client, ClientError
from harmony.comm.security import init_keys
from harmony.cruise.plan import MAX_MOVES
from harmony.worker.netem import NetEm, parse_rate

DEFAULT_HOME = os.path.expanduser(os.environ.get("HARMONY_HOME", "~/.harmony"))


class ClusterError(RuntimeError):
    pass


def default_state_dir() -> str:
    return os.path.join(DEFAULT_HOME, "local")


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _ours(info: dict) -> list[int]:
    """The recorded pids that still belong to the processes we started."""
    started = info.get("started") or [None] * len(info.get("pids", []))
    return [pid for pid, t in zip(info.get("pids", []), started)
            if t is not None and _start_time(pid) == t]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def read_info(state_dir: str | None = None) -> dict | None:
    """The record of the local cluster running from ``state_dir`` (default
    the default local cluster's): its endpoint, keys, dashboard and pids;
    None if none runs there (no record, or its processes are gone)."""
    path = os.path.join(os.path.abspath(state_dir or default_state_dir()), "cluster.json")
    try:
        with open(path) as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not _ours(info):
        return None
    return info


def port_taken(host: str, port: int) -> bool:
    """Whether ``host:port`` cannot be bound (as the master would bind it)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as ZeroMQ does
        s.bind((host, port))
        return False
    except OSError:
        return True
    finally:
        s.close()


def port_owner(port: int) -> str:
    """Who listens on TCP ``port`` of this host, in words: a Harmony master
    names its local cluster (state dir) or state dir, another process its pid
    and name; "another program" when that cannot be seen."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return "another program"
    pids = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr
            and c.laddr.port == port and c.pid}
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            cmd = proc.cmdline()
        except psutil.Error:
            continue
        if any("harmony.master" in c or c.endswith("harmony-master") for c in cmd):
            sd = cmd[cmd.index("--state-dir") + 1] if "--state-dir" in cmd[:-1] else None
            if sd and os.path.basename(os.path.normpath(sd)) == "master" and \
                    os.path.exists(os.path.join(os.path.dirname(os.path.normpath(sd)),
                                                "cluster.json")):
                cl = os.path.dirname(os.path.normpath(sd))
                return (f"the Harmony master of the local cluster in {cl} (pid {pid}; "
                        f"'harmony cluster down --state-dir {cl}' stops it)")
            return (f"a Harmony master (pid {pid}" + (f", state dir {sd}" if sd else "")
                    + ")")
        return f"process {pid} ({proc.name()})"
    return "another program"


class LocalCluster:
    def __init__(self, machines: int, state_dir: str | None = None, host: str = "127.0.0.1",
                 port: int = 5760, detach: bool = False, log_level: str = "INFO",
                 heartbeat_timeout: float = 5.0, mode: str = "naive",
                 cpus_per_machine: int | None = None,
                 net_bandwidth: str | float | None = None, policy: str | None = None,
                 memory_per_machine: int | None = None, store_max: int | None = None,
                 preempt: bool = True, max_jobs_per_machine: int = 0,
                 isolate: bool = False, hide: list[str] | None = None,
                 keys: str | None = None, insecure: bool = False,
                 port_fallback: bool = False, dashboard: bool = True,
                 dashboard_port: int = 0, cpu_speed: str | list[float] | None = None,
                 cruise: bool = False, max_moves: int = MAX_MOVES,
                 dilation: float = 1.0, sync: str = "leader",
                 data_plane: str = "sealed") -> None:
        self.cruise = cruise
        self.data_plane = data_plane     # the workers' --data-plane
        self.sync = sync             # --sync: leader daemons or the master
        # time dilation: every machine D times slower, times reported undilated
        try:
            self.dilation = dil.check(dilation)
        except dil.DilationError as exc:
            raise ClusterError(str(exc)) from None
        self.max_moves = max_moves
        if machines < 1:
            raise ClusterError("--machines must be >= 1")
        # emulated slower machines: COMP time × 1/speed (one factor or one per machine)
        speeds = ([float(x) for x in cpu_speed.split(",")] if isinstance(cpu_speed, str)
                  else list(cpu_speed or [1.0]))
        if len(speeds) not in (1, machines) or not all(0 < x <= 1 for x in speeds):
            raise ClusterError(f"--cpu-speed: one factor in (0, 1] or one per machine "
                               f"({machines}), not {cpu_speed}")
        self.cpu_speed = speeds * machines if len(speeds) == 1 else speeds
        self.mode = mode
        self.policy = policy
        self.cpu_sets: list[list[int]] | None = None
        if cpus_per_machine is not None:
            cores = sorted(os.sched_getaffinity(0))
            if cpus_per_machine < 1:
                raise ClusterError("--cpus-per-machine must be >= 1")
            if cpus_per_machine * machines > len(cores):
                print(f"warning: {machines} machines x {cpus_per_machine} cores exceeds the "
                      f"{len(cores)} cores of this host; machines will share cores",
                      file=sys.stderr)
            self.cpu_sets = [[cores[(m * cpus_per_machine + j) % len(cores)]
                              for j in range(cpus_per_machine)] for m in range(machines)]
        # one rate, or one per machine ("12M,12M,4M": a heterogeneous cluster)
        self.rate: float | list[float] | None = net_bandwidth
        if isinstance(net_bandwidth, str):
            rates = [parse_rate(r) for r in net_bandwidth.split(",")]
            if len(rates) not in (1, machines):
                raise ClusterError(f"--net-bandwidth: {len(rates)} rates for {machines} "
                                   f"machines (give one, or one per machine)")
            self.rate = rates[0] if len(rates) == 1 else rates
        self.machines = machines
        # emulated memory: each worker's budget, enforced by its OOM killer
        self.memory_per_machine = memory_per_machine
        self.store_max = store_max
        self.preempt = preempt
        self.max_jobs_per_machine = max_jobs_per_machine
        self.state_dir = os.path.abspath(state_dir or default_state_dir())
        self.host, self.port, self.detach = host, port, detach
        # a taken port: a free one instead (port_note says why), or an error
        # that names who holds it
        self.port_fallback = port_fallback
        self.port_note = ""
        # the master's web dashboard and /metrics (harmony.obs), on loopback
        self.dashboard = dashboard
        self.dashboard_port = dashboard_port
        self.dashboard_url: str | None = None
        self.log_level = log_level
        self.heartbeat_timeout = heartbeat_timeout
        self.procs: list[subprocess.Popen] = []
        self.endpoint: str | None = None
        # CurveZMQ keys: a key set given (or $HARMONY_KEYS), else one made in
        # the state dir; --insecure (plain text) only when asked for
        self.insecure = insecure
        self.keys: str | None = None if insecure else os.path.abspath(
            keys or os.environ.get("HARMONY_KEYS") or os.path.join(self.state_dir, "keys"))
        # shared nothing, emulated: each worker daemon in its own mount
        # namespace, where the master's state dir, every other worker's state
        # dir and the ``hide`` paths are covered by an empty tmpfs
        self.isolate = isolate
        self.hide = [os.path.abspath(h) for h in (hide or [])]
        if isolate:
            why = isolation_unavailable()
            if why:
                raise ClusterError(f"--isolate needs mount namespaces: {why}")

    @property
    def info_path(self) -> str:
        return os.path.join(self.state_dir, "cluster.json")

    @property
    def master_file(self) -> str:
        """Where the master writes its endpoint for the daemons (outside its
        state dir, which isolated daemons cannot see): a daemon that loses
        the master reads it again, so a master restarted on another port is
        found (``--master-file`` of both)."""
        return os.path.join(self.state_dir, "master.json")

    def _spawn(self, args: list[str], log_name: str,
               hide: list[str] | None = None) -> subprocess.Popen:
        logs = os.path.join(self.state_dir, "logs")
        os.makedirs(logs, exist_ok=True)
        cmd = [sys.executable, "-m", *args]
        if hide:
            for h in hide:
                os.makedirs(h, exist_ok=True)
            mounts = " && ".join(f"mount -t tmpfs -o size=1m,mode=000 harmony-hidden {shlex.quote(h)}"
                                 for h in hide)
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   f'{mounts} && exec "$@"', "sh", *cmd]
        with open(os.path.join(logs, log_name), "ab") as fh:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                    stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=self.detach)

    def start(self, timeout: float = 60.0) -> str:
        os.makedirs(self.state_dir, exist_ok=True)
        if os.path.exists(self.info_path):
            old = json.load(open(self.info_path))
            if _ours(old):
                raise ClusterError(f"a local cluster is already running from {self.state_dir} "
                                   f"(master {old.get('endpoint')}); run 'harmony cluster down'")
            os.unlink(self.info_path)
        mdir = os.path.join(self.state_dir, "master")
        mjson = os.path.join(mdir, "master.json")
        names = [f"m{i}" for i in range(self.machines)]
        sec = ["--insecure"] if self.insecure else ["--keys", self.keys]
        if self.keys:
            # the dashboard's reader key: the master reads the job pages' logs with it
            init_keys(self.keys, workers=names, readers=["reader", "dashboard"])
        if self.port and port_taken(self.host, self.port):
            owner = port_owner(self.port)
            if not self.port_fallback:
                raise ClusterError(f"port {self.port} of {self.host} is taken by {owner}; "
                                   f"pass --port 0 for a free one (or another port)")
            self.port_note = f"port {self.port} is taken by {owner}"
            self.port = 0
        for stale in (mjson, self.master_file):
            if os.path.exists(stale):
                os.unlink(stale)
        master = self._spawn(["harmony.master", "start", "--host", self.host, "--port",
                              str(self.port), "--state-dir", mdir, "--log-level", self.log_level,
                              "--master-file", self.master_file,
                              "--mode", self.mode,
                              *(["--policy", self.policy] if self.policy else []),
                              *(["--cruise"] if self.cruise else []),
                              "--max-moves", str(self.max_moves), "--sync", self.sync,
                              "--max-jobs-per-machine", str(self.max_jobs_per_machine),
                              "--heartbeat-timeout", str(self.heartbeat_timeout), *sec,
                              "--dilation", repr(self.dilation),
                              *(["--dashboard-port", str(self.dashboard_port)]
                                if self.dashboard else [])],
                             "master.log")
        self.procs.append(master)
        deadline = time.time() + timeout
        while not os.path.exists(mjson):
            if master.poll() is not None:
                self.stop()
                raise ClusterError("master failed to start; see "
                                   + os.path.join(self.state_dir, "logs", "master.log"))
            if time.time() > deadline:
                self.stop()
                raise ClusterError("master did not come up in time")
            time.sleep(0.05)
        self.endpoint = json.load(open(mjson))["endpoint"]
        self.dashboard_url = _dashboard_url(mdir) if self.dashboard else None
        netem = None
        if self.rate:
            netem = os.path.join(self.state_dir, "netem.bin")
            rate = ([dil.link_rate(r, self.dilation) for r in self.rate]
                    if isinstance(self.rate, list) else dil.link_rate(self.rate, self.dilation))
            NetEm.create(netem, names, rate).close()
        for i, name in enumerate(names):
            extra = []
            if self.cpu_sets:
                extra += ["--cpu-set", ",".join(map(str, self.cpu_sets[i])),
                          "--cpus", str(len(self.cpu_sets[i]))]
            if netem:
                extra += ["--netem", netem]
            if self.cpu_speed[i] != 1.0:
                extra += ["--cpu-speed", str(self.cpu_speed[i])]
            if self.data_plane != "sealed":
                extra += ["--data-plane", self.data_plane]
            if self.memory_per_machine:
                extra += ["--memory", str(int(self.memory_per_machine)), "--oom-kill"]
            if self.store_max:
                extra += ["--store-max", str(int(self.store_max))]
            if not self.preempt:
                extra += ["--no-preempt"]
            hide = None
            if self.isolate:
                hide = [mdir, os.path.join(self.state_dir, "logs"), *self.hide,
                        *(os.path.join(self.state_dir, "workers", n) for n in names if n != name)]
            self.procs.append(self._spawn(
                ["harmony.worker", "start", "--master", self.endpoint, "--name", name,
                 "--master-file", self.master_file,
                 "--host", self.host, "--state-dir", os.path.join(self.state_dir, "workers", name),
                 "--log-level", self.log_level, "--dilation", repr(self.dilation),
                 *sec, *extra], f"worker-{name}.log",
                hide=hide))
        self._write_info()
        with Client(self.endpoint, timeout_s=5, keys=self.keys, insecure=self.insecure) as c:
            while True:
                try:
                    alive = [w for w in c.cluster()["workers"] if w["alive"]]
                    if len(alive) >= self.machines:
                        break
                except ClientError:
                    pass
                if any(p.poll() is not None for p in self.procs) or time.time() > deadline:
                    self.stop()
                    raise ClusterError("workers did not register in time; see "
                                       + os.path.join(self.state_dir, "logs"))
                time.sleep(0.1)
        return self.endpoint

    def _write_info(self) -> None:
        # start times guard 'cluster down' against pids reused by other programs
        with open(self.info_path, "w") as fh:
            json.dump({"endpoint": self.endpoint, "keys": self.keys,
                       "pids": [p.pid for p in self.procs],
                       "started": [_start_time(p.pid) for p in self.procs],
                       "machines": self.machines, "mode": self.mode,
                       "dilation": self.dilation,
                       "dashboard": self.dashboard_url}, fh)

    def stop(self, timeout: float = 15.0) -> None:
        stop_pids([p.pid for p in self.procs], timeout)
        for p in self.procs:
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        if os.path.exists(self.info_path):
            os.unlink(self.info_path)

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_clusters_on_sigterm() -> None:
    """For scripts that run :class:`LocalCluster` in ``with`` blocks (the
    benches): SIGTERM raises ``KeyboardInterrupt`` in the main thread, so
    each ``with`` block stops its cluster's processes on the way out instead
    of leaving them running (Python's default for SIGTERM is to exit at
    once, no ``__exit__`` run). ``KeyboardInterrupt``, not ``SystemExit``:
    the benches catch ``SystemExit`` from a failed run and go on. Call it
    from the main thread."""
    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _raise)


def _dashboard_url(master_dir: str) -> str | None:
    """The dashboard address the master wrote (harmony.obs), without token."""
    try:
        with open(os.path.join(master_dir, "dashboard.json")) as fh:
            return json.load(fh).get("url")
    except (OSError, ValueError, AttributeError):
        return None


def isolation_unavailable() -> str:
    """Why worker daemons cannot get mount namespaces here ("" if they can)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("unshare") is None:
        return "no 'unshare' command (util-linux)"
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                        "mount -t tmpfs harmony-probe /mnt"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"unshare --mount failed: {(r.stderr or r.stdout).strip()[:200]}"
    return ""


def stop_pids(pids: list[int], timeout: float = 15.0) -> None:
    """SIGTERM the workers (pids[1:]) and wait, then the master (pids[0]);
    SIGKILL whatever is still alive after ``timeout``."""
    for group in ([p for p in pids[1:] if p > 0], [p for p in pids[:1] if p > 0]):
        for pid in group:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        for pid in group:
            while _pid_alive(pid) and time.time() < deadline:
                try:  # reap it if it is our child
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:
                    pass
                time.sleep(0.05)
            if _pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass


def cluster_down(state_dir: str | None = None) -> bool:
    sd = os.path.abspath(state_dir or default_state_dir())
    path = os.path.join(sd, "cluster.json")
    try:
        with open(path) as fh:
            info = json.load(fh)
    except FileNotFoundError:   # none, or its `cluster up` removed it as it stopped
        return False
    except (OSError, ValueError):
        info = {}               # a damaged record: its processes are found below
    if not isinstance(info, dict):
        info = {}
    alive = set(_ours(info))
    # keep positions (pids[0] is the master); drop pids now owned by others
    stop_pids([p if p in alive else -1 for p in info.get("pids", [])])
    # a master or daemon restarted on this state dir by hand is not recorded:
    # found by its command line, stopped the same way (daemons first)
    masters, daemons = _unrecorded(sd)
    if masters or daemons:
        stop_pids([masters[0] if masters else -1] + daemons + masters[1:])
    try:
        os.unlink(path)
    except FileNotFoundError:   # removed meanwhile by the cluster's own stop
        pass
    return True


def _unrecorded(sd: str) -> tuple[list[int], list[int]]:
    """(masters, daemons): this user's Harmony processes still running with
    a ``--state-dir`` (or ``--master-file``) under ``sd``."""
    masters, daemons = [], []
    me = os.getpid()
    prefix = sd.rstrip(os.sep) + os.sep
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            cmd = proc.info["cmdline"] or []
            if proc.info["pid"] == me or proc.info["uids"] is None \
                    or proc.info["uids"].real != os.getuid():
                continue
        except (psutil.Error, KeyError):
            continue
        if not any(c.startswith("harmony.master") or c.startswith("harmony.worker")
                   or c.endswith(("harmony-master", "harmony-worker")) for c in cmd):
            continue
        if not any(c == sd or c.startswith(prefix) for c in cmd):
            continue
        is_master = any(c.startswith("harmony.master") or c.endswith("harmony-master")
                        for c in cmd)
        (masters if is_master else daemons).append(proc.info["pid"])
    return masters, daemons
