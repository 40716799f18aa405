"""Prometheus metrics of a master, from its snapshots (``/metrics``).

Built with ``prometheus_client`` (a custom collector over the latest
snapshot, :mod:`harmony.obs.snapshot`): the exposition format is the
library's, never hand-written. Counters that the master does not count
itself (checkpoints written) are counted here, from one snapshot to the
next.
"""
from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("waiting", "profiling", "profiled", "running", "paused", "finished", "failed",
          "cancelled")
PHASES = ("pull", "comp", "push", "sync", "stood")


class SnapshotCollector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.snap: dict[str, Any] | None = None
        self.checkpoints: dict[str, int] = {}       # job -> checkpoints seen
        self._ck_seen: dict[str, Any] = {}          # job -> (epoch, time) of its last

    def observe(self, snap: dict[str, Any]) -> None:
        with self._lock:
            for j in snap.get("jobs", []):
                ck = j.get("checkpoint")
                if not ck:
                    continue
                key = (ck.get("epoch"), ck.get("time"))
                if self._ck_seen.get(j["id"]) != key:
                    self._ck_seen[j["id"]] = key
                    self.checkpoints[j["id"]] = self.checkpoints.get(j["id"], 0) + 1
            self.snap = snap

    def collect(self):
        with self._lock:
            snap, ckpts = self.snap, dict(self.checkpoints)
        if snap is None:
            return
        jobs = snap.get("jobs", [])
        by_state = GaugeMetricFamily("harmony_jobs", "Jobs by state", labels=["state"])
        counts = {s: 0 for s in STATES}
        if "job_counts" in snap:        # every job, also those past the retention
            counts.update(snap["job_counts"])
        else:
            for j in jobs:
                counts[j["state"]] = counts.get(j["state"], 0) + 1
        for s, n in counts.items():
            by_state.add_metric([s], n)
        yield by_state

        # the job's label is job_id: Prometheus keeps `job` for its own
        # scrape target and would rename ours to exported_job
        jl = ["job_id", "app"]
        epochs = CounterMetricFamily("harmony_job_epochs", "Epochs done (this attempt)",
                                     labels=jl)
        maxe = GaugeMetricFamily("harmony_job_max_epochs", "The job's --max-epochs",
                                 labels=jl)
        obj = GaugeMetricFamily("harmony_job_objective", "Latest objective", labels=jl)
        data = CounterMetricFamily("harmony_job_data_bytes",
                                   "Bytes pulled and pushed (PS data, all epochs; per "
                                   "epoch the largest of the job's machines)", labels=jl)
        pulled = CounterMetricFamily("harmony_job_bytes_pulled",
                                     "PS data bytes pulled (keys out, rows in), all the job's "
                                     "machines, epochs done (this attempt)", labels=jl)
        pushed = CounterMetricFamily("harmony_job_bytes_pushed",
                                     "PS data bytes pushed (keys and deltas), all the job's "
                                     "machines, epochs done (this attempt)", labels=jl)
        phase = GaugeMetricFamily("harmony_job_phase_seconds",
                                  "Seconds per phase in the latest epoch (slowest machine)",
                                  labels=jl + ["phase"])
        it = GaugeMetricFamily("harmony_job_iteration_seconds",
                               "Measured iteration time (moving average)", labels=jl)
        tcpu = GaugeMetricFamily("harmony_job_cpu_seconds_per_iteration",
                                 "COMP time per iteration (moving average)", labels=jl)
        tnet = GaugeMetricFamily("harmony_job_net_seconds_per_iteration",
                                 "PULL+PUSH time per iteration (moving average)", labels=jl)
        pred = GaugeMetricFamily("harmony_job_predicted_iteration_seconds",
                                 "The scheduler's predicted iteration time of its group",
                                 labels=jl)
        migr = CounterMetricFamily("harmony_job_migrations",
                                   "Live moves/resizes completed", labels=jl)
        ck = CounterMetricFamily("harmony_job_checkpoints",
                                 "Checkpoints completed (seen by this master)", labels=jl)
        ckep = GaugeMetricFamily("harmony_job_checkpoint_epoch",
                                 "Epoch of the last complete checkpoint", labels=jl)
        eta = GaugeMetricFamily("harmony_job_eta_seconds", "Estimated seconds left",
                                labels=jl)
        sl = ["job_id", "machine"]
        alpha = GaugeMetricFamily("harmony_store_alpha_ratio",
                                  "Fraction of input blocks on disk (alpha)", labels=sl)
        disk = GaugeMetricFamily("harmony_store_disk_blocks", "Input blocks spilled to disk",
                                 labels=sl)
        mem = GaugeMetricFamily("harmony_store_memory_blocks", "Input blocks in memory",
                                labels=sl)
        rel = CounterMetricFamily("harmony_store_reload_bytes",
                                  "Bytes reloaded from the spill store", labels=sl)
        stall = CounterMetricFamily("harmony_store_reload_stall_seconds",
                                    "Seconds computation waited for reloads", labels=sl)
        mspill = GaugeMetricFamily("harmony_store_model_spilled",
                                   "1 if the model shard is spilled", labels=sl)
        for j in jobs:
            lv = [j["id"], j["app"]]
            epochs.add_metric(lv, j["epoch"])
            maxe.add_metric(lv, j["max_epochs"])
            if j.get("objective") is not None:
                obj.add_metric(lv, j["objective"])
            data.add_metric(lv, j.get("data_bytes") or 0.0)
            pulled.add_metric(lv, j.get("bytes_pulled") or 0.0)
            pushed.add_metric(lv, j.get("bytes_pushed") or 0.0)
            for p in PHASES:
                v = (j.get("last_timings") or {}).get(p)
                if v is not None:
                    phase.add_metric(lv + [p], v)
            for fam, key in ((it, "t_iter"), (tcpu, "t_cpu"), (tnet, "t_net"),
                             (pred, "predicted_iter"), (eta, "eta")):
                if j.get(key) is not None:
                    fam.add_metric(lv, j[key])
            migr.add_metric(lv, j.get("migrations", 0))
            ck.add_metric(lv, ckpts.get(j["id"], 0))
            if j.get("checkpoint") and j["checkpoint"].get("epoch") is not None:
                ckep.add_metric(lv, j["checkpoint"]["epoch"])
            for m, st in (j.get("store") or {}).items():
                sv = [j["id"], m]
                for fam, key, mult in ((alpha, "alpha", 1), (disk, "disk_blocks", 1),
                                       (mem, "mem_blocks", 1), (rel, "reload_mb", 2**20),
                                       (stall, "stall_s", 1)):
                    v = st.get(key)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        fam.add_metric(sv, float(v) * mult)
                mspill.add_metric(sv, 1.0 if st.get("model_spilled") else 0.0)
        yield from (epochs, maxe, obj, data, pulled, pushed, phase, it, tcpu, tnet, pred, eta,
                    migr, ck, ckep, alpha, disk, mem, rel, stall, mspill)

        ml = ["machine"]
        up = GaugeMetricFamily("harmony_machine_up", "1 if the worker sends heartbeats",
                               labels=ml)
        cpus = GaugeMetricFamily("harmony_machine_cpus", "Cores offered", labels=ml)
        util = GaugeMetricFamily("harmony_machine_utilization_ratio",
                                 "Utilization over the last heartbeat (0..1)",
                                 labels=ml + ["resource"])
        qbusy = GaugeMetricFamily("harmony_queue_busy_ratio",
                                  "Busy fraction of a subtask queue over the last heartbeat",
                                  labels=ml + ["resource"])
        mjobs = GaugeMetricFamily("harmony_machine_jobs", "Jobs running on the machine",
                                  labels=ml)
        rl = ml + ["resource"]
        qwait = CounterMetricFamily("harmony_queue_wait_seconds",
                                    "Seconds subtasks waited in a queue (enqueued to granted; "
                                    "a grant held for an executor not ready: to its delivery)",
                                    labels=rl)
        qgrant = CounterMetricFamily("harmony_subtasks_granted",
                                     "Subtasks granted (the waits counted)", labels=rl)
        qrun = CounterMetricFamily("harmony_queue_run_seconds",
                                   "Seconds subtasks ran (granted, or its held grant "
                                   "delivered, to done; less the time a preempted COMP stood)",
                                   labels=rl)
        qdone = CounterMetricFamily("harmony_subtasks",
                                    "Subtasks done (the runs counted)", labels=rl)
        dfree = GaugeMetricFamily("harmony_machine_disk_free_bytes",
                                  "Free bytes on the disk of the worker's state dir (spilled "
                                  "blocks, checkpoint parts, staged data)", labels=ml)
        dtotal = GaugeMetricFamily("harmony_machine_disk_total_bytes",
                                   "Size of the disk of the worker's state dir", labels=ml)
        for m in snap.get("machines", []):
            up.add_metric([m["name"]], 1.0 if m["alive"] else 0.0)
            cpus.add_metric([m["name"]], m["cpus"])
            mjobs.add_metric([m["name"]], len(m["jobs"]))
            last = m["timeline"][-1] if m["timeline"] else {}
            for r in ("cpu", "net", "mem"):
                if last.get(r) is not None:
                    util.add_metric([m["name"], r], last[r])
            for r in ("cpu", "net"):
                if last.get(f"q_{r}") is not None:
                    qbusy.add_metric([m["name"], r], last[f"q_{r}"])
            for r, q in (m.get("queues") or {}).items():
                for fam, key in ((qwait, "wait"), (qgrant, "granted"), (qrun, "run"),
                                 (qdone, "done")):
                    fam.add_metric([m["name"], r], q[key])
            disk = m.get("disk") or {}
            if disk:
                dfree.add_metric([m["name"]], disk["free"])
                dtotal.add_metric([m["name"]], disk["total"])
        yield from (up, cpus, util, qbusy, mjobs, qwait, qgrant, qrun, qdone, dfree, dtotal)

        gl = ["group"]
        gp = GaugeMetricFamily("harmony_group_predicted_iteration_seconds",
                               "Predicted iteration time of a scheduler group", labels=gl)
        gm = GaugeMetricFamily("harmony_group_measured_iteration_seconds",
                               "Measured iteration time (mean of its jobs)", labels=gl)
        ge = GaugeMetricFamily("harmony_group_prediction_error_ratio",
                               "|predicted - measured| / measured", labels=gl)
        for g in snap.get("groups", []):
            for fam, key in ((gp, "predicted"), (gm, "measured"), (ge, "error")):
                if g.get(key) is not None:
                    fam.add_metric([g["group"]], g[key])
        yield from (gp, gm, ge)
        dec = CounterMetricFamily("harmony_scheduler_decisions",
                                  "Scheduler decisions recorded (this master's log)")
        dec.add_metric([], snap.get("decisions_total", 0))
        yield dec


def make_registry(collector: SnapshotCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
