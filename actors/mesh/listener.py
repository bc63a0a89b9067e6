"""The receiving half of the mesh: accepted (inbound) connections only.

Every accepted connection must open with a HELLO that verifies (§3.4); after
that each frame is trusted and handed to `on_frame`. The listener never
writes a byte on an accepted connection: the dialler learns nothing from it,
not even a rejection. Liveness (the last time any frame arrived, keyed by the
HELLO's server_id) is informational only.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from actors.mesh.frames import (
    HELLO,
    HINT_TYPES,
    FrameError,
    decode_payload,
    read_frame,
    verify_hello,
)
from actors.runtime import AsyncioActor

__all__ = ["ListenerState", "MeshListener", "OnFrame"]

OnFrame = Callable[[int, dict[str, Any], str], "Awaitable[Any] | Any"]

# A HELLO is ~150 bytes; before the handshake nobody is trusted with more.
MAX_HELLO_LENGTH = 64 * 1024
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
MIN_MONITOR_TICK_MS = 250


class ListenerState:
    """Counters and the liveness map, readable synchronously by the owner of the mesh."""

    def __init__(self, dead_threshold_ms: int) -> None:
        self.dead_threshold_ms = dead_threshold_ms
        self.messages_received = 0
        self.handshake_failures = 0
        self.inbound_connections = 0  # currently open accepted connections
        self.last_seen: dict[str, float] = {}  # server_id -> time.monotonic()

    def touch(self, server_id: str) -> None:
        self.last_seen[server_id] = time.monotonic()

    def is_dead(self, server_id: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return (now - self.last_seen[server_id]) * 1000 > self.dead_threshold_ms

    def liveness(self) -> tuple[int, int]:
        """(servers_alive, servers_dead) among the server_ids ever seen."""
        now = time.monotonic()
        dead = sum(1 for sid in self.last_seen if self.is_dead(sid, now))
        return len(self.last_seen) - dead, dead

    def stats(self) -> dict[str, int]:
        alive, dead = self.liveness()
        return {
            "servers_alive": alive,
            "servers_dead": dead,
            "messages_received": self.messages_received,
            "handshake_failures": self.handshake_failures,
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
        state: ListenerState | None = None,
    ) -> None:
        super().__init__()
        self._on_frame = on_frame
        self._secret = secret
        self._handshake_timeout_s = handshake_timeout_s
        self.state = state or ListenerState(dead_threshold_ms)
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
        self._server = await asyncio.start_server(self._accept, host, port)
        bound = self._server.sockets[0].getsockname()[1]
        tick_ms = max(self.state.dead_threshold_ms / 2, MIN_MONITOR_TICK_MS)
        self._monitor = asyncio.get_running_loop().create_task(
            self._monitor_loop(tick_ms / 1000), name="mesh-liveness"
        )
        return bound

    def stats(self) -> dict[str, int]:
        return self.state.stats()

    async def on_stop(self) -> None:
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
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        self.state.inbound_connections += 1
        try:
            server_id = await self._handshake(reader, peer)
            if server_id is None:
                return
            logger.debug(f"mesh: accepted connection from {server_id} at {peer}")
            await self._receive(reader, server_id, peer)
        finally:
            self.state.inbound_connections -= 1
            # Closing only; nothing is ever written on an accepted connection.
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, peer: Any) -> str | None:
        reason = None
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                frame_type, raw = await read_frame(reader, MAX_HELLO_LENGTH)
        except TimeoutError:
            reason = "no HELLO before the handshake timeout"
        except FrameError as exc:
            if exc.clean_eof:
                return None  # connected and closed without a byte (probe)
            reason = str(exc)
        except OSError as exc:
            reason = f"connection error: {exc}"
        else:
            if frame_type != HELLO:
                reason = f"first frame has type {frame_type}, not HELLO"
            else:
                server_id = verify_hello(decode_payload(raw), self._secret)
                if server_id is not None:
                    self._seen(server_id)
                    return server_id
                reason = "HELLO rejected (bad fields or mac)"
        self.state.handshake_failures += 1
        logger.warning(f"mesh: handshake failed from {peer}: {reason}")
        return None

    async def _receive(self, reader: asyncio.StreamReader, server_id: str, peer: Any) -> None:
        while True:
            try:
                frame_type, raw = await read_frame(reader)
            except FrameError as exc:
                if not exc.clean_eof:
                    logger.warning(f"mesh: closing connection from {server_id} ({peer}): {exc}")
                return
            except OSError as exc:
                logger.debug(f"mesh: connection from {server_id} ({peer}) lost: {exc}")
                return
            self._seen(server_id)
            if frame_type not in HINT_TYPES:
                continue  # HEARTBEAT/HELLO (liveness only) or an unknown type
            payload = decode_payload(raw)
            if payload is None:
                logger.debug(f"mesh: ignoring malformed frame type {frame_type} from {server_id}")
                continue
            self.state.messages_received += 1
            try:
                result = self._on_frame(frame_type, payload, server_id)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001
                logger.exception(f"mesh: handler failed for frame type {frame_type}")

    # --- liveness ----------------------------------------------------------

    def _seen(self, server_id: str) -> None:
        self.state.touch(server_id)
        if server_id in self._dead:  # recovery is logged as soon as it is known
            self._dead.discard(server_id)
            logger.info(f"mesh: peer recovered: {server_id}")

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
                logger.warning(f"mesh: peer down: {server_id} (silent for {silent_ms} ms)")
            elif not dead and server_id in self._dead:
                self._dead.discard(server_id)
                logger.info(f"mesh: peer recovered: {server_id}")
