"""The mesh wire format: the only code that touches mesh bytes.

Two framings share one 4-byte big-endian length prefix, which counts every
byte after itself:

    plain   u32 length | u8 type | JSON payload                  (HELLO only)
    sealed  u32 length | u64 seq | u8 type | JSON payload | mac[32]

A connection carries exactly one plain frame, the HELLO (handshake.py), then
sealed frames only. ``seq`` starts at 1 and grows by one per frame;
``mac = HMAC-SHA256(connection key, every byte of the frame before the mac)``,
length prefix included. The connection key comes from the HELLO
(handshake.py), so a frame is only valid on the connection it was written
for, at its place in the stream: a frame copied from another connection, or
repeated, skipped or reordered on this one, is rejected.

The reader rejects a zero length or a length above its limit from the 4-byte
prefix alone, before reading (and so before buffering) the body: a hostile
length prefix cannot drive an allocation. HMAC comes from the standard
library (``hmac``, compared with ``hmac.compare_digest``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct
from typing import Any

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FRAME_NAMES",
    "HEARTBEAT",
    "HELLO",
    "HINT_TYPES",
    "HOTLIST_DIRTY_BATCH",
    "MAC_BYTES",
    "MAINTENANCE_MODE_SET",
    "MESSAGE_AVAILABLE",
    "MESSAGE_AVAILABLE_BATCH",
    "POP_MAINTENANCE_MODE_SET",
    "QUEUE_CONFIG_DELETE",
    "QUEUE_CONFIG_SET",
    "SEALED_OVERHEAD",
    "FrameError",
    "Opener",
    "Sealer",
    "decode_payload",
    "encode",
    "encode_payload",
    "read_frame",
]

MESSAGE_AVAILABLE = 1
MESSAGE_AVAILABLE_BATCH = 2
HEARTBEAT = 3
HELLO = 4
HOTLIST_DIRTY_BATCH = 5
QUEUE_CONFIG_SET = 10
QUEUE_CONFIG_DELETE = 11
MAINTENANCE_MODE_SET = 40
POP_MAINTENANCE_MODE_SET = 41

FRAME_NAMES: dict[int, str] = {
    MESSAGE_AVAILABLE: "MESSAGE_AVAILABLE",
    MESSAGE_AVAILABLE_BATCH: "MESSAGE_AVAILABLE_BATCH",
    HEARTBEAT: "HEARTBEAT",
    HELLO: "HELLO",
    HOTLIST_DIRTY_BATCH: "HOTLIST_DIRTY_BATCH",
    QUEUE_CONFIG_SET: "QUEUE_CONFIG_SET",
    QUEUE_CONFIG_DELETE: "QUEUE_CONFIG_DELETE",
    MAINTENANCE_MODE_SET: "MAINTENANCE_MODE_SET",
    POP_MAINTENANCE_MODE_SET: "POP_MAINTENANCE_MODE_SET",
}

# The frame types handed to the application; HELLO and HEARTBEAT only feed
# the transport's liveness map.
HINT_TYPES: frozenset[int] = frozenset(FRAME_NAMES) - {HELLO, HEARTBEAT}

# Default largest length prefix (QUEEN_MESH_MAX_FRAME_BYTES). The biggest
# hint a broker sends is a HOTLIST_DIRTY_BATCH of 1000 partitions (tens of
# KiB with long names); 1 MiB leaves room without letting a peer park 16 MiB.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024

MAC_BYTES = 32
_LENGTH = struct.Struct(">I")
_PLAIN_HEADER = struct.Struct(">IB")
_SEALED_HEADER = struct.Struct(">IQB")  # length, seq, type
# Bytes of a sealed frame's length that are not payload: seq, type, mac.
SEALED_OVERHEAD = 8 + 1 + MAC_BYTES


class FrameError(Exception):
    """The byte stream is not a valid frame sequence; the connection must close.

    `reason` is the counter it is reported under (framing, oversize, bad_mac,
    sequence); `clean_eof` is True when the stream ended exactly on a frame
    boundary (the peer closed without sending a partial frame).
    """

    def __init__(self, message: str, *, reason: str = "framing", clean_eof: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.clean_eof = clean_eof


def encode_payload(payload: Any = None) -> bytes:
    """A payload's JSON bytes; None gives an empty payload. TypeError if not encodable."""
    return b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()


def encode(frame_type: int, payload: Any = None,
           max_length: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """One plain frame (the HELLO). None gives an empty payload (length 1).

    Raises ValueError for a type outside 0..255 or a frame above `max_length`,
    TypeError for a payload JSON cannot encode.
    """
    _check_type(frame_type)
    body = encode_payload(payload)
    length = 1 + len(body)
    if length > max_length:
        msg = f"frame too large: {length} bytes"
        raise ValueError(msg)
    return _PLAIN_HEADER.pack(length, frame_type) + body


def _check_type(frame_type: int) -> None:
    if not 0 <= frame_type <= 0xFF:
        msg = f"frame type out of range: {frame_type}"
        raise ValueError(msg)


async def _read_body(reader: asyncio.StreamReader, max_length: int, min_length: int) -> bytes:
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(
            f"truncated length prefix ({len(exc.partial)} of 4 bytes)",
            clean_eof=not exc.partial,
        ) from None
    (length,) = _LENGTH.unpack(prefix)
    if length == 0:
        msg = "zero frame length"
        raise FrameError(msg)
    if length > max_length:
        msg = f"frame length {length} exceeds limit {max_length}"
        raise FrameError(msg, reason="oversize")
    if length < min_length:
        msg = f"frame length {length} below the minimum {min_length}"
        raise FrameError(msg)
    try:
        return prefix + await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        msg = f"truncated frame ({len(exc.partial)} of {length} bytes)"
        raise FrameError(msg) from None


async def read_frame(
    reader: asyncio.StreamReader, max_length: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[int, bytes]:
    """Read one plain frame: (type, raw payload bytes).

    Raises FrameError for a truncated prefix or body, a zero length, or a
    length above `max_length` (checked before the body is read).
    """
    frame = await _read_body(reader, max_length, 1)
    return frame[4], frame[5:]


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


class Sealer:
    """The sending side of one connection: numbers and MACs each frame."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.seq = 0  # of the last frame sealed

    def seal(self, frame_type: int, body: bytes) -> bytes:
        _check_type(frame_type)
        self.seq += 1
        head = _SEALED_HEADER.pack(SEALED_OVERHEAD + len(body), self.seq, frame_type)
        signed = head + body
        return signed + _mac(self._key, signed)


class Opener:
    """The receiving side of one connection: checks each frame's MAC, then its number."""

    def __init__(self, key: bytes, max_length: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._key = key
        self.max_length = max_length
        self.seq = 0  # of the last frame accepted

    async def read(self, reader: asyncio.StreamReader) -> tuple[int, bytes]:
        """The next frame: (type, raw payload). FrameError (with a reason) if it is not valid.

        The MAC is checked first: a frame that verifies but carries another
        number than the next one was written for this connection and is
        being replayed or reordered (`sequence`); one that does not verify
        was forged, altered or written for another connection (`bad_mac`).
        """
        frame = await _read_body(reader, self.max_length, SEALED_OVERHEAD)
        signed, given = frame[:-MAC_BYTES], frame[-MAC_BYTES:]
        if not hmac.compare_digest(_mac(self._key, signed), given):
            msg = "frame MAC does not verify"
            raise FrameError(msg, reason="bad_mac")
        _, seq, frame_type = _SEALED_HEADER.unpack_from(signed)
        if seq != self.seq + 1:
            msg = f"sequence number {seq}, expected {self.seq + 1}"
            raise FrameError(msg, reason="sequence")
        self.seq = seq
        return frame_type, signed[_SEALED_HEADER.size:]


def decode_payload(payload: bytes) -> dict[str, Any] | None:
    """The payload as a JSON object, or None when it is malformed or not an object."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None
