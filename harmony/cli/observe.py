"""Watching a cluster from the command line: ``harmony dashboard``, ``logs``
and ``report``."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from harmony.client import Client, ClientError
from harmony.cluster import default_state_dir, read_info
from harmony.cli.common import _die


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
