"""Pure checks of what a receiver of blocks may hold (no sockets): the
payload header is decoded within caps, every byte held counts against the
budget (frames kept without a copy and whole payloads waiting for their
transfer's end too), and what a sender leaves half-sent is freed after the
idle timeout (injected clock). And the one check of names that become paths."""
from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest

from harmony.comm import messages as M
from harmony.store.blocks import Block
from harmony.store.transfer import (HEAD_BYTES, MAX_ARRAYS, Assembler, Payload, TransferError,
                                    chunk_digest, chunk_messages)
from harmony.util import names

MiB = 1 << 20


def _msgs(mid: str, payload: Payload, chunk: int = MiB) -> list[M.Message]:
    return [M.decode([h, bytes(d)]) for h, d in chunk_messages(mid, payload, chunk)]


def _raw_chunk(mid: str, bid: int, data: bytes, head: bytes | None = None, narr: int = 1,
               size: int | None = None) -> M.Message:
    return M.decode([M.encode("blk", mid=mid, sec="data", bid=bid, arr=0, narr=narr, off=0,
                              size=len(data) if size is None else size, h=chunk_digest(data),
                              head=msgpack.packb({"raw": True}) if head is None else head),
                     data])


def test_an_oversized_or_hostile_header_is_refused_before_it_is_decoded():
    asm = Assembler(max_bytes=64 * MiB)
    with pytest.raises(TransferError, match="header"):
        asm.add(_raw_chunk("m", 0, b"x", head=b"\x90" * (HEAD_BYTES + 1)))
    # within the size but describing more arrays than the cap, or shapes
    # that do not add up to the bytes that come
    many = msgpack.packb({"id": 0, "arrays": [[f"a{i}", "<u1", [1]]
                                              for i in range(MAX_ARRAYS + 1)]})
    with pytest.raises(TransferError):
        asm.add(_raw_chunk("m", 1, b"x", head=many, narr=MAX_ARRAYS + 1))
    lying = msgpack.packb({"id": 2, "arrays": [["a", "<f8", [4]]]})
    with pytest.raises(TransferError, match="size"):
        asm.add(_raw_chunk("m", 2, b"12345678", head=lying))
    objects = msgpack.packb({"id": 3, "arrays": [["a", "|O", [1]]]})
    with pytest.raises(TransferError):
        asm.add(_raw_chunk("m", 3, b"12345678", head=objects))
    assert asm.held == 0 and not asm.partial


def test_frames_kept_without_a_copy_count_against_the_budget():
    """A block of many 1 MiB arrays each arriving whole (kept as frames):
    refused once the budget is reached, and what it held is released."""
    asm = Assembler(max_bytes=4 * MiB)
    arrays = {f"a{i}": np.zeros(MiB, np.uint8) for i in range(8)}
    msgs = _msgs("m", Payload("input", 0, block=Block(0, arrays)))
    with pytest.raises(TransferError, match="receive limit"):
        for m in msgs:
            asm.add(m)
    assert asm.held == 0 and not asm.partial


def test_whole_payloads_waiting_for_their_end_are_counted_and_expire():
    asm = Assembler(max_bytes=10 * MiB, keep=True, idle_s=60)
    data = os.urandom(3 * MiB)
    for bid in range(3):
        for m in _msgs("rep:a", Payload("model", bid, data)):
            asm.add(m, now=100.0)
    assert asm.held == 9 * MiB
    with pytest.raises(TransferError, match="receive limit"):
        for m in _msgs("rep:b", Payload("model", 0, data)):
            asm.add(m, now=120.0)
    assert asm.expire(now=159.0) == []           # rep:a idle 59 s: kept
    assert asm.expire(now=161.0) == ["rep:a"]    # 61 s: dropped with what it held
    assert asm.held == 0 and not asm.done and not asm.partial
    # a live transfer is handed out whole, and then costs nothing
    for m in _msgs("rep:c", Payload("model", 7, data)):
        asm.add(m, now=200.0)
    got = asm.take("rep:c")
    assert list(got) == [("model", 7)] and got[("model", 7)] == data and asm.held == 0
    # the same payload twice in one transfer is refused
    for m in _msgs("rep:d", Payload("model", 1, b"ab")):
        asm.add(m, now=300.0)
    with pytest.raises(TransferError, match="twice"):
        asm.add(_msgs("rep:d", Payload("model", 1, b"ab"))[0], now=300.0)


def test_a_half_sent_block_is_freed_after_the_idle_timeout():
    asm = Assembler(max_bytes=64 * MiB, idle_s=30)
    msgs = _msgs("mv:j:1", Payload("input", 0, block=Block(0, {"a": np.zeros(4 * MiB,
                                                                             np.uint8)})))
    assert len(msgs) == 4
    for m in msgs[:2]:
        assert asm.add(m, now=0.0) is None
    assert asm.held == 4 * MiB
    assert asm.expire(now=31.0) == ["mv:j:1"] and asm.held == 0 and not asm.partial
    # a complete one leaves nothing behind to expire
    for m in msgs:
        out = asm.add(m, now=40.0)
    assert out is not None and asm.held == 0 and asm.expire(now=1e9) == []


@pytest.mark.parametrize("bad", ["..", ".", "../x", "a/b", "/etc", "", ".hidden", "-x",
                                 "x" * 129, "a\x00b", None, 3])
def test_names_that_would_leave_their_directory_are_refused(tmp_path, bad):
    with pytest.raises(names.BadName):
        names.check(bad, "job id")
    with pytest.raises(names.BadName):
        names.under(str(tmp_path), bad if isinstance(bad, str) else "ok", "ok/../..")


def test_a_link_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    os.symlink(tmp_path, root / "job-1")
    with pytest.raises(names.BadName, match="outside"):
        names.under(str(root), "job-1", "x")
    assert names.under(str(root), "job-2", "e1-p0") == str(root / "job-2" / "e1-p0")
