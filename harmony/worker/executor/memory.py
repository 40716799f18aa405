"""Memory and the disk ratio α of an executor's input blocks.

The machine's memory budget and what the other executors here use
(:class:`MachineMemory`), the job's LMDB store and its input blocks, how
much input may be held while it is read, the initial α (fixed, or
estimated from the input's and the model's sizes against this job's part
of the budget) and α's hill-climbing step per epoch
(:class:`~harmony.store.alpha.AlphaController`), with the co-located
jobs' α state shared through the daemon.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np
import psutil
import zmq

from harmony.app import ModelSpec
from harmony.comm import messages as M
from harmony.store.alpha import AlphaController, Observation, Thresholds, initial_alpha
from harmony.store.lmdb_store import JobStorage
from harmony.store.local import LocalInput, SpillDisabledError
from harmony.util.malloc import MemoryWatch, own_memory
from harmony.store.memory import executors_memory
from harmony.worker.executor.links import Links

log = logging.getLogger("harmony.executor")


# Memory thresholds of the α controller, as fractions of the machine's budget.
# Higher than dask's defaults (0.6/0.7/0.8/0.95, the controller's own): what
# is measured here is each executor's *peak* anonymous memory (sampled every
# 20 ms) against a hard budget measured the same way, with no garbage
# collector between them, and an executor's fixed cost (the interpreter and
# its libraries, ~20 MiB) is a large share of small emulated budgets.
#: memory thresholds of the α controller, as fractions of the machine's budget
#: (the epoch's peak against a hard budget). 0.75/0.85/0.92 until session 11:
#: bench/store_alpha.py had adaptive α 14% behind the best fixed α, which ran
#: at about 0.83 of the budget; with 0.80/0.90/0.94 adaptive came within 2-6%
#: of it (ahead in one run), with no out-of-memory kill (README, Block store)
THRESHOLDS = Thresholds(target=0.80, spill=0.90, pause=0.94, terminate=0.97)


class MachineMemory:
    """This machine's memory budget (``harmony-worker --memory``) and what
    its executors use (anonymous RSS, psutil over the daemon's children).
    ``query``: asks the daemon for its latest sample (``mem_query`` ->
    ``mem_state``), None when it does not answer."""

    def __init__(self, spec: dict, query=None) -> None:
        self.budget = int(spec.get("memory") or psutil.virtual_memory().total)
        self.explicit = bool(spec.get("memory_set"))
        self.daemon_pid = spec.get("daemon_pid") or os.getppid()
        self.query = query if self.explicit and spec.get("daemon") else None
        self._others = (0, 0)
        self._at = self._loading_at = -1e9
        self._loading = 0

    def others(self, max_age: float = 1.0) -> tuple[int, int]:
        """(bytes, count) of the machine's other executors whose input is
        loaded: from the daemon's latest sample (``mem_state``) when fresh,
        else measured here (then executors
        still reading their input count too). Cached ``max_age`` seconds."""
        now = time.monotonic()
        if now - self._at > max_age:
            self._others = self._from_daemon() or executors_memory(self.daemon_pid,
                                                                   exclude=os.getpid())
            self._at = now
        return self._others

    def loading_others(self, max_age: float = 1.0) -> int:
        """Executors here that have not loaded their input yet (known only
        with the daemon's sample; 0 without it). Cached ``max_age`` seconds."""
        now = time.monotonic()
        if now - self._loading_at > max_age:
            self._loading_at = now
            loaded = self._from_daemon()
            self._loading = 0
            if loaded is not None:
                _, everyone = executors_memory(self.daemon_pid, exclude=os.getpid())
                self._loading = max(0, everyone - loaded[1])
        return self._loading

    def _from_daemon(self) -> tuple[int, int] | None:
        if self.query is None:
            return None
        st = self.query()
        if st is None or st.get("age") is None or st["age"] > 2.0:
            return None
        return st["others_bytes"], st["others_count"]

    def effective(self, used: int) -> int:
        """The budget, capped by what the machine really has left."""
        return max(1, min(self.budget, used + int(psutil.virtual_memory().available)))




class Memory(Links):
    """The job's block store on this machine and its disk ratio α."""

    def _open_input(self, mutable: tuple[str, ...] | None = None) -> LocalInput:
        """The job's LMDB store on this machine (``STATE/store/JOB``) and the
        owner of its input blocks."""
        s = self.spec
        root = os.path.join(s.get("state_dir") or os.path.join(os.getcwd(), "state"), "store")
        # an older attempt's executor may still be stopping: wait for its lock
        self.storage = JobStorage(root, self.job, max_map_size=s.get("store_max"),
                                  lock_wait_s=10.0)
        if self.mem.explicit:
            self.watch = MemoryWatch()
        self.input = LocalInput(self.storage.input, mutable=mutable)
        return self.input

    def _budget_note(self) -> str:
        return (f" (memory budget of machine {self.spec.get('worker', '?')}: "
                f"{self.mem.budget / 2**20:.0f} MiB{'' if self.mem.explicit else ', all of it'})")

    def _others_share(self) -> int:
        """Memory the other executors here take, for this job's estimates:
        what they use now, or, if more, their equal shares of the target
        memory (jobs starting together have not loaded their input yet), so
        that each job starts from its own equal share."""
        used, _ = self.mem.others(max_age=0)
        _, n = executors_memory(self.mem.daemon_pid, exclude=os.getpid())   # loaded or not
        return max(used, int(THRESHOLDS.target * self.mem.budget * n / (n + 1)))

    def _ingest_limits(self, opts) -> dict:
        """How much input this job may hold in memory while reading it."""
        B = self.mem.budget
        base = own_memory()[1]
        if not opts.spill:
            used, _ = self.mem.others(max_age=0)
            limit = B - used - base
        else:
            # adaptive α, or a fixed one placed after reading: either way the
            # blocks beyond this go to disk as they are read, so that reading
            # the input stays under the budget (the daemon's OOM killer counts
            # an executor from its start)
            limit = int(THRESHOLDS.target * B) - self._others_share() - base
        return {"memory_limit": None if limit is None else max(0, limit),
                "spill": opts.spill, "budget_note": self._budget_note()}

    def _place_input(self, inp: LocalInput, opts, spec: ModelSpec,
                     fixed: float | None) -> None:
        """The initial α: fixed, or estimated from the input's measured size
        and the model's size against this job's part of the budget."""
        item = np.dtype(spec.dtype).itemsize
        model = spec.num_keys * spec.dim * item
        # the shard, the pulled rows, and the app's working copy of them
        self.shard_bytes = -(-spec.num_keys // self.count) * spec.dim * item
        self.model_bytes = self.shard_bytes + 2 * model
        self.reserve = max(0, own_memory()[1] - inp.memory_bytes())
        nblocks = len(inp)
        # disk-blocks in flight during a pass: loading ahead, in use, dropping
        pipeline = (inp.depth + 1) * inp.mean_block_bytes()
        B = self.mem.budget
        if fixed is not None:
            alpha, self.note = fixed, "fixed (--disk-ratio)"
        elif not opts.spill or nblocks == 0:
            alpha, self.note = 0.0, "spilling disabled" if not opts.spill else "no blocks"
            used, _ = self.mem.others(max_age=0)
            need = used + self.reserve + inp.total_bytes() + self.model_bytes
            if not opts.spill and need > B:
                raise SpillDisabledError(
                    f"out of memory: input {inp.total_bytes() / 2**20:.1f} MiB + model "
                    f"{self.model_bytes / 2**20:.1f} MiB + this executor "
                    f"{self.reserve / 2**20:.1f} MiB + other jobs {used / 2**20:.1f} MiB "
                    f"exceed{self._budget_note()}; spilling is disabled (--no-spill)")
        else:
            others = self._others_share()
            alpha = initial_alpha(inp.total_bytes(), self.model_bytes, B, others,
                                  reserve_bytes=self.reserve, num_blocks=nblocks,
                                  thresholds=THRESHOLDS)
            if alpha > 0:   # with disk-blocks, the pipeline's blocks need room too
                alpha = initial_alpha(inp.total_bytes(), self.model_bytes, B, others,
                                      reserve_bytes=self.reserve + int(pipeline),
                                      num_blocks=nblocks, thresholds=THRESHOLDS)
            th = THRESHOLDS
            self.spill_model = (alpha >= 1.0 and others + self.model_bytes + self.reserve
                                > th.spill * B)
            self.alpha_ctl = AlphaController(nblocks, alpha, block_bytes=inp.mean_block_bytes(),
                                             model_bytes=self.model_bytes, thresholds=th,
                                             spill_model=self.spill_model)
            self.note = "initial estimate"
        inp.set_alpha(alpha)
        log.info("input: %d blocks, %.1f MiB; model %.1f MiB; alpha %.2f (%s); budget %.0f MiB",
                 nblocks, inp.total_bytes() / 2**20, self.model_bytes / 2**20, inp.alpha,
                 self.note, B / 2**20)

    def _adapt(self, inp: LocalInput, tot, mem_peak: int, blocks_per_pass: float) -> dict:
        """One hill-climbing step per epoch; returns the epoch's store stats.
        The machine's pressure is (this executor's peak + the others' use) /
        budget. The budget is shared in proportion to use: when memory is
        short, each executor closes its own part of the gap (its use / the
        machine's use), and when it is plentiful each releases only its part
        of the room; a job whose reloads stall may take all the room there
        is, and jobs whose reloads hide take more disk-blocks to make room
        for a job that stalls and finds none (``others_starved``)."""
        others, _ = self.mem.others()
        machine = mem_peak + others
        eff = self.mem.effective(machine)
        stats = {"alpha": inp.alpha, "mem_blocks": len(inp.memory), "disk_blocks":
                 len(inp.on_disk), "stall_s": round(tot.stall_s, 6),
                 "reload_mb": round(tot.bytes_loaded / 2**20, 3),
                 "rss_mb": round(own_memory()[0] / 2**20, 2),
                 "anon_mb": round(mem_peak / 2**20, 2),
                 "machine_mb": round(machine / 2**20, 2),
                 "budget_mb": round(self.mem.budget / 2**20, 2),
                 "input_mb": round(inp.total_bytes() / 2**20, 2),
                 "shard_mb": round(self.shard_bytes / 2**20, 3),
                 "pinned_mb": round(inp.residue_bytes() / 2**20, 3),
                 "model_spilled": bool(self.spill_model)}
        waiting = (machine < THRESHOLDS.spill * eff and self.mem.loading_others() > 0)
        if self.alpha_ctl is not None and len(inp) and waiting:
            # co-located jobs are still reading their input: the memory looks
            # more plentiful than it will be, so only pressure may move α now
            self.note = "co-located jobs still loading their input"
        elif self.alpha_ctl is not None and len(inp):
            free = inp.spillable_block_bytes()
            starved, need = self._others_starved()
            d = self.alpha_ctl.step(Observation(
                mem_used=machine, mem_budget=eff, share=mem_peak / machine if machine else 1.0,
                stall_s=tot.stall_s,
                comp_s=tot.comp_s if tot.proc_s else None, tbproc=tot.tbproc,
                tbload=tot.tbload, blocks_total=max(1, int(round(blocks_per_pass))),
                block_bytes=free or None, others_starved=starved, others_need=need))
            self._publish(inp.alpha if d.disk_blocks == len(inp.on_disk) else
                          d.disk_blocks / len(inp), self.alpha_ctl.starved,
                          self.alpha_ctl.need)
            self.note = d.reason
            self.spill_model = d.spill_model
            if d.pause_job and not self.pause_wanted:
                log.warning("memory critical with everything spilled: this job should be "
                            "paused here (%s)", d.reason)
            self.pause_wanted = d.pause_job
            if d.disk_blocks != len(inp.on_disk):
                inp.set_disk_count(d.disk_blocks)
        stats.update({"next_alpha": inp.alpha, "pause_wanted": self.pause_wanted,
                      "reason": self.note})
        return stats

    # Co-located jobs see each other's α state through their daemon
    # (``alpha_state`` in, ``mem_state.others_starved`` out): a job whose
    # reloads stall and that finds no memory to keep more blocks is
    # "starved", and jobs whose reloads hide behind their compute then take
    # more disk-blocks.

    def _publish(self, alpha: float, starved: bool, need: float = 0.0,
                 every: float = 1.0) -> None:
        """Tell the daemon this job's α state: at once when it changed, else
        at most every ``every`` seconds (the daemon counts a starved state
        for ``STARVED_FRESH_S``, 10 s). A message per epoch cost a short
        epoch a wake-up of ZeroMQ's I/O thread for nothing new."""
        if not self.spec.get("daemon"):
            return
        state = (float(alpha), bool(starved), float(need))
        now = time.monotonic()
        at, last = self._published
        if state == last and now - at < every:
            return
        try:
            self.dsock.send(M.encode("alpha_state", job=self.job, attempt=self.attempt,
                                     alpha=state[0], starved=state[1], need=state[2]),
                            zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("cannot publish alpha state: %s", exc)
            return
        self._published = (now, state)

    def _others_starved(self, max_age: float = 1.0) -> tuple[bool, float]:
        """Whether a co-located job is starved, and the bytes they asked for:
        the daemon's answer, asked at most every ``max_age`` seconds. Its
        round trip was the largest part of an epoch's boundary on short
        epochs (about 1 ms of a 16 ms Lasso epoch, every epoch); a job's
        starved state counts for ``STARVED_FRESH_S`` (10 s) at the daemon,
        so an answer up to a second old tells the same."""
        now = time.monotonic()
        at, cached = self._starved
        if now - at <= max_age:
            return cached
        st = self._daemon_memory()
        out = (False, 0.0) if st is None or not st["others_starved"] else \
            (True, float(st.get("others_need") or 0.0))
        self._starved = (now, out)
        return out
