"""``harmony cluster`` (a local cluster: up, down, status) and ``harmony
demo`` (NMF on generated data on a local cluster of its own)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from harmony.client import DEFAULT_KEYS, Client, ClientError
from harmony.cluster import ClusterError, LocalCluster, cluster_down, default_state_dir
from harmony.cruise.plan import MAX_MOVES
from harmony.cli.common import _die, objective_policy
from harmony.cli.jobs import _read_app, follow


def cmd_cluster(a: argparse.Namespace) -> int:
    if a.action == "down":
        if cluster_down(a.state_dir):
            print("local cluster stopped")
            return 0
        return _die(f"no local cluster recorded in {a.state_dir or default_state_dir()}")
    if a.action == "status":
        with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
            info = c.cluster()
        if getattr(a, "json", False):
            print(json.dumps(info, indent=2))
        else:
            print("\n".join(cluster_table(info, time.time())))
        return 0
    try:
        default_port = int(os.environ.get("HARMONY_PORT") or 5760)
        cl = LocalCluster(a.machines, a.state_dir,
                          port=default_port if a.port is None else a.port,
                          port_fallback=a.port is None, detach=a.detach, mode=a.mode,
                          dashboard=a.dashboard_port >= 0,
                          dashboard_port=max(0, a.dashboard_port),
                          policy=objective_policy(a),
                          cpus_per_machine=a.cpus_per_machine, net_bandwidth=a.net_bandwidth,
                          memory_per_machine=a.memory_per_machine, preempt=a.preempt,
                          max_jobs_per_machine=a.max_jobs_per_machine, isolate=a.isolate,
                          keys=a.keys, insecure=a.insecure,
                          cpu_speed=getattr(a, "cpu_speed", None),
                          cruise=getattr(a, "cruise", False),
                          max_moves=getattr(a, "max_moves", MAX_MOVES),
                          sync=getattr(a, "sync", "leader"),
                          data_plane=getattr(a, "data_plane", "sealed"),
                          dilation=a.dilation)
    except (ClusterError, ValueError) as exc:
        return _die(str(exc), 2)
    try:
        ep = cl.start()
    except ClusterError as exc:
        return _die(str(exc))
    if cl.port_note:
        print(f"{cl.port_note}: using a free port", flush=True)
    print(f"local cluster up ({a.mode} mode): master {ep}, {a.machines} machine(s)"
          + (f" at dilation {a.dilation:g}" if a.dilation != 1 else "")
          + f", state in {cl.state_dir}", flush=True)
    if ep != "tcp://127.0.0.1:5760" or a.state_dir:
        print(f"  export HARMONY_MASTER={ep}" + (
            f"   (or pass --state-dir {a.state_dir} to any harmony command)"
            if a.state_dir else ""), flush=True)
    if cl.dashboard_url:
        url = _dashboard_link(ep, cl.keys, cl.insecure) or cl.dashboard_url
        print(f"  dashboard {url}", flush=True)
    if cl.insecure:
        print("  WARNING: --insecure: no authentication, no encryption", flush=True)
    elif os.path.abspath(cl.keys) != os.path.abspath(DEFAULT_KEYS):
        print(f"  export HARMONY_KEYS={cl.keys}", flush=True)
    if a.detach:
        print("stop it with: harmony cluster down" + (f" --state-dir {a.state_dir}"
                                                      if a.state_dir else ""), flush=True)
        return 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop and all(p.poll() is None for p in cl.procs):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping local cluster...", flush=True)
        cl.stop()
    return 0


def _pct(stats: dict, key: str) -> str:
    """A 0..1 use as a percentage; a use above 0 that rounds to 0 is "<1%"
    (a NIC's few KB/s against its 10 Gbit/s is use, not none)."""
    v = stats.get(key)
    if not isinstance(v, (int, float)):
        return "-"
    pct = f"{100 * v:.0f}%"
    return "<1%" if v > 0 and pct == "0%" else pct


def _bytes(n: object) -> str:
    if not isinstance(n, (int, float)) or n <= 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return "-"


def cluster_table(info: dict, now: float) -> list[str]:
    """``harmony cluster status`` as a table: the master's line, then one
    line per machine (alive or lost, when last heard from, cores and
    memory, its last heartbeat's CPU, network and memory use, how busy its
    CPU and NET queues were, its state disk's free space, its revision
    where any machine reports one, its jobs).
    ``--json`` prints the master's reply as it is, counters included."""
    from harmony.cli.jobs import _dur
    m = info.get("master") or {}
    ws = info.get("workers") or []
    alive = sum(1 for w in ws if w.get("alive"))
    head = (f"master {m.get('endpoint', '?')} ({m.get('mode', '?')} mode"
            + (f", dilation {m['dilation']:g}" if (m.get("dilation") or 1) != 1 else "")
            + (f", revision {m['revision']}" if m.get("revision") else "")
            + f"): {alive} of {len(ws)} machine(s) alive"
            + (f", {m['bad_messages']} bad message(s) refused" if m.get("bad_messages") else ""))
    revs = any(w.get("revision") for w in ws)     # a column once any machine has one
    lines = [head, f"{'MACHINE':12} {'STATE':6} {'SEEN':>9} {'CPUS':>4} {'MEMORY':>9} "
                   f"{'CPU':>5} {'NET':>5} {'MEM':>5} {'Q_CPU':>5} {'Q_NET':>5} "
                   f"{'DISK FREE':>10}  " + ("REVISION     " if revs else "") + "JOBS"]
    for w in ws:
        st = w.get("utilization") or {}
        seen = _dur(now - w["last_seen"]) + " ago" if w.get("last_seen") else "-"
        jobs = w.get("jobs") or []
        lines.append(
            f"{w.get('name', '?')[:12]:12} {'alive' if w.get('alive') else 'lost':6} "
            f"{seen:>9} {w.get('cpus') or '-':>4} {_bytes(w.get('memory')):>9} "
            f"{_pct(st, 'cpu'):>5} {_pct(st, 'net'):>5} {_pct(st, 'mem'):>5} "
            f"{_pct(st, 'q_cpu'):>5} {_pct(st, 'q_net'):>5} {_bytes(st.get('disk_free')):>10}  "
            + (f"{(w.get('revision') or '-')[:12]:12} " if revs else "")
            + (",".join(jobs[:6]) + (f" (+{len(jobs) - 6})" if len(jobs) > 6 else "")
               if jobs else "-"))
    return lines


def _dashboard_link(master: str | None, keys=None, insecure: bool = False) -> str | None:
    """The dashboard's URL with this client's token, from the master."""
    try:
        with Client(master, keys=keys, insecure=insecure, timeout_s=5) as c:
            d = c.dashboard()
    except ClientError:
        return None
    if not d.get("url"):
        return None
    return d["url"] + (f"?token={d['token']}" if d.get("token") else "")



def _repo_app(name: str) -> str:
    path = Path(__file__).resolve().parent.parent.parent / "apps" / name
    if not path.exists():
        raise FileNotFoundError(f"cannot find {path} (run the demo from a source checkout)")
    return str(path)


def cmd_demo(a: argparse.Namespace) -> int:
    from harmony.datagen.nmf import gen_nmf
    with tempfile.TemporaryDirectory(prefix="harmony-demo-") as tmp:
        data = os.path.join(tmp, "ratings.txt")
        shape = gen_nmf(data, users=a.users, items=a.items, rank=8, per_user=a.per_user,
                        noise=0.1, seed=1)
        print(f"generated {shape['ratings']:,} ratings ({a.users:,} users x {a.items:,} items, "
              f"planted rank 8, noise 0.1) in {data}", flush=True)
        cl = LocalCluster(a.machines, os.path.join(tmp, "cluster"), port=0, mode="harmony",
                          keys=os.path.join(tmp, "keys"),     # its own key set, not the user's
                          dilation=a.dilation)
        try:
            ep = cl.start()
            print(f"local cluster up: master {ep}, {a.machines} machines, Harmony scheduler",
                  flush=True)
            app = _repo_app("nmf.py")
            name, src = _read_app(app)
            args = ["--input", data, "--rank", "8", "--max-epochs", str(a.epochs),
                    "--iters-per-epoch", "2"]
            with Client(ep, keys=cl.keys, insecure=cl.insecure) as c:
                job = c.submit(name, src, args, a.machines)
                print(f"submitted {job}: harmony submit apps/nmf.py --machines {a.machines} "
                      + " ".join(args), flush=True)
                rc = follow(c, job)
        except (ClusterError, ClientError) as exc:
            return _die(str(exc))
        except Exception as exc:     # the cause first, then the cluster stops
            _die(f"{exc.__class__.__name__}: {exc}")
            raise
        finally:
            cl.stop()
            print("local cluster stopped", flush=True)
    return rc
