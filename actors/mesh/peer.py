"""The sending half of the mesh: one dialled (outbound) connection per peer.

Frames reach a peer through a bounded queue (`PeerLink`) that the
broadcaster fills synchronously; the `MeshPeer` actor owns the dial loop
that drains it. Loss is designed in (docs/behaviour.md §3.1): a full queue or a disconnected
peer drops the frame and counts it; frames still queued when a connection
ends are discarded before the next connection is marked connected, so stale
wakes or maintenance flips are never replayed.

The queue holds (type, JSON payload) pairs; the dialler seals each one as it
writes it, with the next sequence number of the current connection under the
key its own HELLO fixed (handshake.py, frames.py).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from typing import Any

from loguru import logger

from actors.mesh.frames import HEARTBEAT, HELLO, Sealer, encode, encode_payload
from actors.mesh.handshake import connection_key, hello_of, make_hello
from actors.runtime import AsyncioActor

__all__ = ["SEND_QUEUE_SIZE", "MeshPeer", "PeerLink", "reconnect_delay_ms"]

SEND_QUEUE_SIZE = 1024
BACKOFF_INITIAL_MS = 250
BACKOFF_MAX_MS = 5000
CONNECT_TIMEOUT_S = 5.0
DEFAULT_STALL_TIMEOUT_MS = 10_000


def reconnect_delay_ms(failures: int) -> int:
    """Sleep before the next dial after `failures` consecutive failures (>= 1).

    250, 500, 1000, 2000, 4000, 5000, 5000, ... A connection that was
    established and then lost counts as the first failure (250 ms again).
    """
    if failures <= 1:
        return BACKOFF_INITIAL_MS
    if failures > 6:  # avoids huge powers for a peer that is down for days
        return BACKOFF_MAX_MS
    return min(BACKOFF_INITIAL_MS << (failures - 1), BACKOFF_MAX_MS)


class PeerLink:
    """A peer's bounded send queue and counters, shared by the broadcaster and the dialler.

    Everything here is synchronous and runs on the event loop; `offer()` never
    blocks and never grows the queue past `capacity`.
    """

    def __init__(self, host: str, port: int, capacity: int = SEND_QUEUE_SIZE) -> None:
        self.host = host
        self.port = port
        self.capacity = capacity
        self.queue: deque[tuple[int, bytes]] = deque()  # (type, JSON payload)
        self.ready = asyncio.Event()  # set while the queue is non-empty
        self.connected = False
        self.resolved_ip: str | None = None
        self.sent = 0  # frames written (HELLO and HEARTBEAT not counted)
        self.dropped = 0  # offered while down or full, or discarded on reconnect
        self.failures = 0  # consecutive failed dials or lost connections
        self.recent_delays_ms: deque[int] = deque(maxlen=16)

    def offer(self, frame_type: int, body: bytes) -> bool:
        """Queue a frame (type, JSON payload); False (and counted as dropped) when down or full."""
        if not self.connected or len(self.queue) >= self.capacity:
            self.dropped += 1
            return False
        self.queue.append((frame_type, body))
        self.ready.set()
        return True

    def take_all(self) -> list[tuple[int, bytes]]:
        frames = list(self.queue)
        self.queue.clear()
        self.ready.clear()
        return frames

    def discard_queued(self) -> int:
        n = len(self.take_all())
        self.dropped += n
        return n

    def stats(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "connected": self.connected,
            "resolved_ip": self.resolved_ip if self.connected else None,
            "sent": self.sent,
            "dropped": self.dropped,
            "queued": len(self.queue),
        }


class _ConnectionLost(Exception):
    pass


class MeshPeer(AsyncioActor):
    """Dials one peer forever, sending HELLO, then queued frames and heartbeats.

    Never reads from the connection except to notice that it closed.
    `stall_timeout_ms`: a write that cannot drain for this long ends the
    connection (a peer that stopped reading, or a silent network partition).
    """

    def __init__(
        self,
        link: PeerLink,
        *,
        server_id: str,
        secret: str,
        heartbeat_ms: int,
        stall_timeout_ms: int = DEFAULT_STALL_TIMEOUT_MS,
        tls: ssl.SSLContext | None = None,
        advertise_url: str | None = None,
    ) -> None:
        super().__init__()
        self.link = link
        self._server_id = server_id
        self._advertise_url = advertise_url
        self._secret = secret
        self._heartbeat_s = heartbeat_ms / 1000
        self._stall_timeout_s = stall_timeout_ms / 1000
        self._tls = tls
        self._task: asyncio.Task[None] | None = None

    def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._dial_loop(), name=f"mesh-peer-{self.link.host}:{self.link.port}"
        )

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.link.connected = False
        self.link.resolved_ip = None

    def offer(self, frame_type: int, body: bytes) -> bool:
        """Through the actor inbox; the broadcaster calls `link.offer` directly."""
        return self.link.offer(frame_type, body)

    def stats(self) -> dict[str, Any]:
        return self.link.stats()

    # --- dial loop ---------------------------------------------------------

    async def _dial_loop(self) -> None:
        link = self.link
        was_up = True  # the first failure logs at INFO, repeats at DEBUG
        while True:
            try:
                # A hostname is resolved again on every attempt.
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    reader, writer = await asyncio.open_connection(
                        link.host, link.port, ssl=self._tls,
                        server_hostname=link.host if self._tls is not None else None)
            except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
                log = logger.info if was_up else logger.debug
                log("mesh: cannot connect to peer {}:{}: {!r}", link.host, link.port, exc)
                was_up = False
            else:
                link.failures = 0
                was_up = True
                await self._run_connection(reader, writer)
            link.failures += 1
            delay = reconnect_delay_ms(link.failures)
            link.recent_delays_ms.append(delay)
            await asyncio.sleep(delay / 1000)

    async def _run_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        link = self.link
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peername = writer.get_extra_info("peername")
            # Stale frames go before the peer counts as connected: nothing
            # queued during an earlier connection is ever delivered on this one.
            link.discard_queued()
            hello = make_hello(self._server_id, self._secret)
            sealer = Sealer(connection_key(self._secret, hello_of(hello)))
            writer.write(encode(HELLO, hello))
            link.resolved_ip = peername[0] if peername else None
            link.connected = True
            logger.info("mesh: connected to peer {}:{} ({})", link.host, link.port,
                        link.resolved_ip)
            await self._drain(writer)
            await self._stream(reader, writer, sealer)
        except (OSError, _ConnectionLost, TimeoutError) as exc:
            logger.info("mesh: connection to peer {}:{} lost: {!r}", link.host, link.port, exc)
        finally:
            link.connected = False
            link.resolved_ip = None
            writer.close()

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._stall_timeout_s):
                await writer.drain()
        except TimeoutError:
            msg = f"writes stalled for {self._stall_timeout_s:g} s"
            raise _ConnectionLost(msg) from None

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sealer: Sealer
    ) -> None:
        link = self.link
        loop = asyncio.get_running_loop()
        # A heartbeat also says where this broker's HTTP API is (its peers forward an
        # ephemeral queue's requests to the queue's owner there).
        heartbeat = encode_payload({"server_id": self._server_id, "url": self._advertise_url}
                                   if self._advertise_url else {"server_id": self._server_id})
        # The first heartbeat tick is skipped: HELLO was just written.
        next_heartbeat = loop.time() + self._heartbeat_s
        eof = loop.create_task(reader.read(4096))
        ready: asyncio.Task[Any] | None = None
        try:
            while True:
                timeout = next_heartbeat - loop.time()
                if timeout <= 0:
                    writer.write(sealer.seal(HEARTBEAT, heartbeat))
                    next_heartbeat = loop.time() + self._heartbeat_s
                    await self._drain(writer)
                    continue
                if not link.ready.is_set():
                    ready = loop.create_task(link.ready.wait())
                    done, _ = await asyncio.wait(
                        {ready, eof}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                    ready.cancel()
                    if eof in done:
                        if eof.exception() is not None or not eof.result():
                            msg = "peer closed the connection"
                            raise _ConnectionLost(msg)
                        # The listener never writes; ignore anything it did send.
                        eof = loop.create_task(reader.read(4096))
                    continue
                frames = link.take_all()
                writer.write(b"".join(sealer.seal(t, body) for t, body in frames))
                link.sent += len(frames)
                await self._drain(writer)
        finally:
            if eof.done():
                if not eof.cancelled():
                    eof.exception()  # retrieved: a reset is reported by the write side
            else:
                eof.cancel()
            if ready is not None:
                ready.cancel()
