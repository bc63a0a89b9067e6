"""The HELLO that opens every mesh connection, and the key it gives the connection.

The mesh has no reply channel: the listener never writes a byte on an
accepted connection, so it cannot send the dialler a challenge to sign. A
recorded HELLO therefore has to be recognised from the HELLO alone. It carries

    {"server_id": str, "ts": int (Unix ms), "nonce": 32 hex chars, "mac": 64 hex chars}

    mac = HMAC-SHA256(QUEEN_SYNC_SECRET,
                      "queen-mesh/2 hello" 0x00 | u16 len(server_id) | server_id
                      | u64 ts | nonce (16 raw bytes))

so nobody without the secret can make one, and changing any field (another
`server_id` under a recorded mac, a fresher `ts`) breaks the mac. The
listener accepts a HELLO only if

  1. the mac verifies (constant-time compare);
  2. `ts` lies within `max_skew_ms` of its own clock, and is not older than
     the moment the listener started;
  3. its nonce has not been accepted before.

A replay inside the window fails (3): the listener remembers every accepted
nonce until its `ts` leaves the window. A replay after the window fails (2).
The "not before the listener started" half of (2) covers the one thing the
nonce memory cannot: a restart forgets the nonces, but every HELLO accepted
before the restart is older than the new start. The cost is that a dialler
whose clock runs behind the listener's is refused for that long after a
listener restart; it redials on its backoff (at most 5 s) until it passes.
The nonce memory is bounded: only HELLOs whose mac verified are remembered,
each for at most 2 x max_skew_ms, and when it is full new HELLOs are refused
(reason `cap`) rather than old nonces forgotten early, which would reopen
replay.

The HELLO also fixes the connection key of every frame after it:

    key = HKDF-SHA256(ikm = secret, salt = nonce (16 raw bytes),
                      info = "queen-mesh/2 frame key" 0x00 | u16 len(server_id)
                             | server_id | u64 ts, length = 32)

(`cryptography`'s HKDF). The nonce is fresh per connection, so each
connection has its own key and frames cannot be moved between connections;
the sequence numbers of frames.py stop reordering and replay within one.

Open mode (empty secret) runs the same protocol with an empty key: the
format, sequence checks and replay window still apply, but anyone can make a
valid HELLO, so it authenticates nothing (the broker warns about it).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "DEFAULT_MAX_SKEW_MS",
    "MAX_SERVER_ID_BYTES",
    "Hello",
    "HelloRejected",
    "NonceCache",
    "connection_key",
    "make_hello",
    "verify_hello",
]

HELLO_LABEL = b"queen-mesh/2 hello\x00"
KEY_LABEL = b"queen-mesh/2 frame key\x00"
NONCE_BYTES = 16
MAX_SERVER_ID_BYTES = 255
DEFAULT_MAX_SKEW_MS = 30_000
MAX_NONCES = 10_000

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class Hello:
    server_id: str
    ts: int
    nonce: bytes


class HelloRejected(Exception):
    """The HELLO is not acceptable; `reason` is the counter it is reported under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _bound(server_id: str, ts: int) -> bytes:
    sid = server_id.encode()
    return _U16.pack(len(sid)) + sid + _U64.pack(ts)


def _hello_mac(secret: str, hello: Hello) -> bytes:
    data = HELLO_LABEL + _bound(hello.server_id, hello.ts) + hello.nonce
    return hmac.new(secret.encode(), data, hashlib.sha256).digest()


def now_ms() -> int:
    return int(time.time() * 1000)


def make_hello(server_id: str, secret: str, ts: int | None = None,
               nonce: bytes | None = None) -> dict[str, Any]:
    """A HELLO payload with the current time and a fresh random nonce."""
    hello = Hello(server_id, now_ms() if ts is None else ts,
                  secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce)
    return {"server_id": hello.server_id, "ts": hello.ts, "nonce": hello.nonce.hex(),
            "mac": _hello_mac(secret, hello).hex()}


def parse_hello(payload: Any) -> tuple[Hello, bytes]:
    """(Hello, given mac) from a decoded payload; HelloRejected("bad_hello") if malformed."""
    if not isinstance(payload, dict):
        raise HelloRejected("bad_hello", "HELLO payload is not a JSON object")
    server_id, ts = payload.get("server_id"), payload.get("ts")
    nonce, mac = payload.get("nonce"), payload.get("mac")
    if not isinstance(server_id, str) or not server_id \
            or len(server_id.encode()) > MAX_SERVER_ID_BYTES:
        raise HelloRejected("bad_hello", "HELLO server_id missing, empty or too long")
    if not isinstance(ts, int) or isinstance(ts, bool) or not 0 <= ts < 2**63:
        raise HelloRejected("bad_hello", "HELLO ts missing or not an integer")
    try:
        nonce_bytes = bytes.fromhex(nonce) if isinstance(nonce, str) else b""
        mac_bytes = bytes.fromhex(mac) if isinstance(mac, str) else b""
    except ValueError:
        raise HelloRejected("bad_hello", "HELLO nonce or mac is not hex") from None
    if len(nonce_bytes) != NONCE_BYTES or len(mac_bytes) != 32:
        raise HelloRejected("bad_hello", "HELLO nonce or mac has the wrong length")
    return Hello(server_id, ts, nonce_bytes), mac_bytes


class NonceCache:
    """Accepted nonces, each remembered until its HELLO's timestamp leaves the window."""

    def __init__(self, max_skew_ms: int, capacity: int = MAX_NONCES) -> None:
        self.max_skew_ms = max_skew_ms
        self.capacity = capacity
        self._expiry: list[tuple[int, bytes]] = []  # heap of (forget after, nonce)
        self._seen: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, hello: Hello, now: int) -> None:
        """Remember the nonce, or raise HelloRejected (replayed_nonce, cap)."""
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiry)[1])
        if hello.nonce in self._seen:
            raise HelloRejected("replayed_nonce", "HELLO nonce already used")
        if len(self._seen) >= self.capacity:
            raise HelloRejected("cap", "too many HELLOs inside the replay window")
        self._seen.add(hello.nonce)
        heapq.heappush(self._expiry, (hello.ts + self.max_skew_ms, hello.nonce))


def verify_hello(payload: Any, secret: str, *, nonces: NonceCache, not_before_ms: int,
                 now: int | None = None) -> Hello:
    """The HELLO if it is acceptable (and its nonce is now used), else HelloRejected.

    Checks in order: well-formed (bad_hello), mac (bad_mac), timestamp within
    the window and not before `not_before_ms` (skew), nonce unused
    (replayed_nonce) and room to remember it (cap).
    """
    hello, given = parse_hello(payload)
    if not hmac.compare_digest(_hello_mac(secret, hello), given):
        raise HelloRejected("bad_mac", "HELLO mac does not verify")
    now = now_ms() if now is None else now
    if abs(now - hello.ts) > nonces.max_skew_ms:
        raise HelloRejected("skew", f"HELLO timestamp {hello.ts - now:+d} ms from this clock")
    if hello.ts < not_before_ms:
        raise HelloRejected("skew", "HELLO timestamp is older than this listener's start")
    nonces.admit(hello, now)
    return hello


def connection_key(secret: str, hello: Hello) -> bytes:
    """The key of the sealed frames that follow this HELLO."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=hello.nonce,
                info=KEY_LABEL + _bound(hello.server_id, hello.ts))
    return hkdf.derive(secret.encode())


def hello_of(payload: dict[str, Any]) -> Hello:
    """The Hello of a payload made by `make_hello` (for the dialler's own key)."""
    return parse_hello(payload)[0]
