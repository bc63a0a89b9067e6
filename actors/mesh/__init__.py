"""The framed-TCP mesh between broker replicas (docs/behaviour.md §3.1–§3.6).

Best-effort hints only: pop wakes, hot-list dirty marks, maintenance flips
and queue-config invalidations. The topology is asymmetric: every node
listens (`MeshListener`, receive-only) and dials every configured peer
(`MeshPeer`, send-only), so each pair of brokers shares exactly two TCP
connections, each used one way.

Every connection opens with a HELLO that cannot be replayed and carries
only sealed frames after it (handshake.py, frames.py); optionally all of it
inside mutual TLS (tls.py). Every resource an unauthenticated client can
hold is bounded (listener.py). One dialled connection per peer is an actor
with a bounded queue and the heartbeat (peer.py); wakes received from peers
are coalesced per queue before they wake anything (wake_gate.py).

This package knows nothing of HTTP or the database; the broker gives the
mesh an `on_frame(type, payload, sender_server_id)` callback and calls
`broadcast()`.

    mesh = Mesh(server_id="queen-a", port=6633, peers=[("queen-b", 6633)],
                secret=secret, heartbeat_ms=1000, dead_threshold_ms=5000,
                on_frame=handle, bind_host="10.0.0.5")
    await mesh.start()          # False: bind failed, sending still works
    mesh.broadcast(MESSAGE_AVAILABLE_BATCH, {"items": [...]})
    mesh.stats()
    await mesh.stop()
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from loguru import logger
from pykka import ActorRef

from actors.mesh.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    HEARTBEAT,
    HELLO,
    HOTLIST_DIRTY_BATCH,
    MAINTENANCE_MODE_SET,
    MESSAGE_AVAILABLE,
    MESSAGE_AVAILABLE_BATCH,
    POP_MAINTENANCE_MODE_SET,
    QUEUE_CONFIG_DELETE,
    QUEUE_CONFIG_SET,
    SEALED_OVERHEAD,
    FrameError,
    encode_payload,
)
from actors.mesh.handshake import DEFAULT_MAX_SKEW_MS
from actors.mesh.listener import REJECTION_REASONS, ListenerState, MeshListener, OnFrame
from actors.mesh.peer import MeshPeer, PeerLink, reconnect_delay_ms
from actors.mesh.tls import MeshTLS

__all__ = [
    "HEARTBEAT",
    "HELLO",
    "HOTLIST_DIRTY_BATCH",
    "MAINTENANCE_MODE_SET",
    "MESSAGE_AVAILABLE",
    "MESSAGE_AVAILABLE_BATCH",
    "POP_MAINTENANCE_MODE_SET",
    "QUEUE_CONFIG_DELETE",
    "QUEUE_CONFIG_SET",
    "FrameError",
    "Mesh",
    "MeshListener",
    "MeshPeer",
    "MeshTLS",
    "PeerLink",
    "REJECTION_REASONS",
    "reconnect_delay_ms",
]


# With peers and no secret anyone who can reach the port speaks for a peer:
# said at start and again this often, so it is not forgotten in the logs.
OPEN_MODE_WARNING_INTERVAL_S = 300.0


def default_max_connections(peer_count: int) -> int:
    """Accepted connections allowed at once: one per peer normally, a few more
    while a peer's old connection has not yet been noticed dead."""
    return 4 * peer_count + 4


class Mesh:
    """One broker's end of the mesh: a listener plus one dialler per peer."""

    def __init__(
        self,
        server_id: str,
        port: int,
        peers: Iterable[tuple[str, int]],
        secret: str,
        heartbeat_ms: int,
        dead_threshold_ms: int,
        on_frame: OnFrame,
        bind_host: str = "127.0.0.1",
        *,
        handshake_timeout_s: float | None = None,
        max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_connections: int | None = None,
        tls: MeshTLS | None = None,
        advertise_url: str | None = None,
    ) -> None:
        self.server_id = server_id
        self.advertise_url = advertise_url
        self.port = port
        self.bind_host = bind_host
        self._secret = secret
        self._heartbeat_ms = heartbeat_ms
        self._dead_threshold_ms = dead_threshold_ms
        self._on_frame = on_frame
        self._handshake_timeout_s = handshake_timeout_s
        self._max_skew_ms = max_skew_ms
        self.max_frame_bytes = max_frame_bytes
        self.links = [PeerLink(host, port) for host, port in peers]
        self.max_connections = (default_max_connections(len(self.links))
                                if max_connections is None else max_connections)
        self._tls = tls
        self.listener_state = ListenerState(dead_threshold_ms)
        self._listener: ActorRef[MeshListener] | None = None
        self._peers: list[ActorRef[MeshPeer]] = []
        self._open_mode_warner: asyncio.Task[None] | None = None
        self.listening = False
        self.broadcasts = 0
        self.oversize_dropped = 0  # broadcasts too large for a frame

    @property
    def auth(self) -> str:
        return "hmac" if self._secret else "off"

    async def start(self) -> bool:
        """Start listening and dialling. False when the port could not be bound.

        The peers are dialled either way: a node without a listener can still
        send its hints, it only misses everyone else's.
        """
        kwargs: dict[str, Any] = {}
        if self._handshake_timeout_s is not None:
            kwargs["handshake_timeout_s"] = self._handshake_timeout_s
        listener = MeshListener.start(
            self._on_frame,
            secret=self._secret,
            dead_threshold_ms=self._dead_threshold_ms,
            max_skew_ms=self._max_skew_ms,
            max_frame_bytes=self.max_frame_bytes,
            max_connections=self.max_connections,
            tls=self._tls.server_context() if self._tls is not None else None,
            state=self.listener_state,
            **kwargs,
        )
        try:
            self.port = await listener.proxy().start_serving(self.bind_host, self.port)
        except OSError as exc:
            logger.warning("TCP mesh bind failed on {}:{}: {} (continuing with local waker only)",
                           self.bind_host, self.port, exc)
            await listener.stop(block=False)
        else:
            self._listener = listener
            self.listening = True
        # Writes stalled for longer than a peer may stay silent end the connection.
        stall_ms = max(self._dead_threshold_ms, 2 * self._heartbeat_ms)
        client_tls = self._tls.client_context() if self._tls is not None else None
        self._peers = [
            MeshPeer.start(
                link,
                server_id=self.server_id,
                secret=self._secret,
                heartbeat_ms=self._heartbeat_ms,
                stall_timeout_ms=stall_ms,
                tls=client_tls,
                advertise_url=self.advertise_url,
            )
            for link in self.links
        ]
        logger.info("mesh started: server_id={} host={} port={} peers={} auth={} tls={}",
                    self.server_id, self.bind_host, self.port, len(self.links), self.auth,
                    "on" if self._tls is not None else "off")
        if not self._secret and self.links:
            self._warn_open_mode()
            self._open_mode_warner = asyncio.get_running_loop().create_task(
                self._repeat_open_mode_warning(), name="mesh-open-mode-warning")
        return self.listening

    def _warn_open_mode(self) -> None:
        logger.warning("mesh: QUEEN_SYNC_SECRET is empty: the mesh on {}:{} is unauthenticated; "
                       "anyone who can reach it can send hints, including maintenance flips "
                       "(set QUEEN_SYNC_SECRET, or QUEEN_MESH_REQUIRE_SECRET=true to refuse "
                       "to start like this)", self.bind_host, self.port)

    async def _repeat_open_mode_warning(self) -> None:
        while True:
            await asyncio.sleep(OPEN_MODE_WARNING_INTERVAL_S)
            self._warn_open_mode()

    def broadcast(self, frame_type: int, payload: Any = None) -> int:
        """Offer one frame to every peer; returns how many peers queued it.

        Never blocks and never raises: a full or disconnected peer drops the
        frame (counted in its `dropped`); an unencodable payload, or one too
        large for a frame, is logged and dropped.
        """
        try:
            body = encode_payload(payload)
        except (TypeError, ValueError) as exc:
            logger.error("mesh: cannot encode frame type {}: {}", frame_type, exc)
            return 0
        if not 0 <= frame_type <= 0xFF:
            logger.error("mesh: frame type out of range: {}", frame_type)
            return 0
        if SEALED_OVERHEAD + len(body) > self.max_frame_bytes:
            self.oversize_dropped += 1
            logger.error("mesh: frame type {} of {} bytes exceeds QUEEN_MESH_MAX_FRAME_BYTES={}; "
                         "dropped", frame_type, len(body), self.max_frame_bytes)
            return 0
        self.broadcasts += 1
        return sum(link.offer(frame_type, body) for link in self.links)

    def members(self) -> dict[str, str | None]:
        """The brokers alive now, by server id, with the HTTP API each advertises: this one
        (None: serve here) and every peer whose heartbeats arrive and carry a URL."""
        found: dict[str, str | None] = dict(self.listener_state.alive_urls())
        found[self.server_id] = None
        return found

    def stats(self) -> dict[str, Any]:
        """The mesh stats object of docs/behaviour.md §3.6, plus the authentication figures.

        `messages_sent`: frames written to peers (one per peer per broadcast,
        HELLO and HEARTBEAT excluded); `messages_dropped`: frames offered to a
        full or disconnected peer, or discarded on reconnect;
        `messages_received`: frames dispatched to `on_frame`;
        `handshake_failures`: accepted connections closed before a HELLO was
        accepted; `signature_failures`: HELLOs and frames whose MAC did not
        verify; `sequence_rejections`: frames that verified but came out of
        order (replayed or reordered); `rejections`: every closed
        connection by reason.
        """
        state = self.listener_state
        alive, dead = state.liveness()
        return {
            "server_id": self.server_id,
            "transport": "tcp-mesh",
            "host": self.bind_host,
            "port": self.port,
            "auth": self.auth,
            "tls": self._tls is not None,
            "peer_count": len(self.links),
            "peers": [
                {
                    "host": link.host,
                    "port": link.port,
                    "connected": link.connected,
                    "resolved_ip": link.resolved_ip if link.connected else None,
                }
                for link in self.links
            ],
            "servers_alive": alive,
            "servers_dead": dead,
            # the brokers alive now and their advertised HTTP API (ephemeral queues' owners)
            "members": sorted(({"serverId": sid, "url": url or self.advertise_url}
                               for sid, url in self.members().items()),
                              key=lambda m: str(m["serverId"])),
            "messages_sent": sum(link.sent for link in self.links),
            "messages_received": state.messages_received,
            "messages_dropped": sum(link.dropped for link in self.links),
            "messages_too_large": self.oversize_dropped,
            "inbound_connections": state.inbound_connections,
            "max_connections": self.max_connections,
            "max_frame_bytes": self.max_frame_bytes,
            "handshake_failures": state.handshake_failures,
            "signature_failures": state.rejections["bad_mac"],
            "sequence_rejections": state.rejections["sequence"],
            "rejections": dict(state.rejections),
        }

    async def stop(self) -> None:
        if self._open_mode_warner is not None:
            self._open_mode_warner.cancel()
            await asyncio.gather(self._open_mode_warner, return_exceptions=True)
            self._open_mode_warner = None
        peers, self._peers = self._peers, []
        for ref in peers:
            await ref.stop(block=False)
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.stop(block=False)
        self.listening = False
