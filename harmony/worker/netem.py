"""Network emulation for local clusters: a per-machine bandwidth cap.

On one host, loopback makes the network practically free, and co-location
effects vanish. A local cluster therefore models every emulated machine's
NIC as two links, egress and ingress, of ``rate`` bytes/s each. Every PS
transfer between two *different* emulated machines reserves time on the
sender's egress and the receiver's ingress (virtual-time link model: a chunk
of n bytes occupies each link for n/rate seconds, from when that link is
free, and is through when both are done: the switch holds it between the
two, so neither link idles while a flow needs it). The transferring thread
then sleeps until its reservation ends. A pull or push to several peers is
several flows that run in parallel, as on a NIC
(:meth:`NetEm.transfer_many`). Traffic within one machine is free, as on
real hardware.

Why this and not network namespaces with ``tc``: it needs no root or
CAP_NET_ADMIN (CI may have neither), it is deterministic, and it can express
the NET queue's priorities. The *primary* network subtask of a machine
reserves as soon as the link is free. The *secondary* backs off while the
primary has used the link within the last chunk time, so it uses the time
the primary leaves idle and yields when they contend, except for one chunk
per ``SECONDARY_EVERY`` primary chunks, so that a small secondary transfer is
never starved behind a long primary one.

The state is one small memory-mapped file per cluster, shared by all
executor processes and daemons, and guarded by ``flock``. Per machine it
holds the busy-until times of both tracks of both links, byte counters for
utilization, and the token of the job that is the machine's current
primary.
"""
from __future__ import annotations

import fcntl
import heapq
import json
import mmap
import os
import struct
import time
import zlib
from collections.abc import Callable, Sequence

# per machine: eg_all, eg_pri, in_all, in_pri, eg_bytes, in_bytes, busy_s, primary,
# primary chunks since the secondary last sent
_F = struct.Struct("<7dqd")
SECONDARY_EVERY = 3   # under contention the secondary sends 1 chunk per 3 of the primary
# the grain at which concurrent transfers interleave on a link (64 KiB: 4 ms
# at 16 MB/s). 4 machines pulling 0.5 MB from each other at 16 MB/s took
# 0.16-0.18 s with 256 KiB chunks, one peer after another; 0.11-0.12 s with
# parallel flows of 64 KiB that book only what starts at once (ideal 0.094)
CHUNK = 64 * 1024


def job_token(job: str) -> int:
    return zlib.crc32(job.encode()) + 1  # never 0 (0 = no primary)


def parse_rate(text: str) -> float:
    """'50M', '50MB/s' (bytes/s) or '400Mbit', '1Gbps' (bits/s) -> bytes/s."""
    t = text.strip().lower().removesuffix("/s")
    bits = t.endswith(("bps", "bit"))
    if bits:
        t = t[:-3]
    elif t.endswith("b"):
        t = t[:-1]
    mult = 1.0
    if t and t[-1] in "kmgt":
        mult = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[t[-1]]
        t = t[:-1]
    try:
        val = float(t) * mult
    except ValueError:
        raise ValueError(f"not a bandwidth: {text!r} (e.g. 50MB/s, 400Mbit)") from None
    if val <= 0:
        raise ValueError(f"bandwidth must be positive: {text!r}")
    return val / 8 if bits else val


class NetEm:
    """Shared link state of all emulated machines of one local cluster."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self.path = path
        # the clock of every reservation (one clock for all processes of a
        # cluster: CLOCK_MONOTONIC); tests inject their own with its sleep
        self.clock, self.sleep = clock, sleep
        with open(path + ".json") as fh:
            meta = json.load(fh)
        self.names: list[str] = meta["machines"]
        rate = meta["rate"]
        # one rate for every machine, or one per machine (a heterogeneous
        # cluster); a transfer runs at the slower of its two ends
        self.rates = [float(r) for r in rate] if isinstance(rate, list) \
            else [float(rate)] * len(self.names)
        self.rate = min(self.rates)
        self.index = {n: i for i, n in enumerate(self.names)}
        self._fd = os.open(path, os.O_RDWR)
        self._mm = mmap.mmap(self._fd, _F.size * len(self.names))

    def rate_of(self, machine: str) -> float:
        """Bytes/s of ``machine``'s link."""
        return self.rates[self.index[machine]]

    @staticmethod
    def create(path: str, machines: list[str], rate: float | list[float]) -> "NetEm":
        if isinstance(rate, list) and len(rate) != len(machines):
            raise ValueError(f"{len(rate)} link rates for {len(machines)} machines")
        with open(path + ".json", "w") as fh:
            json.dump({"rate": rate, "machines": machines}, fh)
        with open(path, "wb") as fh:
            fh.write(b"\0" * (_F.size * len(machines)))
        return NetEm(path)

    def close(self) -> None:
        self._mm.close()
        os.close(self._fd)

    def _get(self, m: int) -> list:
        return list(_F.unpack_from(self._mm, m * _F.size))

    def _put(self, m: int, rec: list) -> None:
        _F.pack_into(self._mm, m * _F.size, *rec)

    def set_primary(self, machine: str, token: int) -> None:
        m = self.index[machine]
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            rec = self._get(m)
            rec[7] = token
            self._put(m, rec)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def counters(self, machine: str) -> tuple[float, float, float]:
        """(egress bytes, ingress bytes, link busy seconds) since creation."""
        rec = self._get(self.index[machine])
        return rec[4], rec[5], rec[6]

    def reserve(self, src: str, dst: str, nbytes: int, token: int = 0
                ) -> tuple[float, bool]:
        """Try to reserve ``nbytes`` from src to dst. Returns (time, True)
        with the end of the reserved transfer (the clock's time), or
        (time, False) when the caller must come back at that time: a
        secondary backs off while the primary is using the link. ``token``
        equal to src's or dst's current primary makes the chunk primary."""
        s, d = self.index[src], self.index[dst]
        rate = min(self.rates[s], self.rates[d])
        dur = nbytes / rate
        gap = CHUNK / rate
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            now = self.clock()
            a, b = self._get(s), self._get(d)
            primary = token != 0 and (a[7] == token or b[7] == token)
            if not primary:
                # the secondary fills the gaps the primary leaves; while the
                # primary keeps the link busy it backs off, except for one
                # chunk per SECONDARY_EVERY primary chunks (it is never starved)
                busy_until = max(a[1], b[3])
                if busy_until > now - gap and (a[7] or b[7]) \
                        and max(a[8], b[8]) < SECONDARY_EVERY:
                    return busy_until + gap, False
            # no two reservations of a link overlap, so the cap holds; a link
            # that sat idle may catch up one chunk (a token bucket of one chunk
            # of burst), so a thread's oversleep does not lower the rate.
            # Each link is booked from when it is free, not both from when
            # both are: the chunk waits in the switch for the later one. A
            # booking that waited for both left holes in the link free first,
            # which no other flow could fill (a link keeps one busy-until
            # time): an all-to-all exchange of 3-8 machines took 1.2-1.5x
            # its ideal time; now each link is busy while any flow needs it
            eg = max(now - gap, a[0]) + dur
            ing = max(now - gap, b[2]) + dur
            end = max(eg, ing)
            if not primary:
                a[8] = b[8] = 0.0
            a[0], b[2] = eg, ing
            if primary:
                a[1], b[3] = eg, ing
                a[8] += 1
                b[8] += 1
            a[4] += nbytes
            b[5] += nbytes
            a[6] += dur
            self._put(s, a)
            if d != s:
                self._put(d, b)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return end, True

    def transfer(self, src: str, dst: str, nbytes: int, token: int = 0) -> float:
        """Pay for one transfer in chunks (so that concurrent transfers
        interleave) and sleep until it is done. Returns seconds waited."""
        return self.transfer_many([[(src, dst, nbytes)]], token)

    def transfer_many(self, flows: Sequence[Sequence[tuple[str, str, int]]],
                      token: int = 0) -> float:
        """Pay for several flows at once, as a NIC carries them: in parallel,
        each flow's legs (src, dst, bytes) one after another (a request, then
        its reply). Each flow reserves its next chunk when its previous one
        ends, so flows to different peers overlap and share a link where
        they meet it, instead of queueing behind each other: a machine that
        pulls from m-1 peers waits for the busiest link, not for the sum.
        Returns seconds waited."""
        legs = [[leg for leg in f if leg[0] != leg[1] and leg[2] > 0] for f in flows]
        if not any(legs):
            return 0.0                      # traffic within a machine is free
        t0 = self.clock()
        left = [leg[0][2] if leg else 0 for leg in legs]
        due: list[tuple[float, int]] = [(t0, i) for i, f in enumerate(legs) if f]
        heapq.heapify(due)
        while due:
            at, i = heapq.heappop(due)
            delay = at - self.clock()
            if delay > 0:
                self.sleep(delay)
            if not left[i]:                 # this leg is paid for: the next
                legs[i].pop(0)
                if not legs[i]:
                    continue
                left[i] = legs[i][0][2]
            src, dst, _ = legs[i][0]
            n = min(CHUNK, left[i])
            end, ok = self.reserve(src, dst, n, token)
            if ok:
                left[i] -= n
            heapq.heappush(due, (end, i))
        return self.clock() - t0
