"""``harmony data`` (stage, list and remove input; generate data sets) and
``harmony keys init`` (CurveZMQ key sets)."""
from __future__ import annotations

import argparse
import json
import os

from harmony.client import Client
from harmony.comm import security
from harmony.store import staging
from harmony.cli.common import _die


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
