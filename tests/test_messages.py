import msgpack
import pytest

from harmony.comm import messages as M


def test_roundtrip_with_frames():
    head = M.encode("barrier", job="job-0001", index=1, epoch=2, iter=0)
    msg = M.decode([head, b"\x00" * 8])
    assert msg.type == "barrier" and msg["epoch"] == 2 and msg.frames == [b"\x00" * 8]


def test_optional_field_may_be_omitted():
    msg = M.decode([M.encode("submit", app_name="a.py", app_source="", args=[], machines=1)])
    assert msg.get("name") is None


@pytest.mark.parametrize("frames, text", [
    ([], "empty"),
    ([b"\xc1garbage"], "undecodable"),
    ([msgpack.packb([1, 2])], "not a map"),
    ([msgpack.packb({"t": "no_such"})], "unknown message type"),
    ([msgpack.packb({"t": "cancel"})], "missing field 'job'"),
    ([msgpack.packb({"t": "cancel", "job": 7})], "must be str"),
    ([msgpack.packb({"t": "submit", "app_name": "a", "app_source": "", "args": [],
                     "machines": True})], "must be int, got bool"),
    ([msgpack.packb({"t": "cancel", "job": "j", "evil": 1})], "unknown field"),
    ([b"x"] * (M.MAX_FRAMES + 1), "too many frames"),
])
def test_malformed_messages_are_rejected_clearly(frames, text):
    with pytest.raises(M.ProtocolError, match=text):
        M.decode(frames)


def test_oversized_header_rejected():
    big = msgpack.packb({"t": "cancel", "job": "x" * (M.MAX_HEADER_BYTES + 1)})
    with pytest.raises(M.ProtocolError, match="too large"):
        M.decode([big])


def test_sender_side_validation():
    with pytest.raises(M.ProtocolError):
        M.encode("cancel")
