"""The framed-TCP mesh between broker replicas (behaviour.md §3.1–§3.6).

Best-effort hints only: pop wakes, hot-list dirty marks, maintenance flips
and queue-config invalidations. The topology is asymmetric: every node
listens (`MeshListener`, receive-only) and dials every configured peer
(`MeshPeer`, send-only), so each pair of brokers shares exactly two TCP
connections, each used one way.

This package knows nothing of HTTP or the database; the broker gives the
mesh an `on_frame(type, payload, sender_server_id)` callback and calls
`broadcast()`.

    mesh = Mesh(server_id="queen-a", port=6633, peers=[("queen-b", 6633)],
                secret=secret, heartbeat_ms=1000, dead_threshold_ms=5000,
                on_frame=handle)
    await mesh.start()          # False: bind failed, sending still works
    mesh.broadcast(MESSAGE_AVAILABLE_BATCH, {"items": [...]})
    mesh.stats()
    await mesh.stop()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loguru import logger
from pykka import ActorRef

from actors.mesh.frames import (
    HEARTBEAT,
    HELLO,
    HOTLIST_DIRTY_BATCH,
    MAINTENANCE_MODE_SET,
    MESSAGE_AVAILABLE,
    MESSAGE_AVAILABLE_BATCH,
    POP_MAINTENANCE_MODE_SET,
    QUEUE_CONFIG_DELETE,
    QUEUE_CONFIG_SET,
    FrameError,
    encode,
)
from actors.mesh.listener import ListenerState, MeshListener, OnFrame
from actors.mesh.peer import MeshPeer, PeerLink, reconnect_delay_ms

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
    "PeerLink",
    "reconnect_delay_ms",
]


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
        bind_host: str = "0.0.0.0",  # noqa: S104 - the mesh must be firewalled (seed-ha.md)
        *,
        handshake_timeout_s: float | None = None,
    ) -> None:
        self.server_id = server_id
        self.port = port
        self.bind_host = bind_host
        self._secret = secret
        self._heartbeat_ms = heartbeat_ms
        self._dead_threshold_ms = dead_threshold_ms
        self._on_frame = on_frame
        self._handshake_timeout_s = handshake_timeout_s
        self.links = [PeerLink(host, port) for host, port in peers]
        self.listener_state = ListenerState(dead_threshold_ms)
        self._listener: ActorRef[MeshListener] | None = None
        self._peers: list[ActorRef[MeshPeer]] = []
        self.listening = False
        self.broadcasts = 0

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
            state=self.listener_state,
            **kwargs,
        )
        try:
            self.port = await listener.proxy().start_serving(self.bind_host, self.port)
        except OSError as exc:
            logger.warning(
                f"TCP mesh bind failed on {self.bind_host}:{self.port}: {exc} "
                "(continuing with local waker only)"
            )
            await listener.stop(block=False)
        else:
            self._listener = listener
            self.listening = True
        # Writes stalled for longer than a peer may stay silent end the connection.
        stall_ms = max(self._dead_threshold_ms, 2 * self._heartbeat_ms)
        self._peers = [
            MeshPeer.start(
                link,
                server_id=self.server_id,
                secret=self._secret,
                heartbeat_ms=self._heartbeat_ms,
                stall_timeout_ms=stall_ms,
            )
            for link in self.links
        ]
        logger.info(
            f"mesh started: server_id={self.server_id} port={self.port} "
            f"peers={len(self.links)} auth={'hmac' if self._secret else 'off'}"
        )
        return self.listening

    def broadcast(self, frame_type: int, payload: Any = None) -> int:
        """Offer one frame to every peer; returns how many peers queued it.

        Never blocks and never raises: a full or disconnected peer drops the
        frame (counted in its `dropped`), an unencodable payload is logged.
        """
        try:
            frame = encode(frame_type, payload)
        except (TypeError, ValueError) as exc:
            logger.error(f"mesh: cannot encode frame type {frame_type}: {exc}")
            return 0
        self.broadcasts += 1
        return sum(link.offer(frame) for link in self.links)

    def stats(self) -> dict[str, Any]:
        """The mesh stats object of behaviour.md §3.6.

        `messages_sent`: frames written to peers (one per peer per broadcast,
        HELLO and HEARTBEAT excluded); `messages_dropped`: frames offered to a
        full or disconnected peer, or discarded on reconnect;
        `messages_received`: frames dispatched to `on_frame`.
        """
        state = self.listener_state
        alive, dead = state.liveness()
        return {
            "server_id": self.server_id,
            "transport": "tcp-mesh",
            "port": self.port,
            "peer_count": len(self.links),
            "peers": [
                {
                    "host": link.host,
                    "port": link.port,
                    "connected": link.connected,
                    "resolved": link.connected,
                    "resolved_ip": link.resolved_ip if link.connected else None,
                }
                for link in self.links
            ],
            "servers_alive": alive,
            "servers_dead": dead,
            "messages_sent": sum(link.sent for link in self.links),
            "messages_received": state.messages_received,
            "messages_dropped": sum(link.dropped for link in self.links),
            "handshake_failures": state.handshake_failures,
            "signature_failures": state.handshake_failures,
            "sequence_rejections": 0,
        }

    async def stop(self) -> None:
        peers, self._peers = self._peers, []
        for ref in peers:
            await ref.stop(block=False)
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.stop(block=False)
        self.listening = False
