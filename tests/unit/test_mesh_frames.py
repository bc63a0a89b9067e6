"""The mesh codec (actors/mesh/frames.py): behaviour.md §3.2–§3.4, §14 invariants 1–4, 6–7."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct

import pytest

from actors.mesh.frames import (
    HEARTBEAT,
    HELLO,
    MAX_FRAME_LENGTH,
    MESSAGE_AVAILABLE,
    FrameError,
    decode_payload,
    encode,
    make_hello,
    read_frame,
    verify_hello,
)


def reader_with(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


# --- encoding (invariant 1) -------------------------------------------------


def test_type_codes():
    from actors.mesh import frames

    assert (frames.MESSAGE_AVAILABLE, frames.MESSAGE_AVAILABLE_BATCH, frames.HEARTBEAT,
            frames.HELLO, frames.HOTLIST_DIRTY_BATCH) == (1, 2, 3, 4, 5)
    assert (frames.QUEUE_CONFIG_SET, frames.QUEUE_CONFIG_DELETE) == (10, 11)
    assert (frames.MAINTENANCE_MODE_SET, frames.POP_MAINTENANCE_MODE_SET) == (40, 41)


def test_encoded_layout():
    payload = {"queue": "q", "partition": "p"}
    frame = encode(MESSAGE_AVAILABLE, payload)
    body = json.dumps(payload, separators=(",", ":")).encode()
    assert frame[:4] == struct.pack(">I", 1 + len(body))
    assert frame[4] == MESSAGE_AVAILABLE
    assert frame[5:] == body
    assert json.loads(frame[5:]) == payload


def test_empty_heartbeat_has_length_one():
    assert encode(HEARTBEAT) == b"\x00\x00\x00\x01\x03"
    assert encode(HEARTBEAT, None) == b"\x00\x00\x00\x01\x03"


def test_encode_rejects_bad_type_and_oversize():
    with pytest.raises(ValueError):
        encode(256, {})
    with pytest.raises(ValueError):
        encode(MESSAGE_AVAILABLE, {"x": "a" * MAX_FRAME_LENGTH})


async def test_round_trip():
    frames = encode(MESSAGE_AVAILABLE, {"queue": "é"}) + encode(HEARTBEAT)
    reader = reader_with(frames)
    frame_type, raw = await read_frame(reader)
    assert (frame_type, decode_payload(raw)) == (MESSAGE_AVAILABLE, {"queue": "é"})
    assert await read_frame(reader) == (HEARTBEAT, b"")
    with pytest.raises(FrameError) as exc:
        await read_frame(reader)
    assert exc.value.clean_eof


# --- reading (invariants 2–4) -----------------------------------------------


async def test_huge_length_rejected_before_reading_the_body():
    # No body and no EOF follow: a reader that tried to read (or allocate) the
    # announced 4 GiB would hang here instead of failing at once.
    reader = reader_with(b"\xff\xff\xff\xff", eof=False)
    with pytest.raises(FrameError, match="exceeds"):
        await asyncio.wait_for(read_frame(reader), 1)


async def test_length_just_above_limit_rejected():
    reader = reader_with(struct.pack(">I", MAX_FRAME_LENGTH + 1), eof=False)
    with pytest.raises(FrameError):
        await asyncio.wait_for(read_frame(reader), 1)


async def test_custom_limit():
    reader = reader_with(encode(HELLO, {"server_id": "x" * 100}), eof=False)
    with pytest.raises(FrameError):
        await asyncio.wait_for(read_frame(reader, max_length=50), 1)


async def test_zero_length_rejected():
    with pytest.raises(FrameError, match="zero"):
        await asyncio.wait_for(read_frame(reader_with(b"\x00\x00\x00\x00", eof=False)), 1)


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00"])
async def test_truncated_prefix(data):
    with pytest.raises(FrameError) as exc:
        await read_frame(reader_with(data))
    assert not exc.value.clean_eof


async def test_truncated_payload():
    frame = encode(MESSAGE_AVAILABLE, {"queue": "q"})
    with pytest.raises(FrameError, match="truncated"):
        await read_frame(reader_with(frame[:-1]))
    with pytest.raises(FrameError, match="truncated"):
        await read_frame(reader_with(frame[:4]))


async def test_empty_stream_is_clean_eof():
    with pytest.raises(FrameError) as exc:
        await read_frame(reader_with(b""))
    assert exc.value.clean_eof


# --- payloads ---------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"not json", b"[1,2]", b'"str"', b"42", b"null", b"\xff\xfe{}"]
)
def test_decode_payload_rejects(raw):
    assert decode_payload(raw) is None


def test_decode_payload_object():
    assert decode_payload(b'{"enabled":true}') == {"enabled": True}


# --- HELLO (invariants 6–7) ---------------------------------------------------


def test_make_hello_with_secret():
    hello = make_hello("queen-a", "s3cret")
    assert hello["server_id"] == "queen-a"
    assert len(hello["nonce"]) == 32
    int(hello["nonce"], 16)
    expected = hmac.new(b"s3cret", hello["nonce"].encode(), hashlib.sha256).hexdigest()
    assert hello["mac"] == expected
    assert make_hello("queen-a", "s3cret")["nonce"] != hello["nonce"]


def test_make_hello_open_mode_has_empty_mac():
    hello = make_hello("queen-a", "")
    assert hello["mac"] == ""
    assert len(hello["nonce"]) == 32


def test_verify_hello_with_secret():
    hello = make_hello("queen-a", "s3cret")
    assert verify_hello(hello, "s3cret") == "queen-a"
    assert verify_hello(hello, "other") is None
    assert verify_hello({**hello, "mac": hello["mac"].upper()}, "s3cret") == "queen-a"
    assert verify_hello({**hello, "mac": "zz" + hello["mac"][2:]}, "s3cret") is None  # bad hex
    assert verify_hello({**hello, "mac": hello["mac"][:-1]}, "s3cret") is None  # odd length
    assert verify_hello({**hello, "mac": ""}, "s3cret") is None
    assert verify_hello({**hello, "nonce": "0" * 32}, "s3cret") is None
    for field in ("server_id", "nonce", "mac"):
        partial = dict(hello)
        del partial[field]
        assert verify_hello(partial, "s3cret") is None
    assert verify_hello({**hello, "server_id": ""}, "s3cret") is None
    assert verify_hello({**hello, "mac": 5}, "s3cret") is None


def test_verify_hello_open_mode():
    assert verify_hello({"server_id": "b", "nonce": "x", "mac": "garbage"}, "") == "b"
    assert verify_hello({"server_id": "b"}, "") == "b"
    assert verify_hello({"server_id": ""}, "") is None
    assert verify_hello({}, "") is None
    assert verify_hello({"server_id": 7}, "") is None
    assert verify_hello(None, "") is None
    assert verify_hello(["server_id"], "") is None
