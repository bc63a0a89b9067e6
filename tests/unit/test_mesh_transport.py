"""The mesh transport over real sockets on 127.0.0.1 (actors/mesh).

docs/behaviour.md §3.1–§3.6, §14 invariants 2–12, 14 (transport level), 15, 16, 19.
Peers that misbehave are raw asyncio sockets speaking the codec by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

import psutil
import pytest
from loguru import logger

from actors.mesh import Mesh
from actors.mesh.frames import (
    HEARTBEAT,
    HELLO,
    MAINTENANCE_MODE_SET,
    MESSAGE_AVAILABLE,
    MESSAGE_AVAILABLE_BATCH,
    QUEUE_CONFIG_SET,
    FrameError,
    Opener,
    Sealer,
    decode_payload,
    encode,
    encode_payload,
    read_frame,
)
from actors.mesh.handshake import connection_key, hello_of, make_hello
from actors.mesh.listener import ListenerState, MeshListener
from actors.mesh.peer import SEND_QUEUE_SIZE, MeshPeer, PeerLink, reconnect_delay_ms
from tests.ports import free_port
from tests.waiting import wait_until_async

SECRET = "test-secret"
HOST = "127.0.0.1"


class Recorder:
    """An on_frame callback that keeps what it was given."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, dict, str]] = []

    def __call__(self, frame_type: int, payload: dict, sender: str) -> None:
        self.frames.append((frame_type, payload, sender))

    def payloads(self) -> list[dict]:
        return [payload for _, payload, _ in self.frames]


@pytest.fixture
def logs():
    messages: list[str] = []
    handler = logger.add(messages.append, level="DEBUG", format="{level} {message}")
    yield messages
    logger.remove(handler)


@contextlib.asynccontextmanager
async def listener(secret=SECRET, dead_threshold_ms=5000, port=0, **kwargs):
    recorder = Recorder()
    state = ListenerState(dead_threshold_ms)
    ref = MeshListener.start(recorder, secret=secret, dead_threshold_ms=dead_threshold_ms,
                             state=state, **kwargs)
    try:
        bound = await ref.proxy().start_serving(HOST, port)
        yield bound, state, recorder, ref
    finally:
        await ref.stop(block=False)


@contextlib.asynccontextmanager
async def mesh(server_id, port=0, peers=(), on_frame=None, secret=SECRET, **kwargs):
    recorder = on_frame or Recorder()
    options = {"heartbeat_ms": 100, "dead_threshold_ms": 1000, **kwargs}
    m = Mesh(server_id, port, list(peers), secret, on_frame=recorder, bind_host=HOST, **options)
    try:
        yield m, await m.start(), recorder
    finally:
        await m.stop()


async def connect(port: int):
    return await asyncio.open_connection(HOST, port)


async def assert_closed_without_bytes(reader: asyncio.StreamReader, timeout: float = 5.0):
    """The far end closed, and never sent us a single byte."""
    data = await asyncio.wait_for(reader.read(), timeout)
    assert data == b""


def hello(server_id="raw", secret=SECRET) -> bytes:
    return encode(HELLO, make_hello(server_id, secret))


class RawPeer:
    """A hand-driven dialler: a HELLO and frames sealed under its key."""

    def __init__(self, server_id="raw", secret=SECRET) -> None:
        payload = make_hello(server_id, secret)
        self.hello = encode(HELLO, payload)
        self.sealer = Sealer(connection_key(secret, hello_of(payload)))

    def frame(self, frame_type: int, payload=None) -> bytes:
        return self.sealer.seal(frame_type, encode_payload(payload))

    def raw(self, frame_type: int, body: bytes) -> bytes:
        return self.sealer.seal(frame_type, body)


# --- backoff schedule (invariant 12) ------------------------------------------


def test_reconnect_delays():
    assert [reconnect_delay_ms(n) for n in range(1, 10)] == [
        250, 500, 1000, 2000, 4000, 5000, 5000, 5000, 5000]
    assert reconnect_delay_ms(0) == 250
    assert reconnect_delay_ms(10_000) == 5000


async def test_backoff_grows_then_resets_after_a_connection():
    port = free_port()
    link = PeerLink(HOST, port)
    ref = MeshPeer.start(link, server_id="a", secret=SECRET, heartbeat_ms=100)
    try:
        await wait_until_async(lambda: len(link.recent_delays_ms) >= 2)
        assert list(link.recent_delays_ms)[:2] == [250, 500]
        async with listener(port=port) as (_, state, _, _):
            await wait_until_async(lambda: link.connected, timeout=8)
            assert link.failures == 0
            before = len(link.recent_delays_ms)
        # The listener stopped and closed the connection: back to 250 ms.
        await wait_until_async(lambda: len(link.recent_delays_ms) > before)
        assert link.recent_delays_ms[before] == 250
        assert not link.connected
    finally:
        await ref.stop(block=False)


# --- a pair of brokers (invariants 8, 9) ----------------------------------------


async def test_pair_has_exactly_two_one_way_connections():
    port_a, port_b = free_port(), free_port()
    async with (
        mesh("queen-a", port_a, [(HOST, port_b)]) as (a, a_bound, a_rec),
        mesh("queen-b", port_b, [(HOST, port_a)]) as (b, b_bound, b_rec),
    ):
        assert a_bound and b_bound
        await wait_until_async(lambda: a.stats()["peers"][0]["connected"]
                         and b.stats()["peers"][0]["connected"])
        await wait_until_async(lambda: a.listener_state.inbound_connections == 1
                         and b.listener_state.inbound_connections == 1)

        established = [
            c for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr
            and {c.laddr.port, c.raddr.port} & {port_a, port_b}
        ]
        # Both ends of each connection live in this process: 2 connections, 4 sockets.
        accepted = [c for c in established if c.laddr.port in (port_a, port_b)]
        dialled = [c for c in established if c.raddr.port in (port_a, port_b)]
        assert len(accepted) == 2 and len(dialled) == 2
        assert len(established) == 4

        a.broadcast(MESSAGE_AVAILABLE, {"queue": "qa", "partition": "p"})
        b.broadcast(MESSAGE_AVAILABLE, {"queue": "qb", "partition": "p"})
        await wait_until_async(lambda: a_rec.frames and b_rec.frames)
        assert b_rec.frames == [(MESSAGE_AVAILABLE, {"queue": "qa", "partition": "p"}, "queen-a")]
        assert a_rec.frames == [(MESSAGE_AVAILABLE, {"queue": "qb", "partition": "p"}, "queen-b")]

        stats = a.stats()
        assert stats["transport"] == "tcp-mesh"
        assert stats["server_id"] == "queen-a"
        assert stats["port"] == port_a
        assert stats["peer_count"] == 1
        assert stats["peers"] == [{"host": HOST, "port": port_b, "connected": True,
                                   "resolved_ip": HOST}]
        assert stats["auth"] == "hmac" and stats["tls"] is False
        assert stats["servers_alive"] == 1 and stats["servers_dead"] == 0
        assert stats["messages_sent"] == 1 and stats["messages_received"] == 1
        assert stats["messages_dropped"] == 0
        assert stats["handshake_failures"] == stats["signature_failures"] == 0
        assert stats["sequence_rejections"] == 0
        assert set(stats["rejections"].values()) == {0}
        # Still two connections after some heartbeats: nobody redialled.
        await asyncio.sleep(0.3)
        assert a.listener_state.inbound_connections == 1
        assert b.listener_state.inbound_connections == 1


async def test_listener_never_writes_on_an_accepted_connection():
    async with listener() as (port, state, recorder, _):
        reader, writer = await connect(port)
        raw = RawPeer()
        writer.write(raw.hello + raw.frame(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"})
                     + raw.frame(HEARTBEAT, {"server_id": "raw"}))
        await writer.drain()
        await wait_until_async(lambda: recorder.frames)
        writer.write_eof()
        await assert_closed_without_bytes(reader)
        writer.close()
        assert recorder.frames == [(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"}, "raw")]
        assert state.messages_received == 1
        assert state.handshake_failures == 0


# --- hostile and broken clients (invariants 2–7, 19) -------------------------------


HOSTILE = {
    "huge_length": b"\xff\xff\xff\xff",
    "zero_length": b"\x00\x00\x00\x00",
    "truncated_prefix": b"\x00\x00",
    "truncated_payload": hello()[:-5],
    "not_hello_first": encode(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"}),
    "heartbeat_first": encode(HEARTBEAT, {"server_id": "raw"}),
    "wrong_mac": encode(HELLO, make_hello("raw", "another-secret")),
    "garbage_hello": b"\x00\x00\x00\x05\x04{{{{",
    "missing_server_id": encode(HELLO, {"nonce": "00", "mac": "00"}),
    "oversized_hello": encode(HELLO, {"server_id": "x" * 100_000}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_first_frame_is_rejected_silently(name):
    async with listener() as (port, state, recorder, _):
        reader, writer = await connect(port)
        writer.write(HOSTILE[name])
        await writer.drain()
        if name.startswith("truncated"):
            writer.write_eof()  # the stream ends mid-frame
        # Closed promptly, without a byte written back.
        try:
            await assert_closed_without_bytes(reader)
        except ConnectionResetError:
            # Closing with unread input (the oversized HELLO) resets instead of
            # FIN; still nothing was ever sent to us.
            assert name == "oversized_hello"
        writer.close()
        assert state.handshake_failures == 1
        assert state.messages_received == 0
        assert recorder.frames == []
        assert state.last_seen == {}

        # The listener keeps serving a legitimate peer afterwards.
        link = PeerLink(HOST, port)
        peer = MeshPeer.start(link, server_id="good", secret=SECRET, heartbeat_ms=100)
        try:
            await wait_until_async(lambda: link.connected)
            link.offer(MESSAGE_AVAILABLE, encode_payload({"queue": "q", "partition": "p"}))
            await wait_until_async(lambda: recorder.frames)
            assert recorder.frames[0][2] == "good"
            assert state.handshake_failures == 1
        finally:
            await peer.stop(block=False)


async def test_handshake_timeout():
    async with listener(handshake_timeout_s=0.2) as (port, state, _, _):
        reader, writer = await connect(port)
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.handshake_failures == 1


async def test_connect_and_close_without_bytes_is_not_a_failure():
    async with listener() as (port, state, _, _):
        reader, writer = await connect(port)
        writer.write_eof()
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.handshake_failures == 0


async def test_open_mode_runs_the_same_protocol_with_an_empty_key():
    async with listener(secret="") as (port, state, recorder, _):
        reader, writer = await connect(port)
        raw = RawPeer("anon", secret="")
        writer.write(raw.hello + raw.frame(QUEUE_CONFIG_SET, {"queue": "q"}))
        await wait_until_async(lambda: recorder.frames)
        assert recorder.frames == [(QUEUE_CONFIG_SET, {"queue": "q"}, "anon")]
        writer.close()

        reader, writer = await connect(port)
        writer.write(encode(HELLO, {**make_hello("anon", ""), "mac": "00" * 32}))
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.handshake_failures == 1
        assert state.rejections["bad_mac"] == 1


async def test_secret_mode_accepts_correct_mac_and_records_liveness():
    async with listener() as (port, state, _, _):
        reader, writer = await connect(port)
        writer.write(hello("queen-z"))
        await wait_until_async(lambda: "queen-z" in state.last_seen)
        assert state.liveness() == (1, 0)
        assert state.handshake_failures == 0
        writer.close()


async def test_bad_frames_after_handshake():
    """Malformed JSON and unknown types are skipped; a framing error closes."""
    async with listener() as (port, state, recorder, _):
        reader, writer = await connect(port)
        raw = RawPeer()
        writer.write(
            raw.hello
            + raw.raw(MESSAGE_AVAILABLE, b"{{{")                  # malformed JSON: ignored
            + raw.frame(MESSAGE_AVAILABLE, ["not", "an", "object"])  # not an object: ignored
            + raw.frame(99, {"queue": "q"})                        # unknown type: ignored
            + raw.frame(MESSAGE_AVAILABLE_BATCH, {"items": [{"queue": "q", "partition": "p"}]})
            + raw.frame(MAINTENANCE_MODE_SET, {"enabled": True})
        )
        await wait_until_async(lambda: len(recorder.frames) == 2)
        assert [t for t, _, _ in recorder.frames] == [MESSAGE_AVAILABLE_BATCH, MAINTENANCE_MODE_SET]
        assert state.messages_received == 2
        # Now a framing error: the connection closes, silently.
        writer.write(b"\xff\xff\xff\xff")
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.handshake_failures == 0


async def test_truncated_frame_after_handshake_is_not_dispatched():
    async with listener() as (port, state, recorder, _):
        reader, writer = await connect(port)
        raw = RawPeer()
        frame = raw.frame(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"})
        writer.write(raw.hello + frame[:-2])
        writer.write_eof()
        await assert_closed_without_bytes(reader)
        writer.close()
        assert recorder.frames == []


async def test_handler_errors_are_swallowed(logs):
    calls = []

    async def on_frame(frame_type, payload, sender):
        calls.append(payload)
        if payload.get("boom"):
            raise RuntimeError("handler exploded")

    port = free_port()
    async with mesh("queen-a", port, on_frame=on_frame) as (m, bound, _):
        assert bound
        reader, writer = await connect(port)
        raw = RawPeer()
        writer.write(raw.hello + raw.frame(QUEUE_CONFIG_SET, {"queue": "q", "boom": True})
                     + raw.frame(QUEUE_CONFIG_SET, {"queue": "r"}))
        await wait_until_async(lambda: len(calls) == 2)
        assert calls[1] == {"queue": "r"}
        assert any("handler failed" in line for line in logs)
        writer.close()


# --- liveness (invariant 15) ------------------------------------------------------


async def test_liveness_dead_and_recovered(logs):
    async with listener(dead_threshold_ms=200) as (port, state, _, _):
        assert state.liveness() == (0, 0)
        reader, writer = await connect(port)
        writer.write(hello("queen-z"))
        await wait_until_async(lambda: state.liveness() == (1, 0))
        await wait_until_async(lambda: state.liveness() == (0, 1))
        await wait_until_async(lambda: any("peer down: queen-z" in line for line in logs))
        # The silent connection was closed as idle; the peer comes back on a new one.
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.rejections["idle"] == 1
        reader, writer = await connect(port)
        raw = RawPeer("queen-z")
        writer.write(raw.hello + raw.frame(HEARTBEAT, {"server_id": "queen-z"}))
        await wait_until_async(lambda: state.liveness() == (1, 0))
        await wait_until_async(lambda: any("peer recovered: queen-z" in line for line in logs))
        writer.close()


async def test_never_seen_peer_is_neither_alive_nor_dead():
    async with mesh("queen-a", peers=[(HOST, free_port())], dead_threshold_ms=200) as (m, _, _):
        await asyncio.sleep(0.4)
        stats = m.stats()
        assert stats["servers_alive"] == 0 and stats["servers_dead"] == 0
        assert stats["peers"][0]["connected"] is False
        assert stats["peers"][0]["resolved_ip"] is None


# --- heartbeats (invariant 16) ------------------------------------------------------


async def test_heartbeats_flow_without_traffic():
    received: list[tuple[float, int, bytes]] = []

    async def sink(reader, writer):
        try:
            with contextlib.suppress(FrameError, OSError):
                frame_type, raw = await read_frame(reader)
                received.append((time.monotonic(), frame_type, raw))
                opener = Opener(connection_key(SECRET, hello_of(decode_payload(raw))))
                while True:
                    frame_type, raw = await opener.read(reader)
                    received.append((time.monotonic(), frame_type, raw))
        finally:
            writer.close()

    server = await asyncio.start_server(sink, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    link = PeerLink(HOST, port)
    peer = MeshPeer.start(link, server_id="queen-a", secret=SECRET, heartbeat_ms=50)
    try:
        await wait_until_async(lambda: len(received) >= 6)
    finally:
        await peer.stop(block=False)
        server.close()
        await server.wait_closed()
    assert received[0][1] == HELLO
    hello_payload = decode_payload(received[0][2])
    assert hello_payload["server_id"] == "queen-a"
    beats = received[1:]
    assert all(t == HEARTBEAT for _, t, _ in beats)
    assert decode_payload(beats[0][2]) == {"server_id": "queen-a"}
    # At least once per interval: generous slack for a loaded machine.
    gaps = [b[0] - a[0] for a, b in zip(received, received[1:])]
    assert max(gaps) < 1.0


# --- bounded queues and loss (invariants 10, 11) ----------------------------------------


def test_link_queue_is_bounded():
    link = PeerLink(HOST, 1)
    assert link.offer(HEARTBEAT, b"x") is False  # not connected
    assert link.dropped == 1
    link.connected = True
    assert all(link.offer(HEARTBEAT, b"x") for _ in range(SEND_QUEUE_SIZE))
    assert len(link.queue) == SEND_QUEUE_SIZE
    assert link.offer(HEARTBEAT, b"y") is False
    assert link.dropped == 2
    assert len(link.queue) == SEND_QUEUE_SIZE


@contextlib.asynccontextmanager
async def stalled_server():
    """Accepts, then never reads: a peer that stopped consuming."""
    writers = []

    def accept(reader, writer):
        writers.append(writer)

    server = await asyncio.start_server(accept, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1], server, writers
    finally:
        server.close()
        for w in writers:
            w.close()


async def fill_until_full(m: Mesh, payload: dict, limit: int = 50_000) -> None:
    link = m.links[0]
    for _ in range(limit):
        m.broadcast(MESSAGE_AVAILABLE, payload)
        if len(link.queue) >= SEND_QUEUE_SIZE:
            return
        await asyncio.sleep(0)  # let the dialler write into the socket until it stalls
    raise AssertionError("queue never filled")


async def test_slow_peer_drops_without_blocking():
    big = {"queue": "q", "partition": "x" * 8192}
    async with stalled_server() as (port, _, _):
        async with mesh("queen-a", peers=[(HOST, port)], dead_threshold_ms=60_000) as (m, _, _):
            await wait_until_async(lambda: m.links[0].connected)
            await fill_until_full(m, big)
            dropped = m.stats()["messages_dropped"]
            started = time.monotonic()
            accepted = [m.broadcast(MESSAGE_AVAILABLE, big) for _ in range(10)]
            assert time.monotonic() - started < 0.5
            assert accepted == [0] * 10
            assert m.stats()["messages_dropped"] == dropped + 10
            assert len(m.links[0].queue) == SEND_QUEUE_SIZE
            assert m.links[0].connected


async def test_broadcast_to_a_down_peer_drops_and_counts():
    async with mesh("queen-a", peers=[(HOST, free_port()), (HOST, free_port())]) as (m, _, _):
        assert m.broadcast(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"}) == 0
        stats = m.stats()
        assert stats["messages_dropped"] == 2  # one per peer
        assert stats["messages_sent"] == 0
        assert m.broadcast(MESSAGE_AVAILABLE, {"bad": object()}) == 0  # never raises


async def test_frames_offered_while_down_are_never_delivered():
    port = free_port()
    async with mesh("queen-a", peers=[(HOST, port)]) as (m, _, _):
        for i in range(5):
            assert m.broadcast(MESSAGE_AVAILABLE, {"queue": "stale", "partition": str(i)}) == 0
        async with listener(port=port) as (_, state, recorder, _):
            await wait_until_async(lambda: m.links[0].connected, timeout=8)
            m.broadcast(MESSAGE_AVAILABLE, {"queue": "fresh", "partition": "p"})
            await wait_until_async(lambda: recorder.frames)
            await asyncio.sleep(0.2)
            assert recorder.payloads() == [{"queue": "fresh", "partition": "p"}]
        assert m.stats()["messages_dropped"] == 5


async def test_frames_queued_before_a_disconnect_are_discarded_on_reconnect():
    big = {"queue": "stale", "partition": "x" * 8192}
    port = free_port()
    async with mesh("queen-a", peers=[(HOST, port)], dead_threshold_ms=60_000) as (m, _, _):
        link = m.links[0]
        async with stalled_server_on(port) as writers:
            await wait_until_async(lambda: link.connected, timeout=8)
            await fill_until_full(m, big)
            for w in writers:  # the peer goes away with a full queue
                w.transport.abort()
        await wait_until_async(lambda: not link.connected)
        assert len(link.queue) == SEND_QUEUE_SIZE  # still queued while down...
        dropped = link.dropped
        async with listener(port=port) as (_, state, recorder, _):
            await wait_until_async(lambda: link.connected, timeout=8)
            # ...and discarded before `connected` became true.
            assert len(link.queue) == 0
            assert link.dropped == dropped + SEND_QUEUE_SIZE
            m.broadcast(MESSAGE_AVAILABLE, {"queue": "fresh", "partition": "p"})
            await wait_until_async(lambda: recorder.frames)
            await asyncio.sleep(0.2)
            assert recorder.payloads() == [{"queue": "fresh", "partition": "p"}]


@contextlib.asynccontextmanager
async def stalled_server_on(port: int):
    writers = []
    server = await asyncio.start_server(lambda r, w: writers.append(w), HOST, port)
    try:
        yield writers
    finally:
        server.close()
        for w in writers:
            w.close()
        await server.wait_closed()


# --- bind failure (invariant 14, transport level) --------------------------------------


async def test_bind_failure_logs_and_keeps_sending(logs):
    async with listener() as (peer_port, _, recorder, _):
        with socket.socket() as taken:
            taken.bind((HOST, 0))
            taken.listen()
            busy = taken.getsockname()[1]
            async with mesh("queen-a", busy, peers=[(HOST, peer_port)]) as (m, bound, _):
                assert bound is False
                assert any(line.startswith("WARNING") and "TCP mesh bind failed" in line
                           for line in logs)
                assert any("mesh started: server_id=queen-a" in line and "peers=1" in line
                           and "auth=hmac" in line for line in logs)
                await wait_until_async(lambda: m.links[0].connected)
                m.broadcast(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"})
                await wait_until_async(lambda: recorder.frames)
                assert recorder.frames[0][2] == "queen-a"


async def test_start_line_reports_open_mode(logs):
    async with mesh("queen-o", secret="") as (m, bound, _):
        assert bound
        assert any("mesh started: server_id=queen-o" in line and "peers=0" in line
                   and "auth=off" in line for line in logs)
        assert m.stats()["peer_count"] == 0


# --- replay, sealed frames, bounds, TLS ---------------------------------------------------


async def test_a_recorded_hello_cannot_open_a_second_connection():
    async with listener() as (port, state, recorder, _):
        raw = RawPeer("queen-a")
        first = raw.frame(MESSAGE_AVAILABLE, {"queue": "q", "partition": "p"})
        reader, writer = await connect(port)
        writer.write(raw.hello + first)
        await wait_until_async(lambda: recorder.frames)
        # Same bytes on a new connection while the original is open...
        r2, w2 = await connect(port)
        w2.write(raw.hello + first)
        await assert_closed_without_bytes(r2)
        w2.close()
        writer.close()
        # ...and after it closed.
        await wait_until_async(lambda: state.inbound_connections == 0)
        r3, w3 = await connect(port)
        w3.write(raw.hello + first)
        await assert_closed_without_bytes(r3)
        w3.close()
        assert state.rejections["replayed_nonce"] == 2
        assert len(recorder.frames) == 1


async def test_frames_out_of_sequence_or_from_another_connection_close_it():
    async with listener() as (port, state, recorder, _):
        other = RawPeer("queen-a")
        stolen = other.frame(MAINTENANCE_MODE_SET, {"enabled": True})
        # A frame sealed for another connection (same server, other HELLO).
        peer = RawPeer("queen-a")
        reader, writer = await connect(port)
        writer.write(peer.hello + stolen)
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.rejections["bad_mac"] == 1
        # Skipped and repeated numbers, with valid MACs.
        for frames_of in (lambda p: [p.frame(HEARTBEAT), p.frame(HEARTBEAT)][1:],
                          lambda p: [f := p.frame(HEARTBEAT), f]):
            peer = RawPeer("queen-a")
            reader, writer = await connect(port)
            writer.write(peer.hello + b"".join(frames_of(peer))
                         + peer.frame(MAINTENANCE_MODE_SET, {"enabled": True}))
            await assert_closed_without_bytes(reader)
            writer.close()
        assert state.rejections["sequence"] == 2
        assert recorder.frames == []


async def test_silent_connection_after_hello_is_closed_as_idle():
    async with listener(dead_threshold_ms=300) as (port, state, _, _):
        reader, writer = await connect(port)
        writer.write(hello("quiet"))
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.rejections["idle"] == 1


async def test_connections_past_the_cap_are_refused():
    async with listener(max_connections=3) as (port, state, _, _):
        held = [await connect(port) for _ in range(3)]
        await wait_until_async(lambda: state.inbound_connections == 3)
        reader, writer = await connect(port)
        with contextlib.suppress(ConnectionResetError):
            await assert_closed_without_bytes(reader)
        writer.close()
        assert state.rejections["cap"] == 1
        for _, w in held:
            w.close()
        await wait_until_async(lambda: state.inbound_connections == 0)
        # Room again: a legitimate peer gets in.
        link = PeerLink(HOST, port)
        peer = MeshPeer.start(link, server_id="good", secret=SECRET, heartbeat_ms=100)
        try:
            await wait_until_async(lambda: "good" in state.last_seen)
        finally:
            await peer.stop(block=False)


async def test_oversize_frame_after_hello_is_refused_before_its_body_arrives():
    async with listener(max_frame_bytes=4096) as (port, state, recorder, _):
        reader, writer = await connect(port)
        # Only the prefix is sent: a reader waiting for the 4 MB body would hang.
        writer.write(hello("big") + (4 * 1024 * 1024).to_bytes(4, "big"))
        await assert_closed_without_bytes(reader)
        writer.close()
        assert state.rejections["oversize"] == 1


async def test_rejections_are_logged_at_most_a_burst_per_window(logs):
    async with listener() as (port, state, _, _):
        for _ in range(15):
            reader, writer = await connect(port)
            writer.write(b"\x00\x00\x00\x00")
            await assert_closed_without_bytes(reader)
            writer.close()
        await wait_until_async(lambda: state.rejections["framing"] == 15)
        lines = [line for line in logs if "mesh: closed connection" in line]
        assert len(lines) == 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from tests.mesh_pki import make_pki
    return make_pki(tmp_path_factory.mktemp("pki"))


def mesh_tls(pki, who):
    from actors.mesh import MeshTLS
    return MeshTLS(pki[who]["cert"], pki[who]["key"], pki["ca"])


async def test_mutual_tls_pair_and_refused_clients(pki):
    import ssl
    port_a, port_b = free_port(), free_port()
    async with (
        mesh("queen-a", port_a, [(HOST, port_b)], tls=mesh_tls(pki, "a")) as (a, _, a_rec),
        mesh("queen-b", port_b, [(HOST, port_a)], tls=mesh_tls(pki, "b")) as (b, _, b_rec),
    ):
        await wait_until_async(lambda: a.links[0].connected and b.links[0].connected
                         and b.stats()["servers_alive"] == 1)
        a.broadcast(MAINTENANCE_MODE_SET, {"enabled": True})
        await wait_until_async(lambda: b_rec.frames)
        assert b_rec.frames == [(MAINTENANCE_MODE_SET, {"enabled": True}, "queen-a")]
        assert b.stats()["tls"] is True

        def client_context(who):
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if who:
                ctx.load_cert_chain(pki[who]["cert"], pki[who]["key"])
            return ctx

        # A certificate from another CA, and no certificate at all: the connection is
        # closed (asyncio ends the failed TLS handshake; nothing reaches the listener).
        for who in ("rogue", None):
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                reader, writer = await asyncio.open_connection(HOST, port_b,
                                                               ssl=client_context(who))
                writer.write(RawPeer("intruder").hello)
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
        # Plain TCP carrying a valid HELLO: not TLS, refused.
        reader, writer = await connect(port_b)
        writer.write(RawPeer("plain").hello)
        with contextlib.suppress(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 15)
        writer.close()
        assert "intruder" not in b.listener_state.last_seen
        assert "plain" not in b.listener_state.last_seen
        assert len(b_rec.frames) == 1
