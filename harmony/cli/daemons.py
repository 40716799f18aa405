"""``harmony-master`` and ``harmony-worker``: the master and a worker daemon,
run in the foreground."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from harmony.client import master_address
from harmony.comm import security
from harmony import dilation as dil
from harmony.master.jobs import RETENTION_S
from harmony.policies import registry as PR
from harmony.cli.common import (_die, _scheduler_args, _security_args, _setup_logging,
                                objective_policy, parse_size)


_LOOPBACK = ("127.", "localhost", "::1")


def _process_keys(a: argparse.Namespace, role: str, name: str, host: str):
    """The keys a master or worker runs with; --insecure only on loopback."""
    if a.insecure:
        if not host.startswith(_LOOPBACK):
            raise security.SecurityError(f"--insecure is for loopback only, not {host}")
        print(f"harmony: WARNING: {role} running with --insecure: no authentication and no "
              f"encryption; anyone who reaches its ports controls the cluster",
              file=sys.stderr, flush=True)
        return None
    d = security.resolve_dir(a.keys)
    if d is None:
        raise security.SecurityError(f"no key set: pass --keys DIR (made by 'harmony keys "
                                     "init --dir DIR') or set HARMONY_KEYS; --insecure runs "
                                     "without authentication (loopback demos only)")
    return security.Keys.load(d, role, name)


# ---------------------------------------------------------------------------- master
def master_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harmony-master")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="run the master in the foreground")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=5760, help="control port (0 = random)")
    s.add_argument("--state-dir", default=os.path.join(os.path.expanduser("~/.harmony"), "master"))
    s.add_argument("--mode", default="harmony", choices=["isolated", "naive", "harmony"],
                   help="isolated: disjoint machines per job; naive: shared machines, no "
                        "coordination; harmony (default): shared machines, subtask queues + "
                        "synchronizer, and the Harmony scheduler")
    s.add_argument("--policy", default=None, choices=sorted(PR.POLICIES),
                   help="placement policy (default: the mode's: harmony, colocate or isolated)")
    _scheduler_args(s)
    s.add_argument("--heartbeat-timeout", type=float, default=5.0,
                   help="seconds without heartbeat before a worker is declared lost")
    dil.add_argument(s)
    s.add_argument("--max-jobs-per-machine", type=int, default=0,
                   help="colocate policy: at most this many jobs share a machine "
                        "(default 0: no limit)")
    _security_args(s)
    s.add_argument("--keep-models", type=int, default=None, metavar="N",
                   help="finished jobs whose final checkpoint (their model, for 'harmony "
                        "model get') is kept, the most recent first (default "
                        "$HARMONY_KEEP_MODELS or 20)")
    s.add_argument("--retention", type=float, default=RETENTION_S, metavar="S",
                   help="seconds a finished job stays in the live views (harmony jobs, the "
                        "dashboard, per-job metrics) after it ends; 'harmony jobs --all' "
                        "and 'status' show it after that too (default 3600; 0: always)")
    s.add_argument("--recover", action="store_true",
                   help="if the job table (STATE/master.lmdb) is damaged or missing, restore "
                        "its last good copy (STATE/master.lmdb.bak) and start")
    s.add_argument("--master-file", default=None, metavar="PATH",
                   help="also write this master's endpoint here (JSON), for worker daemons "
                        "started with the same --master-file")
    s.add_argument("--dashboard-port", type=int, default=None, metavar="P",
                   help="serve the web dashboard and Prometheus /metrics on port P (0: a "
                        "free one; default: none); 'harmony dashboard' prints its URL")
    s.add_argument("--dashboard-host", default="127.0.0.1",
                   help="address the dashboard binds (default 127.0.0.1; with keys, a "
                        "token is needed either way)")
    s.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    _setup_logging(a.log_level)
    from harmony.master.server import JobTableError, Master, StateDirLocked
    try:
        keys = _process_keys(a, "master", "", a.host)
        m = Master(a.state_dir, a.host, a.port, heartbeat_timeout=a.heartbeat_timeout,
                   policy=objective_policy(a), mode=a.mode, cruise=a.cruise,
                   max_moves=a.max_moves, sync=a.sync, retention=a.retention,
                   max_jobs_per_machine=a.max_jobs_per_machine,
                   keys=keys, keep_models=a.keep_models, recover=a.recover,
                   master_file=a.master_file, dashboard_port=a.dashboard_port,
                   dashboard_host=a.dashboard_host, dilation=a.dilation)
    except (StateDirLocked, JobTableError, ValueError, security.SecurityError) as exc:
        return _die(str(exc))
    except Exception as exc:  # e.g. address in use
        return _die(f"cannot start master: {exc}")
    prof_path = os.environ.get("HARMONY_MASTER_PROFILE")     # bench/master_load.py --profile
    if not prof_path:
        m.serve_forever()
        return 0
    import cProfile
    import time
    prof = cProfile.Profile(time.thread_time)   # the event loop's CPU, not its waits
    prof.enable()
    try:
        m.serve_forever()
    finally:
        prof.disable()
        prof.dump_stats(prof_path)
    return 0


# ---------------------------------------------------------------------------- worker
def worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harmony-worker")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="run a worker daemon in the foreground")
    s.add_argument("--master", default=None, help="tcp://HOST:PORT (default $HARMONY_MASTER)")
    s.add_argument("--name", default=None, help="machine name (default HOST-PID)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address this machine's executors bind and advertise")
    s.add_argument("--cpus", type=int, default=None, help="cores to offer (default: all)")
    s.add_argument("--memory", type=parse_size, default=None,
                   help="memory budget of this machine's jobs, e.g. 512M or 8G (default: all)")
    s.add_argument("--oom-kill", action="store_true",
                   help="enforce --memory: stop the largest executor when they exceed it")
    s.add_argument("--store-max", type=parse_size, default=None,
                   help="disk quota of each job's spill store, e.g. 10G (default: the disk)")
    s.add_argument("--state-dir", default=None)
    s.add_argument("--cpu-set", default=None,
                   help="pin this machine to these cores, e.g. 0,1 (emulated machines)")
    s.add_argument("--netem", default=None,
                   help="network emulation file of a local cluster (bandwidth caps)")
    s.add_argument("--cpu-speed", type=float, default=1.0,
                   help="emulate a slower machine: its COMPs take 1/F as long as measured "
                        "(0 < F <= 1; the rest is slept, holding the CPU queue)")
    dil.add_argument(s)     # must be the master's (checked when it registers)
    s.add_argument("--no-preempt", dest="preempt", action="store_false",
                   help="harmony mode: never stop a long COMP while a much shorter one "
                        "runs (the paper's non-preemptive CPU queue)")
    s.add_argument("--revision-file", default=None,
                   help="file holding the deployed code revision, reported to the master "
                        "(default $HARMONY_REVISION, else /opt/harmony/REVISION if it exists)")
    _security_args(s)
    s.add_argument("--master-file", default=None, metavar="PATH",
                   help="a file where the master writes its endpoint (harmony-master start "
                        "--master-file): read again when the master stops answering, so a "
                        "master restarted on another port is found")
    s.add_argument("--data-plane", choices=("sealed", "signed"), default="sealed",
                   help="PS and block traffic between executors: sealed (AES-256-GCM, "
                        "the default) or signed (authenticated but in plain text: "
                        "anyone on the network reads the model; every worker of a "
                        "cluster must use the same)")
    s.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    _setup_logging(a.log_level)
    from harmony.worker.daemon import Daemon
    master = a.master
    if master is None and a.master_file:        # no --master: the file names it, if there
        try:
            with open(a.master_file) as fh:
                master = json.load(fh).get("endpoint")
        except (OSError, ValueError, AttributeError):
            master = None
    try:
        cpu_set = [int(c) for c in a.cpu_set.split(",")] if a.cpu_set else None
        name = a.name or f"{__import__('socket').gethostname()}-{os.getpid()}"
        keys = _process_keys(a, "worker", name, a.host)
        revision = _revision(a.revision_file)
        if revision:    # the daemon reports it when it registers
            os.environ["HARMONY_REVISION"] = revision
        d = Daemon(master_address(master), name, a.host, a.cpus, a.memory, a.state_dir,
                   cpu_set=cpu_set, netem=a.netem, oom_kill=a.oom_kill, store_max=a.store_max,
                   preempt=a.preempt, keys=keys, master_file=a.master_file,
                   cpu_speed=a.cpu_speed, dilation=a.dilation, data_plane=a.data_plane)
    except (ValueError, security.SecurityError) as exc:
        return _die(str(exc))
    d.serve_forever()
    return 0


def _revision(path: str | None) -> str:
    """The code revision a worker reports: --revision-file, else
    $HARMONY_REVISION, else /opt/harmony/REVISION; "" if none (a missing
    file is ignored)."""
    if path is None and os.environ.get("HARMONY_REVISION"):
        return os.environ["HARMONY_REVISION"].strip()[:128]
    try:
        with open(path or "/opt/harmony/REVISION", encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip()[:128]
    except OSError as exc:
        if path is not None:
            logging.getLogger("harmony.worker").warning("no revision: %s", exc)
        return ""
