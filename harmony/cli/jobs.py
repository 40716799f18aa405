"""A job's commands: ``harmony submit``, ``jobs``, ``status``, ``model get``,
``cancel``, ``pause``, ``resize`` and ``resume``."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harmony.app import AppError, load_app, option_parser, parse_app_args
from harmony.client import Client, ClientError
from harmony.obs import progress
from harmony.cli.common import _die


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
        reply = c.jobs_reply(all=getattr(a, "all", False))
    jobs = reply["jobs"]
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
    if reply.get("hidden"):
        print(f"({reply['hidden']} job(s) that ended over {_dur(reply.get('retention') or 0)} "
              f"ago not shown: harmony jobs --all)")
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
