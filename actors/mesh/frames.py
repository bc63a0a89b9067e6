"""The mesh wire format: the only code that touches mesh bytes.

A frame is ``u32 big-endian length | u8 type | JSON payload`` where
``length = 1 + len(payload)`` (the type byte is counted). There are no
sequence numbers and no per-frame MAC: TCP gives ordering and integrity, and
the only authentication is the HELLO that opens a connection (behaviour.md
§3.2–§3.4).

The reader rejects a zero length or a length above `MAX_FRAME_LENGTH` from the
4-byte prefix alone, before reading (and so before buffering) the body: a
hostile length prefix cannot drive an allocation.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import struct
from typing import Any

__all__ = [
    "FRAME_NAMES",
    "HEARTBEAT",
    "HELLO",
    "HINT_TYPES",
    "HOTLIST_DIRTY_BATCH",
    "MAINTENANCE_MODE_SET",
    "MAX_FRAME_LENGTH",
    "MESSAGE_AVAILABLE",
    "MESSAGE_AVAILABLE_BATCH",
    "POP_MAINTENANCE_MODE_SET",
    "QUEUE_CONFIG_DELETE",
    "QUEUE_CONFIG_SET",
    "FrameError",
    "decode_payload",
    "encode",
    "make_hello",
    "read_frame",
    "verify_hello",
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

# Largest accepted length prefix (type byte + payload).
MAX_FRAME_LENGTH = 16 * 1024 * 1024

_LENGTH = struct.Struct(">I")
_HEADER = struct.Struct(">IB")

NONCE_BYTES = 16  # 32 hex characters


class FrameError(Exception):
    """The byte stream is not a valid frame sequence; the connection must close.

    `clean_eof` is True when the stream ended exactly on a frame boundary
    (the peer closed without sending a partial frame).
    """

    def __init__(self, message: str, *, clean_eof: bool = False) -> None:
        super().__init__(message)
        self.clean_eof = clean_eof


def encode(frame_type: int, payload: Any = None) -> bytes:
    """One frame. `payload` is JSON-encoded; None gives an empty payload (length 1).

    Raises ValueError for a type outside 0..255 or a frame above MAX_FRAME_LENGTH,
    TypeError for a payload JSON cannot encode.
    """
    if not 0 <= frame_type <= 0xFF:
        msg = f"frame type out of range: {frame_type}"
        raise ValueError(msg)
    body = b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()
    length = 1 + len(body)
    if length > MAX_FRAME_LENGTH:
        msg = f"frame too large: {length} bytes"
        raise ValueError(msg)
    return _HEADER.pack(length, frame_type) + body


async def read_frame(
    reader: asyncio.StreamReader, max_length: int = MAX_FRAME_LENGTH
) -> tuple[int, bytes]:
    """Read one frame: (type, raw payload bytes).

    Raises FrameError for a truncated prefix or body, a zero length, or a
    length above `max_length` (checked before the body is read).
    """
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
        raise FrameError(msg)
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        msg = f"truncated frame ({len(exc.partial)} of {length} bytes)"
        raise FrameError(msg) from None
    return body[0], body[1:]


def decode_payload(payload: bytes) -> dict[str, Any] | None:
    """The payload as a JSON object, or None when it is malformed or not an object."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def _mac(secret: str, nonce: str) -> bytes:
    return hmac.new(secret.encode(), nonce.encode(), hashlib.sha256).digest()


def make_hello(server_id: str, secret: str) -> dict[str, str]:
    """HELLO payload: a fresh random nonce and hex(HMAC-SHA256(secret, nonce)).

    The mac is empty when the secret is empty (open mode).
    """
    nonce = secrets.token_hex(NONCE_BYTES)
    mac = _mac(secret, nonce).hex() if secret else ""
    return {"server_id": server_id, "nonce": nonce, "mac": mac}


def verify_hello(payload: Any, secret: str) -> str | None:
    """The sender's server_id if this HELLO payload is acceptable, else None.

    Open mode (empty secret): any non-empty `server_id` is accepted, whatever
    the mac. Otherwise `nonce` and `mac` must be strings and `mac` the hex
    HMAC-SHA256 of the nonce under the secret, compared in constant time.
    Nonces are not tracked: a captured HELLO can be replayed (§3.4).
    """
    if not isinstance(payload, dict):
        return None
    server_id = payload.get("server_id")
    if not isinstance(server_id, str) or not server_id:
        return None
    if not secret:
        return server_id
    nonce = payload.get("nonce")
    mac = payload.get("mac")
    if not isinstance(nonce, str) or not nonce or not isinstance(mac, str):
        return None
    try:
        given = bytes.fromhex(mac)
    except ValueError:
        return None
    if not hmac.compare_digest(_mac(secret, nonce), given):
        return None
    return server_id
