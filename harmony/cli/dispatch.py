"""``harmony``: the parser of every subcommand, the master a client command
talks to, and the dispatch to the command families' modules."""
from __future__ import annotations

import argparse
import os
import sys

from harmony.client import ClientError
from harmony.cluster import read_info
from harmony import dilation as dil
from harmony.policies import registry as PR
from harmony.cli.common import _die, _scheduler_args, parse_size
from harmony.cli.cluster import cmd_cluster, cmd_demo
from harmony.cli.data import cmd_data, cmd_keys
from harmony.cli.jobs import (cmd_cancel, cmd_jobs, cmd_model, cmd_pause, cmd_resize,
                              cmd_resume, cmd_status, cmd_submit)
from harmony.cli.observe import cmd_dashboard, cmd_logs, cmd_report


def _trust_args(p: argparse.ArgumentParser) -> None:
    """Whose app code an export may run here (harmony.export.vouch)."""
    p.add_argument("--app", default=None, metavar="FILE",
                   help="your copy of the job's app (must match the job's source): its "
                        "export runs here. A bundled app needs none")
    p.add_argument("--trust-app", action="store_true",
                   help="run the job's own app code in this process to export (whoever "
                        "submitted the job wrote it)")



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
    s.add_argument("--all", action="store_true",
                   help="also the jobs that ended longer ago than the master's --retention")
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
    s.add_argument("--json", action="store_true",
                   help="status: the master's reply as JSON (its counters included)")
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
    s.add_argument("--data-plane", choices=("sealed", "signed"), default="sealed",
                   help="the workers' PS and block traffic: sealed (AES-256-GCM, the "
                        "default) or signed (authenticated, in plain text)")
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
