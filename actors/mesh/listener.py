"""The receiving half of the mesh: accepted (inbound) connections only.

Every accepted connection must open with a HELLO that verifies
(handshake.py); after it, every frame must be a sealed frame under the
connection's key with the next sequence number (frames.py). Anything else
closes the connection, is counted under its reason and logged (rate-limited);
nothing of a rejected frame reaches `on_frame`. The listener never writes a
byte on an accepted connection: the dialler learns nothing from it, not even
a rejection.

Resources an unauthenticated client can hold are bounded: at most
`max_connections` accepted connections at once (more are closed on accept;
with TLS, counted once the TLS handshake is done); `handshake_timeout_s` to
finish TLS, and again to send a HELLO of at most
MAX_HELLO_LENGTH bytes; after the HELLO, a frame (heartbeats included) at
least every `dead_threshold_ms` and none longer than `max_frame_bytes`.
Liveness (the last time any valid frame arrived, keyed by the HELLO's
server_id) is informational only.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from actors.mesh.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    HEARTBEAT,
    HELLO,
    HINT_TYPES,
    FrameError,
    Opener,
    decode_payload,
    read_frame,
)
from actors.mesh.handshake import (
    DEFAULT_MAX_SKEW_MS,
    HelloRejected,
    NonceCache,
    connection_key,
    now_ms,
    verify_hello,
)
from actors.runtime import AsyncioActor

__all__ = ["REJECTION_REASONS", "ListenerState", "MeshListener", "OnFrame"]

OnFrame = Callable[[int, dict[str, Any], str], "Awaitable[Any] | Any"]

# A HELLO is ~400 bytes with the longest server_id; before the handshake
# nobody is trusted with more.
MAX_HELLO_LENGTH = 1024
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 8
MIN_MONITOR_TICK_MS = 250

# Why a connection was closed. Before an accepted HELLO: cap (too many
# connections, or nonces in the window), timeout, framing, oversize,
# bad_hello, bad_mac, skew, replayed_nonce. After it: framing, oversize,
# bad_mac, sequence, idle.
REJECTION_REASONS = ("bad_hello", "bad_mac", "skew", "replayed_nonce", "sequence", "oversize",
                     "cap", "timeout", "idle", "framing")

# Rejection log lines: at most LOG_BURST per LOG_WINDOW_S; the rest are
# counted and the count reported with the next line that is written.
LOG_BURST = 10
LOG_WINDOW_S = 60.0


class RateLimitedLog:
    def __init__(self, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S) -> None:
        self.burst = burst
        self.window_s = window_s
        self._window_end = float("-inf")
        self._written = 0
        self.suppressed = 0

    def warning(self, message: str, *args: Any) -> bool:
        now = time.monotonic()
        if now >= self._window_end:
            self._window_end = now + self.window_s
            self._written = 0
        if self._written >= self.burst:
            self.suppressed += 1
            return False
        self._written += 1
        if self.suppressed:
            message += " ({} earlier rejection(s) not logged)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        logger.warning(message, *args)
        return True


MAX_ADVERTISED_URL = 2048
"""Longest advertised HTTP API URL a heartbeat may carry (QUEEN_ADVERTISE_URL's bound)."""


class ListenerState:
    """Counters and the liveness map, readable synchronously by the owner of the mesh."""

    def __init__(self, dead_threshold_ms: int) -> None:
        self.dead_threshold_ms = dead_threshold_ms
        self.messages_received = 0
        self.handshake_failures = 0  # connections closed before a HELLO was accepted
        self.rejections = dict.fromkeys(REJECTION_REASONS, 0)
        self.inbound_connections = 0  # currently open accepted connections
        self.last_seen: dict[str, float] = {}  # server_id -> time.monotonic()
        self.urls: dict[str, str] = {}  # server_id -> the HTTP API its heartbeats advertise

    def touch(self, server_id: str) -> None:
        self.last_seen[server_id] = time.monotonic()

    def is_dead(self, server_id: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return (now - self.last_seen[server_id]) * 1000 > self.dead_threshold_ms

    def alive_urls(self) -> dict[str, str]:
        """The advertised HTTP API of every peer alive now that sent one."""
        now = time.monotonic()
        return {sid: url for sid, url in self.urls.items()
                if sid in self.last_seen and not self.is_dead(sid, now)}

    def liveness(self) -> tuple[int, int]:
        """(servers_alive, servers_dead) among the server_ids ever seen."""
        now = time.monotonic()
        dead = sum(1 for sid in self.last_seen if self.is_dead(sid, now))
        return len(self.last_seen) - dead, dead

    def stats(self) -> dict[str, Any]:
        alive, dead = self.liveness()
        return {
            "servers_alive": alive,
            "servers_dead": dead,
            "messages_received": self.messages_received,
            "handshake_failures": self.handshake_failures,
            "rejections": dict(self.rejections),
            "inbound_connections": self.inbound_connections,
        }


class MeshListener(AsyncioActor):
    """Accepts mesh connections and dispatches their frames to `on_frame`.

    `on_frame(type, payload, sender_server_id)` may be sync or async; it is
    called in order per connection, and its exceptions are logged and
    swallowed. `messages_received` counts the frames dispatched to it.
    """

    def __init__(
        self,
        on_frame: OnFrame,
        *,
        secret: str,
        dead_threshold_ms: int,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: ssl.SSLContext | None = None,
        state: ListenerState | None = None,
    ) -> None:
        super().__init__()
        self._on_frame = on_frame
        self._secret = secret
        self._handshake_timeout_s = handshake_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._max_connections = max_connections
        self._tls = tls
        self._nonces = NonceCache(max_skew_ms)
        self._started_ms = 0  # HELLOs older than this predate the nonce memory
        self.state = state or ListenerState(dead_threshold_ms)
        self._log = RateLimitedLog()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self._dead: set[str] = set()  # as last logged by the monitor

    # --- actor API ---------------------------------------------------------

    async def start_serving(self, host: str, port: int) -> int:
        """Bind and start accepting. Returns the bound port (useful with port 0).

        Raises OSError when the address cannot be bound.
        """
        if self._server is not None:
            msg = "mesh listener already serving"
            raise RuntimeError(msg)
        self._started_ms = now_ms()
        # With TLS, asyncio runs the handshake (bounded by the handshake timeout)
        # before `_accept` sees the connection; a client that fails it is closed
        # by asyncio and never reaches the counters below.
        tls_timeout = self._handshake_timeout_s if self._tls is not None else None
        self._server = await asyncio.start_server(self._accept, host, port, ssl=self._tls,
                                                  ssl_handshake_timeout=tls_timeout)
        bound = self._server.sockets[0].getsockname()[1]
        tick_ms = max(self.state.dead_threshold_ms / 2, MIN_MONITOR_TICK_MS)
        self._monitor = asyncio.get_running_loop().create_task(
            self._monitor_loop(tick_ms / 1000), name="mesh-liveness"
        )
        return bound

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        if self._server is not None:
            self._server.close()
        tasks = list(self._connections)
        if self._monitor is not None:
            tasks.append(self._monitor)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # --- connections -------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, so the handler is a task this actor owns (and
        # cancels on stop) rather than one asyncio.start_server keeps.
        if len(self._connections) >= self._max_connections:
            self._reject(writer.get_extra_info("peername"), "cap", before_hello=True,
                         detail=f"{self._max_connections} connections already open")
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        self.state.inbound_connections += 1
        try:
            accepted = await self._handshake(reader, writer, peer)
            if accepted is None:
                return
            server_id, opener = accepted
            logger.debug("mesh: accepted connection from {} at {}", server_id, peer)
            await self._receive(reader, opener, server_id, peer)
        finally:
            self.state.inbound_connections -= 1
            # Closing only; nothing is ever written on an accepted connection.
            writer.close()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Any
    ) -> tuple[str, Opener] | None:
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                frame_type, raw = await read_frame(reader, MAX_HELLO_LENGTH)
        except TimeoutError:
            self._reject(peer, "timeout", before_hello=True, detail="no HELLO in time")
            return None
        except FrameError as exc:
            if not exc.clean_eof:  # a clean close without a byte is a probe, not an attack
                self._reject(peer, exc.reason, before_hello=True, detail=str(exc))
            return None
        except OSError as exc:
            self._reject(peer, "framing", before_hello=True, detail=f"connection error: {exc}")
            return None
        if frame_type != HELLO:
            self._reject(peer, "bad_hello", before_hello=True,
                         detail=f"first frame has type {frame_type}, not HELLO")
            return None
        try:
            hello = verify_hello(decode_payload(raw), self._secret, nonces=self._nonces,
                                 not_before_ms=self._started_ms)
        except HelloRejected as exc:
            self._reject(peer, exc.reason, before_hello=True, detail=str(exc))
            return None
        self._seen(hello.server_id)
        key = connection_key(self._secret, hello)
        return hello.server_id, Opener(key, self._max_frame_bytes)

    async def _receive(
        self, reader: asyncio.StreamReader, opener: Opener, server_id: str, peer: Any
    ) -> None:
        idle_s = self.state.dead_threshold_ms / 1000
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    frame_type, raw = await opener.read(reader)
            except TimeoutError:
                self._reject(peer, "idle", detail=f"{server_id} sent nothing for {idle_s:g} s")
                return
            except FrameError as exc:
                if not exc.clean_eof:
                    self._reject(peer, exc.reason, detail=f"{server_id}: {exc}")
                return
            except OSError as exc:
                logger.debug("mesh: connection from {} ({}) lost: {}", server_id, peer, exc)
                return
            self._seen(server_id)
            if frame_type == HEARTBEAT:
                self._heard_url(server_id, raw)
                continue
            if frame_type not in HINT_TYPES:
                continue  # an unknown type
            payload = decode_payload(raw)
            if payload is None:
                logger.debug("mesh: ignoring malformed frame type {} from {}", frame_type,
                             server_id)
                continue
            self.state.messages_received += 1
            try:
                result = self._on_frame(frame_type, payload, server_id)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("mesh: handler failed for frame type {}", frame_type)

    def _reject(self, peer: Any, reason: str, *, detail: str, before_hello: bool = False) -> None:
        self.state.rejections[reason] = self.state.rejections.get(reason, 0) + 1
        if before_hello:
            self.state.handshake_failures += 1
        self._log.warning("mesh: closed connection from {} ({}): {}", peer, reason, detail)

    # --- liveness ----------------------------------------------------------

    def _heard_url(self, server_id: str, raw: bytes) -> None:
        """A heartbeat's advertised HTTP API (``url``), kept per authenticated sender; a
        heartbeat without one, or with something that is not an http(s) URL, keeps none."""
        payload = decode_payload(raw)
        url = payload.get("url") if isinstance(payload, dict) else None
        if (isinstance(url, str) and len(url) <= MAX_ADVERTISED_URL
                and url.startswith(("http://", "https://"))):
            self.state.urls[server_id] = url
        else:
            self.state.urls.pop(server_id, None)

    def _seen(self, server_id: str) -> None:
        self.state.touch(server_id)
        if server_id in self._dead:  # recovery is logged as soon as it is known
            self._dead.discard(server_id)
            logger.info("mesh: peer recovered: {}", server_id)

    async def _monitor_loop(self, tick_s: float) -> None:
        while True:
            await asyncio.sleep(tick_s)
            self.check_liveness()

    def check_liveness(self) -> None:
        """Log transitions between alive and dead since the previous check."""
        now = time.monotonic()
        for server_id in list(self.state.last_seen):
            dead = self.state.is_dead(server_id, now)
            if dead and server_id not in self._dead:
                self._dead.add(server_id)
                silent_ms = int((now - self.state.last_seen[server_id]) * 1000)
                logger.warning("mesh: peer down: {} (silent for {} ms)", server_id, silent_ms)
            elif not dead and server_id in self._dead:
                self._dead.discard(server_id)
                logger.info("mesh: peer recovered: {}", server_id)
