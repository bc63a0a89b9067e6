"""The mesh codec and handshake (actors/mesh/frames.py, handshake.py): docs/behaviour.md
§3.2–§3.4, §14 invariants 1–4, 6–7, the HELLO replay window and sealed frames."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from actors.mesh.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    HEARTBEAT,
    HELLO,
    MAINTENANCE_MODE_SET,
    MESSAGE_AVAILABLE,
    SEALED_OVERHEAD,
    FrameError,
    Opener,
    Sealer,
    decode_payload,
    encode,
    encode_payload,
    read_frame,
)
from actors.mesh.handshake import (
    HelloRejected,
    NonceCache,
    connection_key,
    hello_of,
    make_hello,
    now_ms,
    verify_hello,
)

MAX_FRAME_LENGTH = DEFAULT_MAX_FRAME_BYTES


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


# --- HELLO (invariants 6–7, the replay window) ---------------------------------

SECRET = "s3cret"


def expected_hello_mac(secret: str, server_id: str, ts: int, nonce: bytes) -> str:
    sid = server_id.encode()
    data = (b"queen-mesh/2 hello\x00" + struct.pack(">H", len(sid)) + sid
            + struct.pack(">Q", ts) + nonce)
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def verify(payload, secret=SECRET, *, nonces=None, not_before_ms=0, now=None):
    return verify_hello(payload, secret, nonces=nonces if nonces is not None else NonceCache(30_000),
                        not_before_ms=not_before_ms, now=now)


def rejected(payload, secret=SECRET, **kwargs) -> str:
    with pytest.raises(HelloRejected) as exc:
        verify(payload, secret, **kwargs)
    return exc.value.reason


def test_make_hello_mac_covers_every_field():
    hello = make_hello("queen-a", SECRET)
    assert hello["server_id"] == "queen-a"
    assert abs(hello["ts"] - now_ms()) < 5000
    assert len(hello["nonce"]) == 32
    nonce = bytes.fromhex(hello["nonce"])
    assert hello["mac"] == expected_hello_mac(SECRET, "queen-a", hello["ts"], nonce)
    assert make_hello("queen-a", SECRET)["nonce"] != hello["nonce"]


def test_verify_hello_accepts_a_fresh_hello_once():
    nonces = NonceCache(30_000)
    hello = make_hello("queen-a", SECRET)
    assert verify(hello, nonces=nonces).server_id == "queen-a"
    assert rejected(hello, nonces=nonces) == "replayed_nonce"
    assert len(nonces) == 1


def test_verify_hello_rejects_altered_fields_under_the_same_mac():
    hello = make_hello("queen-a", SECRET)
    assert rejected({**hello, "server_id": "queen-b"}) == "bad_mac"
    assert rejected({**hello, "ts": hello["ts"] + 1}) == "bad_mac"
    assert rejected({**hello, "nonce": "0" * 32}) == "bad_mac"
    assert rejected(hello, "other") == "bad_mac"
    assert verify({**hello, "mac": hello["mac"].upper()}).server_id == "queen-a"


@pytest.mark.parametrize("change", [
    {"mac": "zz" + "0" * 62}, {"mac": "00"}, {"mac": ""}, {"mac": 5}, {"nonce": "abc"},
    {"nonce": "00" * 8}, {"server_id": ""}, {"server_id": 7}, {"server_id": "x" * 256},
    {"ts": "1"}, {"ts": 1.5}, {"ts": True}, {"ts": -1},
])
def test_verify_hello_rejects_malformed(change):
    assert rejected({**make_hello("queen-a", SECRET), **change}) == "bad_hello"


@pytest.mark.parametrize("field", ["server_id", "ts", "nonce", "mac"])
def test_verify_hello_rejects_missing_fields(field):
    hello = make_hello("queen-a", SECRET)
    del hello[field]
    assert rejected(hello) == "bad_hello"


@pytest.mark.parametrize("payload", [None, [], "hello"])
def test_verify_hello_rejects_non_objects(payload):
    assert rejected(payload) == "bad_hello"


def test_verify_hello_skew_window_both_ways():
    now = now_ms()
    assert rejected(make_hello("a", SECRET, ts=now - 30_001), now=now) == "skew"
    assert rejected(make_hello("a", SECRET, ts=now + 30_001), now=now) == "skew"
    assert verify(make_hello("a", SECRET, ts=now - 29_000), now=now).ts == now - 29_000


def test_verify_hello_rejects_a_hello_older_than_the_listener():
    """A restarted listener forgot its nonces; HELLOs from before the restart stay out."""
    now = now_ms()
    hello = make_hello("a", SECRET, ts=now - 1000)
    assert rejected(hello, not_before_ms=now - 500, now=now) == "skew"


def test_nonce_cache_forgets_after_the_window_and_is_bounded():
    nonces = NonceCache(1000, capacity=2)
    now = now_ms()
    first = make_hello("a", SECRET, ts=now)
    verify(first, nonces=nonces, now=now)
    verify(make_hello("a", SECRET, ts=now), nonces=nonces, now=now)
    assert rejected(make_hello("a", SECRET, ts=now), nonces=nonces, now=now) == "cap"
    # Past the window both are forgotten; replaying `first` now fails on its timestamp.
    later = now + 1001
    assert rejected(first, nonces=nonces, now=later) == "skew"
    verify(make_hello("a", SECRET, ts=later), nonces=nonces, now=later)
    assert len(nonces) == 1


def test_open_mode_uses_the_same_protocol_with_an_empty_key():
    hello = make_hello("anon", "")
    assert verify(hello, "").server_id == "anon"
    assert rejected(hello, SECRET) == "bad_mac"


def test_connection_key_is_hkdf_of_secret_and_hello():
    hello = make_hello("queen-a", SECRET)
    h = hello_of(hello)
    sid = b"queen-a"
    info = b"queen-mesh/2 frame key\x00" + struct.pack(">H", len(sid)) + sid + struct.pack(">Q", h.ts)
    expected = HKDF(algorithm=hashes.SHA256(), length=32, salt=h.nonce, info=info).derive(b"s3cret")
    assert connection_key(SECRET, h) == expected
    assert connection_key(SECRET, hello_of(make_hello("queen-a", SECRET))) != expected


# --- sealed frames ---------------------------------------------------------


KEY = b"k" * 32


def test_sealed_layout():
    body = encode_payload({"enabled": True})
    frame = Sealer(KEY).seal(MAINTENANCE_MODE_SET, body)
    assert frame[:4] == struct.pack(">I", SEALED_OVERHEAD + len(body))
    assert frame[4:12] == struct.pack(">Q", 1)
    assert frame[12] == MAINTENANCE_MODE_SET
    assert frame[13:-32] == body
    assert frame[-32:] == hmac.new(KEY, frame[:-32], hashlib.sha256).digest()


async def test_sealed_round_trip_in_order():
    sealer = Sealer(KEY)
    data = sealer.seal(MESSAGE_AVAILABLE, b'{"queue":"q"}') + sealer.seal(HEARTBEAT, b"")
    opener = Opener(KEY)
    reader = reader_with(data)
    assert await opener.read(reader) == (MESSAGE_AVAILABLE, b'{"queue":"q"}')
    assert await opener.read(reader) == (HEARTBEAT, b"")
    assert opener.seq == 2


async def read_reason(opener: Opener, data: bytes) -> str:
    with pytest.raises(FrameError) as exc:
        reader = reader_with(data)
        while True:
            await asyncio.wait_for(opener.read(reader), 1)
    return exc.value.reason


async def test_sealed_frame_with_a_flipped_bit_fails_the_mac():
    frame = bytearray(Sealer(KEY).seal(MAINTENANCE_MODE_SET, b'{"enabled":false}'))
    frame[-40] ^= 1
    assert await read_reason(Opener(KEY), bytes(frame)) == "bad_mac"


async def test_sealed_frame_under_another_key_fails_the_mac():
    frame = Sealer(b"x" * 32).seal(MAINTENANCE_MODE_SET, b'{"enabled":true}')
    assert await read_reason(Opener(KEY), frame) == "bad_mac"


async def test_repeated_skipped_and_reordered_frames_fail_the_sequence():
    sealer = Sealer(KEY)
    one, two, three = (sealer.seal(HEARTBEAT, b"") for _ in range(3))
    assert await read_reason(Opener(KEY), one + one) == "sequence"
    assert await read_reason(Opener(KEY), one + three) == "sequence"
    assert await read_reason(Opener(KEY), two) == "sequence"


async def test_sealed_length_over_the_limit_is_refused_before_reading():
    reader = reader_with(struct.pack(">I", 4097), eof=False)
    with pytest.raises(FrameError) as exc:
        await asyncio.wait_for(Opener(KEY, max_length=4096).read(reader), 1)
    assert exc.value.reason == "oversize"


async def test_sealed_length_below_the_overhead_is_a_framing_error():
    reader = reader_with(struct.pack(">I", 5) + b"\x00" * 5)
    with pytest.raises(FrameError) as exc:
        await Opener(KEY).read(reader)
    assert exc.value.reason == "framing"
