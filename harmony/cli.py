"""Command lines: ``harmony-master``, ``harmony-worker`` and ``harmony``."""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from harmony.app import AppError, load_app, option_parser, parse_app_args
from harmony.client import DEFAULT_KEYS, Client, ClientError, master_address
from harmony.cluster import (ClusterError, LocalCluster, cluster_down, default_state_dir,
                             read_info)
from harmony.comm import security
from harmony import dilation as dil
from harmony.cruise.plan import MAX_MOVES
from harmony.policies import registry as PR
from harmony.obs import progress
from harmony.store import staging


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 4G)")
    mult = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def _die(msg: str, code: int = 1) -> int:
    sys.stdout.flush()      # what was printed before the error shows before it
    print(f"harmony: error: {msg}", file=sys.stderr, flush=True)
    return code


def _security_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--keys", default=None,
                   help="the cluster's key set (CurveZMQ; 'harmony keys init'); default "
                        "$HARMONY_KEYS")
    s.add_argument("--insecure", action="store_true",
                   help="no authentication, no encryption: only for demos on loopback")


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
                   max_moves=a.max_moves,
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
                   cpu_speed=a.cpu_speed, dilation=a.dilation)
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


# ---------------------------------------------------------------------------- harmony
def _fmt_metrics(metrics: dict, digits: int = 6) -> str:
    return progress.fmt_metrics(metrics, digits)


def follow(client: Client, job: str, out=None, poll_s: float = 0.5,
           max_epochs: int | None = None, target: float | None = None,
           json_lines: bool = False) -> int:
    """Follow a job until it ends (a progress bar on a terminal, plain lines
    otherwise, JSON lines with ``json_lines``); return 0 iff it finished."""
    return progress.follow(client, job, out=out, poll_s=poll_s, max_epochs=max_epochs,
                           target=target, json_lines=json_lines)


def _read_app(path: str) -> tuple[str, str]:
    try:
        src = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AppError(f"cannot read app file {path}: {exc}") from None
    return os.path.basename(path), src


def size_note(cluster: dict, job: str, machines: int) -> str:
    """What a job that asks for more machines than are alive will get, by
    the master's mode ("" when it fits)."""
    alive = sum(1 for w in cluster.get("workers", ()) if w.get("alive"))
    if machines <= alive:
        return ""
    mode = (cluster.get("master") or {}).get("mode", "")
    if mode == "harmony":
        return (f"the cluster has {alive} live machine(s); {job} asks for {machines} and gets "
                f"at most {alive} (the scheduler may widen or narrow a job, within its "
                f"speed-up curve)")
    return (f"the cluster has {alive} live machine(s); {job} asks for {machines} and waits "
            f"until that many are alive (in {mode or 'this'} mode a job runs at the DoP it "
            f"asks for)")


def cmd_submit(a: argparse.Namespace, app_args: list[str]) -> int:
    try:
        name, src = _read_app(a.app)
        cls = load_app(src, name)
        if "-h" in app_args or "--help" in app_args:
            print(option_parser(cls).format_help().replace(
                f"usage: harmony submit {cls.name}", f"usage: harmony submit {a.app} "
                "[--machines N] [--wait] [--master URL]"))
            return 0
        clash = sorted({"--" + o.name.replace("_", "-") for o in cls.options}
                       & set(getattr(a, "_flags", ())) & set(getattr(a, "_taken", ())))
        for flag in clash:
            print(f"note: {flag} was taken as harmony's own option; to give the app's "
                  f"{flag}, put it after --  (harmony submit {a.app} ... -- {flag} VALUE)",
                  file=sys.stderr)
        opts = parse_app_args(cls, app_args)  # fail fast on bad options, before the master
    except AppError as exc:
        return _die(str(exc), 2)
    if a.machines < 1:
        return _die("--machines must be >= 1", 2)
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        job = c.submit(name, src, app_args, a.machines, a.name, a.group,
                       checkpoint_every=a.checkpoint_every,
                       checkpoint_seconds=a.checkpoint_seconds)
        print(json.dumps({"job": job}) if a.json else job, flush=True)
        a._following = job
        note = size_note(c.cluster(), job, a.machines)
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        if a.wait or a.save_model:
            rc = follow(c, job, max_epochs=opts.max_epochs, target=opts.target_objective,
                        json_lines=a.json)
            if rc == 0 and a.save_model:
                # the caller's own code: the app it just submitted
                return save_model(c, job, a.save_model, fresh=False, trust_app=True)
            return rc
    return 0


def save_model(c: Client, job: str, out: str, fresh: bool | None = None,
               inputs: bool = True, wait_s: float = 3600.0, app_file: str | None = None,
               trust_app: bool = False) -> int:
    """Fetch a job's model, export it with its app, write ``out``."""
    from harmony.export import ExportError, describe, export_arrays, write
    try:
        model = c.model(job, fresh=fresh, inputs=inputs, wait_s=wait_s, app_file=app_file,
                        trust_app=trust_app)
        arrays = export_arrays(model)
        fmt = write(out, model, arrays)
    except ExportError as exc:
        return _die(str(exc))
    except OSError as exc:
        return _die(f"cannot write {out}: {exc}")
    src = model.source
    what = ("final checkpoint" if src.final else
            f"{src.state} job's checkpoint")
    print(f"wrote {out} ({fmt}): {job} ({src.app_name}) after epoch {src.epoch + 1}, "
          f"{what}; {describe(arrays)}", flush=True)
    return 0


def cmd_model(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        return save_model(c, a.job, a.out, fresh=False if a.latest else None,
                          inputs=a.inputs, wait_s=a.timeout, app_file=a.app,
                          trust_app=a.trust_app)


def _dur(s: float) -> str:
    s = max(0.0, float(s))
    return f"{s:.1f}s" if s < 60 else f"{s / 60:.1f}m" if s < 3600 else f"{s / 3600:.1f}h"


def cmd_jobs(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        jobs = c.jobs()
    if a.json:
        print(json.dumps(jobs, indent=2))
        return 0
    print(f"{'JOB':10} {'APP':8} {'STATE':10} {'FOR':>7} {'MACH':>4} {'EPOCHS':>6} "
          f"{'OBJECTIVE':>12} {'T_CPU':>7} {'T_NET':>7} {'T_ITER':>7}  {'GROUP':10} WORKERS")
    for j in jobs:
        obj = "" if j["objective"] is None else f"{j['objective']:.6g}"
        p = j.get("profile") or {}
        prof = " ".join(f"{p[k]:7.3f}" if k in p else f"{'':7}"
                        for k in ("t_cpu", "t_net", "t_iter"))
        group = j.get("sched_group") or j.get("group") or "-"
        print(f"{j['id']:10} {j['app'][:8]:8} {j['state']:10} {_dur(j.get('in_state', 0)):>7} "
              f"{len(j['workers']) or j['machines']:>4} {j['epochs']:>6} {obj:>12} {prof}  "
              f"{group[:10]:10} {','.join(j['workers'])}")
    return 0


def top_words_lines(c: Client, job: str, app_file: str | None = None,
                    trust_app: bool = False) -> list[str]:
    """The top words per topic of a job's latest checkpoint (an app whose
    export has ``top_words`` or ``top_word_ids``, i.e. LDA)."""
    from harmony.export import ExportError, export_arrays
    try:
        model = c.model(job, fresh=False, inputs=False, app_file=app_file,
                        trust_app=trust_app)
        arrays = export_arrays(model)
    except ExportError as exc:
        raise ClientError(str(exc)) from None
    words = arrays.get("top_words")
    note = ""
    if words is None:
        if "top_word_ids" not in arrays:
            raise ClientError(f"{job} ({model.source.app_name}) exports no top words")
        words, note = arrays["top_word_ids"] + 1, " (word ids: the job ran without --vocab)"
    src = model.source
    head = (f"top words after epoch {src.epoch + 1} "
            f"({'final' if src.final else 'latest'} checkpoint){note}:")
    return [head] + [f"  topic {k:3d}: " + " ".join(str(w) for w in row)
                     for k, row in enumerate(words.tolist())]


def cmd_status(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        st = c.status(a.job)
        tops = top_words_lines(c, a.job, a.app, a.trust_app) if a.top_words else []
    if a.json:
        if a.top_words:
            st["top_words"] = tops[1:]
        print(json.dumps(st, indent=2))
        return 0
    print(f"job        {st['id']} ({st['app']})")
    print(f"state      {st['state']}  (attempt {st['attempt']})")
    print(f"machines   {st['machines']}  {', '.join(st['workers'])}")
    print(f"elapsed    {st['elapsed']:.1f}s")
    print("time in    " + ", ".join(f"{k} {v:.1f}s" for k, v in st["state_time"].items()))
    p = st.get("profile") or {}
    if p:
        print(f"profile    Tcpu {p['t_cpu']:.3f}s  Tnet {p['t_net']:.3f}s  "
              f"iteration {p['t_iter']:.3f}s  (moving averages at {p['machines']} machines)")
    if st.get("group"):
        print(f"group      {st['group']} (explicit)")
    if st.get("sched_group"):
        line = f"group      {st['sched_group']}"
        if st.get("predicted_iter") is not None:
            line += f"  predicted iteration {st['predicted_iter']:.3f}s"
        if st.get("measured_iter") is not None:
            line += (f", measured {st['measured_iter']:.3f}s "
                     f"(error {100 * st['prediction_error']:.1f}%)")
        print(line)
    ck = st.get("checkpoint")
    if ck:
        print(f"checkpoint {'final, ' if ck.get('final') else ''}after epoch {ck['epoch'] + 1}, "
              f"{_dur(ck['age'])} ago: {ck['parts']} "
              f"part(s), {ck['replicas']} replicated, {ck['bytes'] / 2**20:.1f} MiB on "
              f"{', '.join(ck.get('holders', []))}"
              + (f"  (the model: 'harmony model get {st['id']} --out FILE')"
                 if ck.get("final") else ""))
    if st.get("ckpt_skipped"):
        print(f"warning    {st['ckpt_skipped']}")
    if st.get("why"):
        print(f"why        {st['why']}")
    lay = st.get("layout")
    if lay:
        print(f"roles      workers {', '.join(lay['workers'])} (input blocks "
              f"{', '.join(str(lay['input_blocks'][m]) for m in lay['workers'])}); servers "
              f"{', '.join(lay['servers'])} (model blocks "
              f"{', '.join(str(lay['model_blocks'][m]) for m in lay['servers'])})")
        cr = lay.get("cruise")
        if cr:
            eps = [e for e in st.get("epochs", []) if e.get("epoch", -1) >= cr["at_epoch"]]
            secs = [e["timings"]["train"] for e in eps if (e.get("timings") or {}).get("train")]
            print(f"cruise     predicted epoch {cr['before']:.2f}s -> {cr['after']:.2f}s "
                  f"(move {cr['move_s']:.1f}s)" + (f"; measured since {sum(secs) / len(secs):.2f}s"
                                                   if secs else ""))
    cv = st.get("cruise")
    if cv:
        eps = [e for e in st.get("epochs", [])[-5:]]
        secs = [e["timings"]["train"] for e in eps if (e.get("timings") or {}).get("train")]
        print(f"cruise     at epoch {cv['at_epoch']}: predicted epoch {cv['now']:.3f}s on this "
              f"layout" + (f" (measured {sum(secs) / len(secs):.3f}s)" if secs else "")
              + f", {cv['best']:.3f}s with {cv['workers']} worker(s) and {cv['servers']} "
                f"server(s): {'moves' if cv['decision'] == 'move' else 'keeps'} "
                f"({cv.get('why', '')})")
    mv = st.get("move")
    if mv:
        print(f"move       {', '.join(mv['from'])} -> {', '.join(mv['to'])}: {mv['state']}"
              + (f", {mv.get('blocks_moved', 0)} of {mv['blocks']} block(s), "
                 f"{mv.get('bytes_moved', 0) / 2**20:.1f} MiB sent" if mv.get("blocks") else ""))
        if mv.get("ops"):
            print(f"plan       {mv.get('ops_done', 0)} of {mv['ops']} operation(s) done"
                  + (f"; moving: {', '.join(mv['moves_running'])}"
                     if mv.get("moves_running") else ""))
    if st.get("error"):
        print(f"error      {st['error']}")
    for machine, ms in sorted((st.get("store") or {}).items()):
        print(f"store      {machine}: alpha {ms.get('alpha', 0):.2f}  "
              f"blocks {ms.get('mem_blocks', 0):.0f} in memory, {ms.get('disk_blocks', 0):.0f} "
              f"on disk  reload stall {ms.get('stall_s', 0):.3f}s  memory "
              f"{ms.get('anon_mb', 0):.0f} MiB (RSS {ms.get('rss_mb', 0):.0f}; machine "
              f"{ms.get('machine_mb', 0):.0f} of {ms.get('budget_mb', 0):.0f} MiB)"
              + ("  model spilled" if ms.get("model_spilled") else "")
              + f"  [epoch {ms.get('epoch', 0) + 1}; next alpha "
              f"{ms.get('next_alpha', ms.get('alpha', 0)):.2f}: {ms.get('reason', '')}]")
    for line in tops:
        print(line)
    if a.events:
        for line in event_lines(st):
            print(line)
    if st["epochs"]:
        total = st.get("epochs_total", len(st["epochs"]))
        print(f"epochs     {total}" + (f" (the last {len(st['epochs'])} below)"
                                       if total > len(st["epochs"]) else "")
              + "  (full precision: --json)")
        for line in progress.epoch_table(st["epochs"], st.get("started")):
            print("  " + line)
    return 0


def event_lines(st: dict) -> list[str]:
    """``harmony status JOB --events``: one line per event of the job's
    story, its time in seconds since submission, the state and the note."""
    evs = st.get("events") or []
    t0 = st.get("submitted") or (evs[0][0] if evs else 0.0)
    out = [f"events     {len(evs)}" + (f" ({st['events_dropped']} older ones dropped after "
                                       f"the first)" if st.get("events_dropped") else "")]
    for i, ev in enumerate(evs):
        if i == 1 and st.get("events_dropped"):
            out.append(f"  {'':>9}  ... {st['events_dropped']} event(s) dropped")
        t, state, note = (list(ev) + ["", "", ""])[:3]
        out.append(f"  {float(t) - t0:8.1f}s  {state:<10} {note}")
    return out


def cmd_cancel(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        info = c.cancel(a.job)
    print(f"{a.job} {info.get('state', 'cancelled')}")
    return 0


def cmd_pause(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        c.pause(a.job)
    print(f"{a.job} pausing: it checkpoints at the end of its current epoch "
          f"('harmony resume {a.job}' continues it)")
    return 0


def _scheduler_args(s: argparse.ArgumentParser) -> None:
    """--cruise and --objective, for harmony-master start and cluster up."""
    s.add_argument("--cruise", action="store_true",
                   help="Cruise inside running jobs: from their measured compute and link "
                        "speeds, move to a better worker/server layout on their machines "
                        "when the predicted gain repays the move by 5%%")
    s.add_argument("--max-moves", type=int, default=MAX_MOVES, metavar="N",
                   help="a live resize runs its plan's block moves at most N at once over "
                        "the whole job, the most blocks first (default 4, Cruise's limit; "
                        "0: all at once, each sender keeping 4 blocks open)")
    s.add_argument("--objective", default="throughput", choices=["throughput", "util"],
                   help="the Harmony scheduler's objective: throughput (default: each job's "
                        "iteration rate over its rate alone at its best DoP, summed) or util "
                        "(the paper's cluster utilization U; the same as --policy "
                        "harmony-util)")


def objective_policy(a: argparse.Namespace) -> str | None:
    """``--policy`` with ``--objective`` applied: util makes the Harmony
    scheduler the paper's (``harmony-util``)."""
    if getattr(a, "objective", "throughput") != "util":
        return a.policy
    if a.policy not in (None, "harmony", "harmony-util") or \
            (a.policy is None and getattr(a, "mode", "harmony") != "harmony"):
        raise SystemExit("harmony: error: --objective applies to the Harmony scheduler "
                         "(--mode harmony, --policy harmony)")
    return "harmony-util"


def cmd_resize(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        info = c.resize(a.job, a.machines, a.workers, a.servers)
    if info.get("state") == "unchanged":
        print(f"{a.job} already runs on {', '.join(info['machines'])}")
    else:
        print(f"{a.job} resizing to {', '.join(info['machines'])}: its blocks move at the end "
              f"of its current epoch while it keeps running")
    return 0


def cmd_resume(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        info = c.resume(a.job, a.machines)
    print(f"{a.job} {info.get('state', 'waiting')}: resumes from its checkpoint when placed")
    return 0


def cmd_cluster(a: argparse.Namespace) -> int:
    if a.action == "down":
        if cluster_down(a.state_dir):
            print("local cluster stopped")
            return 0
        return _die(f"no local cluster recorded in {a.state_dir or default_state_dir()}")
    if a.action == "status":
        with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
            info = c.cluster()
        print(json.dumps(info, indent=2))
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


def cmd_dashboard(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        d = c.dashboard()
    if not d.get("url"):
        return _die("this master runs no dashboard ('harmony-master start --dashboard-port "
                    "P' starts one)")
    url = d["url"] + (f"?token={d['token']}" if d.get("token") else "")
    if a.json:
        print(json.dumps({"url": url, "metrics": d["url"].rstrip("/") + "/metrics",
                          "token": d.get("token"), "expires": d.get("expires")}))
    else:
        print(url)
        print(f"  Prometheus: {d['url'].rstrip('/')}/metrics"
              + (f" (header 'Authorization: Bearer {d['token']}')" if d.get("token") else ""))
        if d.get("expires"):
            print(f"  the token is good until "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(d['expires']))}")
    return 0


def cmd_logs(a: argparse.Namespace) -> int:
    """A job's executor logs, fetched from each machine's data service."""
    from harmony.obs import logs as L
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        places = c.log_sources(a.job)
        if a.machine:
            places = [p for p in places if p[0] in a.machine.split(",")]
            if not places:
                return _die(f"no live machine named {a.machine} (live: "
                            f"{', '.join(m for m, _ in c.log_sources(a.job)) or 'none'})")
        offsets: dict[str, int] = {}
        shown: dict[str, str] = {}
        many = len(places) > 1
        found = False
        while True:
            new = False
            for machine, ep in places:
                try:
                    d = L.fetch(c.ctx, ep, a.job, offsets.get(machine, 0),
                                which=a.attempt, keys=c.keys)
                except PermissionError as exc:
                    return _die(f"{machine}: {exc} (logs need a client or reader key)")
                except (TimeoutError, RuntimeError) as exc:
                    print(f"harmony: warning: {machine}: {exc}", file=sys.stderr, flush=True)
                    continue
                if not d["attempts"]:
                    continue
                found = True
                name = d["attempts"][d["attempt"]][0]
                if shown.get(machine) != name:      # a new attempt here: from its start
                    if machine in shown and offsets.get(machine):
                        offsets[machine] = 0
                        continue
                    shown[machine] = name
                    if a.list:
                        for n, size, live in d["attempts"]:
                            print(f"{machine:10} {n:32} {size:>10} bytes"
                                  f"{'  (running)' if live else ''}")
                        continue
                    print(f"==> {machine}: {name}{' (live)' if d['live'] else ''} <==",
                          flush=True)
                if a.list:
                    continue
                text = d["text"]
                if text:
                    new = True
                    offsets[machine] = d["offset"] + len(text.encode("utf-8", "replace"))
                    if many and not text.endswith("\n"):
                        text += "\n"
                    sys.stdout.write(text)
                    sys.stdout.flush()
                if d["offset"] + len(d["text"].encode()) < d["size"]:
                    new = True      # more than one reply's worth: read on at once
            if a.list or (not a.follow and not new):
                break
            if not new:
                if c.status(a.job)["state"] in ("finished", "failed", "cancelled") and \
                        not a.follow_forever:
                    break
                time.sleep(0.5)
    if not found:
        return _die(f"no logs of {a.job} on any live machine (kept "
                    f"{int(L.KEEP_SECONDS // 86400)} days, at most "
                    f"{L.KEEP_BYTES >> 20} MiB per machine)")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    """PNG plots of a run from the master's records: its metrics logs, and
    the job table if the master still runs."""
    from harmony.obs import report as R
    sd = os.path.abspath(a.state_dir or default_state_dir())
    metrics = a.metrics or os.path.join(sd, "master", "metrics")
    if not os.path.isdir(metrics):
        return _die(f"no metrics in {metrics} (a master's STATE/metrics: pass --metrics DIR, "
                    f"or --state-dir D of a local cluster)", 2)
    jobs = None
    master, keys, insecure = a.master, a.keys, a.insecure
    info = read_info(sd) if master is None else None
    if info:
        master = info.get("endpoint")
        keys = keys or info.get("keys")
        insecure = insecure or not info.get("keys")
    if master is not None or info:
        try:
            with Client(master, keys=keys, insecure=insecure, timeout_s=5) as c:
                jobs = [c.status(j["id"]) for j in c.jobs()]
        except ClientError as exc:
            print(f"harmony: warning: no job table ({exc}); JCT from the metrics logs, no "
                  f"objective curves", file=sys.stderr, flush=True)
    try:
        paths = R.write(a.out, R.load(metrics, jobs))
    except R.ReportError as exc:
        return _die(str(exc))
    print(f"report of {metrics} in {a.out}:")
    for p in paths:
        print(f"  {p}")
    return 0


def _trust_args(p: argparse.ArgumentParser) -> None:
    """Whose app code an export may run here (harmony.export.vouch)."""
    p.add_argument("--app", default=None, metavar="FILE",
                   help="your copy of the job's app (must match the job's source): its "
                        "export runs here. A bundled app needs none")
    p.add_argument("--trust-app", action="store_true",
                   help="run the job's own app code in this process to export (whoever "
                        "submitted the job wrote it)")


def _repo_app(name: str) -> str:
    path = Path(__file__).resolve().parent.parent / "apps" / name
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


def cmd_keys(a: argparse.Namespace) -> int:
    d = a.dir or os.environ.get("HARMONY_KEYS") or os.path.expanduser("~/.harmony/keys")
    split = lambda t: [x for x in t.split(",") if x]  # noqa: E731
    try:
        d = security.init_keys(d, workers=split(a.workers), clients=split(a.clients),
                               readers=split(a.readers))
        security.check_modes(d)
    except (OSError, security.SecurityError) as exc:
        return _die(str(exc))
    print(f"key set in {d}: cluster.key (servers), workers/ clients/ readers/ "
          f"(*.key public, *.key_secret private, mode 600)")
    print(f"  export HARMONY_KEYS={d}")
    return 0


def cmd_data_staged(a: argparse.Namespace) -> int:
    with Client(a.master, keys=a.keys, insecure=a.insecure) as c:
        if a.action == "put":
            name = a.name or os.path.basename(a.file)
            if not os.path.isfile(a.file):
                return _die(f"no such file: {a.file}", 2)
            try:
                info = c.data_put(a.file, name)
            except staging.StagingError as exc:
                return _die(str(exc), 2)
            print(f"staged {a.file} as harmony://{name} ({info['chunks']} chunk(s), "
                  f"2 copies each where 2+ workers)")
        elif a.action == "ls":
            sets = c.data_list()
            if a.json:
                print(json.dumps(sets, indent=2))
                return 0
            print(f"{'NAME':24} {'SIZE':>10} {'CHUNKS':>6}  HOLDERS")
            for d in sets:
                warn = (f"  ({d['unavailable_chunks']} chunk(s) on no live worker)"
                        if d["unavailable_chunks"] else "")
                print(f"{d['name'][:24]:24} {d['size'] / 2**20:>8.1f}Mi {d['chunks']:>6}  "
                      f"{','.join(d['holders'])}{warn}")
        else:
            info = c.data_rm(a.name)
            print(f"removed harmony://{a.name}" if info.get("recorded", True) else
                  f"harmony://{a.name} is not recorded; every live worker was asked to drop "
                  f"any chunks of it (left by a put that never ended)")
    return 0


def cmd_data(a: argparse.Namespace) -> int:
    if a.action in ("put", "ls", "rm"):
        return cmd_data_staged(a)
    from harmony.datagen import generators
    try:
        shape = generators()[a.kind].generate(a)
    except (ValueError, OSError) as exc:
        return _die(str(exc), 2)
    print(json.dumps({"out": a.out, **shape}))
    return 0


def _target(a: argparse.Namespace) -> None:
    """The master (and key set) a client command talks to: --master, else
    the local cluster recorded in --state-dir D, else $HARMONY_MASTER, else
    the default local cluster if it runs (wherever its port), else
    tcp://127.0.0.1:5760. A recorded cluster also gives its key set unless
    --keys is given."""
    if not hasattr(a, "master") or a.cmd == "report" or (
            a.cmd == "cluster" and a.action in ("up", "down")):
        return
    sd = getattr(a, "state_dir", None)
    if sd is not None:
        info = read_info(sd)
        if info is None:
            raise ClientError(f"no local cluster runs from {sd} (nothing recorded in "
                              f"{os.path.join(sd, 'cluster.json')}, or its processes are "
                              f"gone); 'harmony cluster up --state-dir {sd}' starts one",
                              "unreachable")
    elif a.master is None and not os.environ.get("HARMONY_MASTER"):
        info = read_info(None)
    else:
        info = None
    if not info:
        return
    if a.master is None:
        a.master = info.get("endpoint")
    if a.keys is None and not a.insecure:
        if info.get("keys"):
            a.keys = info["keys"]
        else:                   # a local cluster started with --insecure
            a.insecure = True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:    # output and errors in the order they happen, also through a pipe
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    p = argparse.ArgumentParser(prog="harmony", allow_abbrev=False,
                                description="Harmony: co-located parameter-server training")
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_master(sp):
        sp.add_argument("--master", default=None,
                        help="tcp://HOST:PORT (default $HARMONY_MASTER or tcp://127.0.0.1:5760)")
        sp.add_argument("--keys", default=None,
                        help="key set dir (default $HARMONY_KEYS, else the default local "
                             "cluster's); the client key is $HARMONY_KEY_NAME (default admin)")
        sp.add_argument("--insecure", action="store_true",
                        help="talk plain text to a master started with --insecure "
                             "(or HARMONY_INSECURE=1)")
        sp.add_argument("--state-dir", default=None, metavar="D",
                        help="the local cluster started with 'harmony cluster up --state-dir "
                             "D': its master and keys (what it recorded in D)")
        return sp

    s = submit_parser = with_master(sub.add_parser(
        "submit", allow_abbrev=False, add_help=False,
        help="submit an app file; app options follow it (after -- where one has the name "
             "of harmony's own, e.g. --keys)",
        usage="harmony submit APP_FILE [--machines N] [--wait] "
              "[--master URL] [--name NAME] [app options...] [-- app options...]"))
    s.add_argument("app", nargs="?", help="app file; 'harmony submit APP --help' lists its options")
    s.add_argument("--machines", type=int, default=1, help="machines (degree of parallelism)")
    s.add_argument("--wait", action="store_true",
                   help="follow progress until the job ends (a progress bar on a terminal)")
    s.add_argument("--json", action="store_true",
                   help="print the job id, and with --wait its progress, as JSON lines")
    s.add_argument("--name", default=None, help="a label for the job")
    s.add_argument("--group", default=None,
                   help="job group: jobs of one group share the same machines")
    s.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="checkpoint every N epochs, replicated on a second machine "
                        "(default 10; 0: only on pause)")
    s.add_argument("--checkpoint-seconds", type=float, default=None, metavar="S",
                   help="... or once S seconds passed since the last one (default 300; 0: off)")
    s.add_argument("--save-model", default=None, metavar="FILE",
                   help="follow the job (as --wait), then write its model to FILE (NPZ; "
                        ".txt: the app's text form), as 'harmony model get' does")
    submit_help = s.format_help()
    s = with_master(sub.add_parser("jobs", help="list jobs"))
    s.add_argument("--json", action="store_true")
    s = with_master(sub.add_parser("status", help="show one job"))
    s.add_argument("job")
    s.add_argument("--json", action="store_true")
    s.add_argument("--top-words", action="store_true",
                   help="LDA: the top words per topic of the job's latest checkpoint "
                        "(fetched from the workers and exported here)")
    s.add_argument("--events", action="store_true",
                   help="the job's story: every state change, move, pause, checkpoint "
                        "warning and scheduler note, with its time since submission")
    _trust_args(s)
    s = sub.add_parser("model", help="export a job's model")
    msub = s.add_subparsers(dest="action", required=True)
    g = with_master(msub.add_parser(
        "get", help="write a job's model as named arrays: a finished job's final "
                    "checkpoint, a running job's snapshot at its next epoch end"))
    g.add_argument("job")
    g.add_argument("--out", required=True, metavar="FILE",
                   help="output file: NPZ, or .txt for the app's text form (Lasso, LDA)")
    g.add_argument("--latest", action="store_true",
                   help="a running job: its latest checkpoint now, not a fresh snapshot")
    g.add_argument("--no-inputs", dest="inputs", action="store_false",
                   help="leave out state kept in input blocks (NMF's user factors), which "
                        "on a running job means fetching its whole input")
    g.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="wait at most S seconds for a running job's snapshot (default 3600)")
    _trust_args(g)
    s = with_master(sub.add_parser("cancel", help="cancel a job"))
    s.add_argument("job")
    s = with_master(sub.add_parser("pause", help="pause a job at its next epoch end "
                                                 "(checkpoints its model and input state)"))
    s.add_argument("job")
    s = with_master(sub.add_parser("resize", help="move a running job onto N machines while "
                                                  "it runs (its blocks move over the network)"))
    s.add_argument("job")
    s.add_argument("--machines", type=int, required=True)
    s.add_argument("--workers", type=int, default=None,
                   help="machines holding input (the first W; default: all)")
    s.add_argument("--servers", type=int, default=None,
                   help="machines holding the model (the last S; default: all)")
    s = with_master(sub.add_parser("resume", help="resume a paused job from its checkpoint"))
    s.add_argument("job")
    s.add_argument("--machines", type=int, default=None,
                   help="resume on this many machines (default: as before)")
    s = with_master(sub.add_parser("cluster", help="local cluster: up, down, status"))
    s.add_argument("action", choices=["up", "down", "status"])
    s.add_argument("--machines", type=int, default=2)
    s.add_argument("--port", type=int, default=None,
                   help="master port (0 = random; default $HARMONY_PORT or 5760, or a free "
                        "port if that one is taken)")
    s.add_argument("--dashboard-port", type=int, default=0,
                   help="port of the master's web dashboard and /metrics on 127.0.0.1 "
                        "(default 0: a free one; -1: no dashboard)")
    s.add_argument("--detach", action="store_true", help="return once the cluster is ready")
    s.add_argument("--mode", default="harmony", choices=["isolated", "naive", "harmony"],
                   help="execution mode of the master (see harmony-master start --help)")
    s.add_argument("--policy", default=None, choices=sorted(PR.POLICIES),
                   help="placement policy (default: the mode's)")
    _scheduler_args(s)
    s.add_argument("--cpus-per-machine", type=int, default=None,
                   help="emulate machines of C cores each (CPU affinity)")
    s.add_argument("--cpu-speed", default=None,
                   help="emulate slower machines: one factor or one per machine, e.g. "
                        "1,1,0.5 (a COMP on a 0.5 machine takes twice as long)")
    dil.add_argument(s)
    s.add_argument("--net-bandwidth", default=None,
                   help="emulate a NIC of this rate per machine, e.g. 50MB/s or 400Mbit; "
                        "a comma list gives each machine its own (12M,12M,4M)")
    s.add_argument("--memory-per-machine", type=parse_size, default=None,
                   help="emulate machines with this memory budget, e.g. 512M (enforced)")
    s.add_argument("--no-preempt", dest="preempt", action="store_false",
                   help="harmony mode: never stop a long COMP while a much shorter one runs")
    s.add_argument("--max-jobs-per-machine", type=int, default=0,
                   help="colocate policy: at most this many jobs share a machine (0: no limit)")
    s.add_argument("--isolate", action="store_true",
                   help="shared nothing, emulated: each worker in its own mount namespace, "
                        "unable to see the master's or other workers' state dirs (root)")
    s = with_master(sub.add_parser("logs", help="a job's executor logs, from every machine "
                                                "that ran it (over ZeroMQ)"))
    s.add_argument("job")
    s.add_argument("--machine", default=None, metavar="M",
                   help="only from these machines (comma-separated)")
    s.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new lines until the job ends")
    s.add_argument("--attempt", type=int, default=None, metavar="K",
                   help="the K-th log of the job on each machine, oldest first (0, 1, ...; "
                        "negative from the newest; default the newest); --list lists them")
    s.add_argument("--list", action="store_true", help="list the logs kept per machine")
    s.set_defaults(follow_forever=False)
    s = with_master(sub.add_parser("report", help="PNG plots of a run (utilization, JCT, "
                                                  "objectives, predicted vs measured "
                                                  "iteration time)"))
    s.add_argument("--out", default="harmony-report", metavar="DIR",
                   help="where to write them (default ./harmony-report)")
    s.add_argument("--metrics", default=None, metavar="DIR",
                   help="a master's STATE/metrics (default: the local cluster's, from "
                        "--state-dir or the default one)")
    s = with_master(sub.add_parser("dashboard", help="print the URL of the master's web "
                                                     "dashboard (with this key's token)"))
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("keys", help="CurveZMQ key sets")
    ks = s.add_subparsers(dest="action", required=True)
    k = ks.add_parser("init", help="make a key set: the cluster pair, a pair per worker, "
                                   "client (job control) and reader (read-only) pairs")
    k.add_argument("--dir", default=None,
                   help="where (default $HARMONY_KEYS, else ~/.harmony/keys)")
    k.add_argument("--workers", default="", help="worker names, comma-separated")
    k.add_argument("--clients", default="admin", help="client key names (job control)")
    k.add_argument("--readers", default="reader", help="read-only key names")
    s = sub.add_parser("demo", help="NMF on generated data on a local cluster")
    s.add_argument("--machines", type=int, default=2)
    s.add_argument("--users", type=int, default=20000)
    s.add_argument("--items", type=int, default=2000)
    s.add_argument("--per-user", type=int, default=40)
    s.add_argument("--epochs", type=int, default=10)
    dil.add_argument(s)
    s = sub.add_parser("data", help="stage input into the cluster; generate data sets")
    dsub = s.add_subparsers(dest="action", required=True)
    g = with_master(dsub.add_parser("put", help="stage a file on the workers (line-aligned "
                                                "chunks, two copies each); jobs read it as "
                                                "--input harmony://NAME"))
    g.add_argument("file")
    g.add_argument("--name", default=None, help="data set name (default: the file's name)")
    g = with_master(dsub.add_parser("ls", help="list staged data sets"))
    g.add_argument("--json", action="store_true")
    g = with_master(dsub.add_parser("rm", help="remove a staged data set"))
    g.add_argument("name")
    g = dsub.add_parser("gen", help="write a synthetic data set")
    gsub = g.add_subparsers(dest="kind", required=True)
    from harmony.datagen import generators
    for kind, mod in generators().items():
        n = gsub.add_parser(kind, help=mod.HELP)
        n.add_argument("--out", required=True, help="output path (.gz to compress)")
        n.add_argument("--seed", type=int, default=0)
        mod.add_arguments(n)

    from harmony.sim.cli import add_parser as add_sim_parser
    add_sim_parser(sub)
    s = sub.add_parser("completion", help="shell completion: eval \"$(harmony completion "
                                          "bash)\" (zsh: after bashcompinit)")
    s.add_argument("shell", choices=["bash", "zsh"])
    if argv and argv[0] == "completion":
        from harmony.completion import bash_script
        a = p.parse_args(argv)
        print(bash_script(p))
        return 0
    if argv and argv[0] == "sim":      # no master, no keys
        from harmony.sim.cli import cmd_sim
        return cmd_sim(p.parse_args(argv))
    if argv and argv[0] == "submit":
        a, rest = p.parse_known_args(argv)
        # what follows "--" is the app's, even where harmony has an option of
        # the same name (argparse leaves the "--" in front of it, or not)
        rest = rest[1:] if rest[:1] == ["--"] else rest
        a._taken = [t.split("=", 1)[0] for t in argv[1:argv.index("--")
                                                        if "--" in argv else len(argv)]
                    if t.startswith("--")]
        a._flags = {f for act in submit_parser._actions for f in act.option_strings}
    else:
        a, rest = p.parse_args(argv), []
    try:
        _target(a)
        if a.cmd == "submit":
            if a.app is None or a.app in ("-h", "--help"):
                print(submit_help)
                return 0 if a.app else 2
            return cmd_submit(a, rest)
        if rest:
            return _die(f"unrecognized arguments: {' '.join(rest)}", 2)
        return {"jobs": cmd_jobs, "status": cmd_status, "cancel": cmd_cancel, "keys": cmd_keys,
                "pause": cmd_pause, "resume": cmd_resume, "resize": cmd_resize,
                "cluster": cmd_cluster, "demo": cmd_demo, "data": cmd_data,
                "model": cmd_model, "dashboard": cmd_dashboard, "logs": cmd_logs,
                "report": cmd_report}[a.cmd](a)
    except ClientError as exc:
        return _die(str(exc), 3 if exc.code == "unreachable" else 1)
    except KeyboardInterrupt:
        job = getattr(a, "_following", None)
        if job:
            print(f"\n{job} continues on the cluster; 'harmony cancel {job}' stops it",
                  file=sys.stderr)
        return 130
    except ValueError as exc:
        return _die(str(exc), 2)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
