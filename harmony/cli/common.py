"""What the command lines share: logging, sizes, errors, and the options of
the scheduler and of the security of a master or worker."""
from __future__ import annotations

import argparse
import logging
import re
import sys

from harmony.cruise.plan import MAX_MOVES
from harmony.subtasks.sync import SYNC_MODES


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
    s.add_argument("--sync", default="leader", choices=SYNC_MODES,
                   help="who synchronizes queued jobs' subtasks: a leader daemon of each "
                        "group (default: the master hears no per-subtask message) or the "
                        "master itself")
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
