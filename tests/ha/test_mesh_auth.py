"""The authenticated mesh against real broker processes.

An attacker who can reach a broker's mesh port, and who may have recorded
everything one broker sent another, changes nothing: replayed or altered
HELLOs are refused, frames that are forged, out of sequence or copied from
another connection close the connection, and each refusal is counted by
reason. The real brokers' flips and wakes keep working. Resource bounds
(idle, cap, oversize, hot-list growth, wake storms) are checked from outside.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from actors.mesh.frames import (
    HEARTBEAT,
    HELLO,
    HOTLIST_DIRTY_BATCH,
    MAINTENANCE_MODE_SET,
    MESSAGE_AVAILABLE_BATCH,
    POP_MAINTENANCE_MODE_SET,
    Sealer,
    encode,
    encode_payload,
)
from actors.mesh.handshake import connection_key, hello_of, make_hello, now_ms
from tests.conftest import free_port, free_ports, start_broker
from tests.ha.test_mesh_brokers import SECRET, all_connected, mesh_env, transport
from tests.waiting import wait_until, wait_until_async

# Only a mesh wake can answer a pop parked for less than its re-check interval.
NO_TIMER = {"POP_WAIT_INITIAL_INTERVAL_MS": "30000", "POP_WAIT_MAX_INTERVAL_MS": "30000"}
POP_MS = 8000  # < 30 s: a pop answered with messages was woken, not re-checked
# A pop that must stay parked through the replays and the redial (a minute on a loaded
# machine); it is answered by the push that ends the test, long before this.
PARKED_THROUGH_REPLAYS_MS = 120_000


# --- helpers ---------------------------------------------------------------------------


class RawPeer:
    """What an attacker holding the secret (or a test) can say: a HELLO and sealed frames."""

    def __init__(self, server_id: str = "raw", secret: str = SECRET, ts: int | None = None):
        self.payload = make_hello(server_id, secret, ts=ts)
        self.hello = encode(HELLO, self.payload)
        self.sealer = Sealer(connection_key(secret, hello_of(self.payload)))

    def frame(self, frame_type: int, payload=None) -> bytes:
        return self.sealer.seal(frame_type, encode_payload(payload))


def send_until_closed(port: int, data: bytes, timeout: float = 15.0) -> bytes:
    """Send `data` to the mesh port and read until the broker closes; returns what it wrote."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        received = b""
        try:
            s.sendall(data)
            while chunk := s.recv(4096):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        return received


def rejections(b) -> dict[str, int]:
    return transport(b.url)["rejections"]


def flags(b) -> tuple[bool, bool]:
    m = httpx.get(b.url + "/api/v1/system/maintenance", timeout=5).json()
    return m["maintenanceMode"], m["popMaintenanceMode"]


def parked(b) -> int:
    return httpx.get(b.url + "/health", timeout=5).json()["shared_state"]["parkedPops"]


def mesh_port(b) -> int:
    return int(b.env["QUEEN_MESH_PORT"])


def expect_rejection(b, reason: str, data: bytes) -> None:
    before = rejections(b)[reason]
    assert send_until_closed(mesh_port(b), data) == b"", "the broker wrote on a mesh connection"
    wait_until(lambda: rejections(b)[reason] > before, 10, f"{reason} counted")


def split_frames(stream: bytes) -> tuple[bytes, list[bytes]]:
    """(HELLO, complete sealed frames) of a recorded dialled stream."""
    frames, i = [], 0
    while i + 4 <= len(stream):
        n = int.from_bytes(stream[i:i + 4], "big")
        if i + 4 + n > len(stream):
            break
        frames.append(stream[i:i + 4 + n])
        i += 4 + n
    return frames[0], frames[1:]


def frame_type(frame: bytes) -> int:
    return frame[12]


class RecordingProxy:
    """Forwards every connection to `target_port` and records what the dialler sent."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.streams: list[bytearray] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            record = bytearray()
            with self._lock:
                self.streams.append(record)
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, record),
                             daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        try:
            while chunk := src.recv(65536):
                record.extend(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        """Close every forwarded connection (the dialler will redial through us)."""
        with self._lock:
            for s in self._sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._sockets.clear()

    def close(self) -> None:
        self.server.close()
        self.cut()


def park_pop(pool: ThreadPoolExecutor, b, queue: str, timeout_ms: int = POP_MS):
    future = pool.submit(httpx.get, f"{b.url}/api/v1/pop/queue/{queue}",
                         params={"wait": "true", "timeout": str(timeout_ms)},
                         timeout=timeout_ms / 1000 + 30)
    return future


def long_polls(b) -> dict[str, int]:
    """B's parked-pop figures: `woken` counts pops a wake (local or from the mesh) reached."""
    return httpx.get(b.url + "/api/v1/system/shared-state", timeout=5).json()["longPolls"]


# --- the "done when": record A -> B, replay it, nothing changes on B ---------------------


def test_replaying_what_a_sent_b_changes_nothing_on_b(fresh_database, tmp_path, queue_name):
    """What B applies is what it counts: a frame that passed B's checks is counted in
    `messages_received`, and a wake it hands to a parked pop in `longPolls.woken`. Replays
    of a recorded A -> B stream (whole, or prefixes with the enable flip, a wake or a forged
    frame after them) are refused, each counted as `replayed_nonce`, and neither counter nor
    either flag moves. The pop parked meanwhile has nothing to find, so nothing but a wake
    could touch it: B's own re-checks cannot make it answer.

    The pop is parked only after B has delivered the wakes A really sent: B folds a queue's
    wakes within 250 ms into one at the window's end (actors/mesh/wake_gate.py), and that late,
    legitimate wake reached the pop parked next (the flake this test had: the pop answered
    with a message pushed meanwhile, which looked like a replay applied)."""
    port_a, port_b = free_ports(2)
    # B's replay window outlasts the test: each replay is refused by the nonce memory under
    # test, not by the clock (past QUEEN_MESH_MAX_SKEW_MS a late replay is refused as `skew`,
    # which a slow run on a loaded machine reached).
    b = start_broker(fresh_database, tmp_path, QUEEN_MESH_MAX_SKEW_MS="3600000",
                     **mesh_env("queen-rb", port_b, [port_a], **NO_TIMER))
    proxy = RecordingProxy(port_b)
    a = start_broker(fresh_database, tmp_path,
                     **mesh_env("queen-ra", port_a, [proxy.port], **NO_TIMER))
    pool = ThreadPoolExecutor(4)
    try:
        for x in (a, b):
            wait_until(lambda x=x: all_connected(x.url, 1), what="mesh up")
        # What A legitimately sends B: flips both ways and a wake.
        for which in ("push", "pop"):
            body = {"enabled": True}
            route = "/api/v1/system/maintenance" if which == "push" else \
                "/api/v1/system/maintenance/pop"
            httpx.post(a.url + route, json=body)
            wait_until(lambda which=which: flags(b)[which == "pop"], 5,
                       f"{which} flag on B via the mesh")
            httpx.post(a.url + route, json={"enabled": False})
            wait_until(lambda which=which: not flags(b)[which == "pop"], 5, f"{which} flag off on B")
        pop = park_pop(pool, b, queue_name)
        wait_until(lambda: parked(b) == 1, 10, "pop parked on B")
        httpx.post(a.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]})
        [m] = pop.result().json()["messages"]
        assert m["data"] == 1
        ack = httpx.post(b.url + "/api/v1/ack", json={  # releases the partition's lease
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": "completed"}).json()
        assert ack[0]["success"] is True

        wait_until(lambda: proxy.streams and len(split_frames(bytes(proxy.streams[0]))[1]) >= 6,
                   10, "frames recorded")
        hello, frames = split_frames(bytes(proxy.streams[0]))
        types = [frame_type(f) for f in frames]
        assert {MAINTENANCE_MODE_SET, POP_MAINTENANCE_MODE_SET, MESSAGE_AVAILABLE_BATCH} <= set(types)
        enable = next(f for f in frames if frame_type(f) == MAINTENANCE_MODE_SET
                      and b'"enabled":true' in f)

        # The state a replay would change: both flags off, a pop parked on the queue the
        # recorded wakes name (its queue is drained: only a new push can answer it). First,
        # A's real wakes have all landed: B folds the ones a queue receives within 250 ms into
        # one wake at the window's end, which would otherwise reach the pop parked next.
        wait_until(lambda: transport(b.url)["received_wakes"]["pending_queues"] == 0, 10,
                   "A's folded wakes delivered on B")
        pop = park_pop(pool, b, queue_name, timeout_ms=PARKED_THROUGH_REPLAYS_MS)
        wait_until(lambda: parked(b) == 1, 10, "pop parked on B")
        received, woken = transport(b.url)["messages_received"], long_polls(b)["woken"]

        forged = Sealer(os.urandom(32)).seal(MAINTENANCE_MODE_SET, b'{"enabled":true}')
        wake = next(f for f in frames if frame_type(f) == MESSAGE_AVAILABLE_BATCH)
        replays = [hello + b"".join(frames)]                      # everything, as recorded
        for k in (0, 1, frames.index(enable), len(frames)):       # prefixes + forged tails
            for tail in (enable, wake, forged):
                replays.append(hello + b"".join(frames[:k]) + tail)
        for data in replays:  # the original connection is still open
            expect_rejection(b, "replayed_nonce", data)

        # After the original connection closed (A redials with a fresh HELLO).
        proxy.cut()
        wait_until(lambda: len(proxy.streams) >= 2 and all_connected(b.url, 1), 15, "A redialled")
        expect_rejection(b, "replayed_nonce", hello + b"".join(frames))

        # Nothing changed on B: no frame applied, no wake handed to the parked pop.
        assert flags(b) == (False, False)
        assert transport(b.url)["messages_received"] == received
        assert long_polls(b)["woken"] == woken
        assert parked(b) == 1 and not pop.done()
        assert rejections(b)["replayed_nonce"] == len(replays) + 1

        # A's real flips and wakes still reach B.
        httpx.post(a.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 3}]})
        answer = pop.result().json()
        assert [m["data"] for m in answer["messages"]] == [3], answer
        assert long_polls(b)["woken"] == woken + 1
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": True})
        wait_until(lambda: flags(b)[0], 5, "flag on B via the mesh after the replays")
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": False})
        wait_until(lambda: not flags(b)[0], 5, "flag off on B")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        proxy.close()
        for x in (a, b):
            x.stop()


# --- forged HELLOs and frames ---------------------------------------------------------------


@pytest.fixture(scope="module")
def lone(module_broker_factory):
    """A broker whose mesh is active (one peer that never answers); its flags start off.

    Nothing here ever flips a flag for real, so the shared database is safe to use.
    """
    return module_broker_factory(**mesh_env("queen-lone", free_port(), [free_port()],
                                            QUEEN_SYNC_DEAD_THRESHOLD_MS="1500"))


def test_altered_and_stale_hellos_are_refused(lone):
    peer = RawPeer("queen-x")
    # Same MAC, another server_id.
    other = encode(HELLO, {**peer.payload, "server_id": "queen-y"})
    expect_rejection(lone, "bad_mac", other + peer.frame(MAINTENANCE_MODE_SET, {"enabled": True}))
    # A correctly signed HELLO from a minute ago.
    stale = RawPeer("queen-x", ts=now_ms() - 60_000)
    expect_rejection(lone, "skew", stale.hello + stale.frame(MAINTENANCE_MODE_SET, {"enabled": True}))
    # Wrong secret.
    wrong = RawPeer("queen-x", secret="not-the-secret")
    expect_rejection(lone, "bad_mac", wrong.hello)
    t = transport(lone.url)
    assert t["servers_alive"] + t["servers_dead"] == 0, "a refused HELLO counted as a server"
    assert flags(lone) == (False, False)


def test_bad_frames_after_a_good_hello_close_the_connection_and_change_nothing(lone):
    received = transport(lone.url)["messages_received"]
    enable = {"enabled": True}
    # A flipped bit in an otherwise valid frame.
    p = RawPeer()
    frame = bytearray(p.frame(MAINTENANCE_MODE_SET, enable))
    frame[-1] ^= 1
    expect_rejection(lone, "bad_mac", p.hello + bytes(frame))
    # A frame written for another connection.
    other, p = RawPeer(), RawPeer()
    expect_rejection(lone, "bad_mac", p.hello + other.frame(MAINTENANCE_MODE_SET, enable))
    # Skipped sequence number.
    p = RawPeer()
    p.frame(HEARTBEAT)  # sealed as 1, never sent
    expect_rejection(lone, "sequence", p.hello + p.frame(MAINTENANCE_MODE_SET, enable))
    # Repeated sequence number (a frame replayed within its own connection).
    p = RawPeer()
    first = p.frame(HEARTBEAT)
    expect_rejection(lone, "sequence", p.hello + first + first
                     + p.frame(POP_MAINTENANCE_MODE_SET, enable))
    assert flags(lone) == (False, False)
    assert transport(lone.url)["messages_received"] == received
    t = transport(lone.url)
    assert t["signature_failures"] >= 2 and t["sequence_rejections"] >= 2
    prom = httpx.get(lone.url + "/metrics/prometheus").text
    assert 'queen_mesh_rejections_total{reason="sequence"}' in prom
    assert "queen_mesh_auth_enabled 1.0" in prom


# --- bounds -------------------------------------------------------------------------------------


def test_silent_capped_and_oversize_connections_are_closed(lone):
    port = mesh_port(lone)
    # Silent after its HELLO: closed once QUEEN_SYNC_DEAD_THRESHOLD_MS passes.
    expect_rejection(lone, "idle", RawPeer("quiet").hello)
    # A length prefix far over QUEEN_MESH_MAX_FRAME_BYTES, before and after a HELLO: refused
    # from the prefix alone (the body is never sent).
    expect_rejection(lone, "oversize", (15 * 1024 * 1024).to_bytes(4, "big"))
    expect_rejection(lone, "oversize", RawPeer().hello + (15 * 1024 * 1024).to_bytes(4, "big"))
    # 4 x 1 peer + 4 = 8 accepted connections at once; the ninth is refused.
    cap = transport(lone.url)["max_connections"]
    assert cap == 8
    before = rejections(lone)["cap"]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(cap)]
    try:
        wait_until(lambda: transport(lone.url)["inbound_connections"] == cap, 10, "all accepted")
        assert send_until_closed(port, RawPeer().hello) == b""
        wait_until(lambda: rejections(lone)["cap"] == before + 1, 10, "cap counted")
    finally:
        for s in held:
            s.close()
    assert httpx.get(lone.url + "/health").json()["status"] == "healthy"


def test_a_600000_partition_dirty_hint_leaves_memory_bounded(broker_factory, queue_name):
    b = broker_factory(**mesh_env("queen-dirty", free_port(), [free_port()], **NO_TIMER,
                                  QUEEN_SYNC_DEAD_THRESHOLD_MS="60000"))
    proc = psutil.Process(b.proc.pid)
    pool = ThreadPoolExecutor(1)
    try:
        # A wildcard pop makes the queue's hot-list ring exist.
        park_pop(pool, b, queue_name, timeout_ms=20_000)
        wait_until(lambda: parked(b) == 1, 10, "pop parked")
        rss_before = proc.memory_info().rss
        received = transport(b.url)["messages_received"]
        p = RawPeer("queen-flood")
        chunk = 15_000  # ~870 KB per frame, under the 1 MiB limit
        frames = [p.frame(HOTLIST_DIRTY_BATCH, {"items": [
            {"queue": queue_name, "partition": f"fake-{i:07d}"}
            for i in range(start, start + chunk)]}) for start in range(0, 600_000, chunk)]
        with socket.create_connection(("127.0.0.1", mesh_port(b))) as s:
            s.sendall(p.hello + b"".join(frames))
            wait_until(lambda: transport(b.url)["messages_received"] == received + len(frames),
                       60, "all dirty hints dispatched")
        growth = proc.memory_info().rss - rss_before
        # Unbounded, the ring keeps 600,000 entries (~335 MB measured on main).
        assert growth < 100 * 1024 * 1024, f"RSS grew by {growth / 2**20:.0f} MiB"
        assert sum(rejections(b).values()) == 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


async def test_a_storm_of_wake_frames_does_not_multiply_pop_queries(fresh_database, tmp_path,
                                                                  queue_name):
    import asyncio

    import asyncpg
    b = start_broker(fresh_database, tmp_path, **mesh_env(
        "queen-storm", free_port(), [free_port()], **NO_TIMER,
        QUEEN_SYNC_DEAD_THRESHOLD_MS="60000", STATS_INTERVAL_MS="600000",
        METRICS_FLUSH_MS="600000"))
    pops, frames_sent, window_s = 40, 60, 0.25

    async def commits() -> int:
        conn = await asyncpg.connect(fresh_database.dsn)
        try:
            return await conn.fetchval("SELECT xact_commit FROM pg_stat_database "
                                       "WHERE datname = current_database()")
        finally:
            await conn.close()

    try:
        async with httpx.AsyncClient(base_url=b.url, timeout=60) as client:
            parked_pops = [asyncio.create_task(client.get(
                f"/api/v1/pop/queue/{queue_name}", params={"wait": "true", "timeout": "25000"}))
                for _ in range(pops)]
            # Async: the pops are tasks of this loop, sent only while it waits.
            await wait_until_async(lambda: parked(b) == pops, 10, f"{pops} pops parked",
                                   interval=0.05)
            before = await commits()
            p = RawPeer("queen-storm-peer")
            reader, writer = await asyncio.open_connection("127.0.0.1", mesh_port(b))
            writer.write(p.hello)
            started = time.monotonic()
            for _ in range(frames_sent):  # 20 wake frames a second
                writer.write(p.frame(MESSAGE_AVAILABLE_BATCH,
                                     {"items": [{"queue": queue_name, "partition": "Default"}]}))
                await writer.drain()
                await asyncio.sleep(0.05)
            elapsed = time.monotonic() - started
            writer.close()
            await asyncio.sleep(window_s * 2)  # the trailing coalesced wake runs
            delta = await commits() - before
            for t in parked_pops:
                t.cancel()
            await asyncio.gather(*parked_pops, return_exceptions=True)
        # Coalesced: at most one mesh wake per queue per window, each costing one attempt
        # per parked pop (plus a little background). Uncoalesced, every frame would wake all
        # pops: frames_sent * pops = 2400 attempts.
        allowed = (elapsed / window_s + 4) * pops * 1.5
        assert delta < allowed < frames_sent * pops, (delta, allowed)
    finally:
        b.stop()


# --- open mode and mutual TLS between brokers -----------------------------------------------


def test_open_mode_warns_and_shows_auth_off(broker_factory):
    b = broker_factory(**{**mesh_env("queen-open", free_port(), [free_port()]),
                          "QUEEN_SYNC_SECRET": ""})
    assert "QUEEN_SYNC_SECRET is empty" in b.log()
    assert transport(b.url)["auth"] == "off"


def test_require_secret_refuses_to_start_in_open_mode(database, tmp_path):
    with pytest.raises(RuntimeError, match="QUEEN_MESH_REQUIRE_SECRET"):
        start_broker(database, tmp_path, **{**mesh_env("queen-req", free_port(), [free_port()]),
                                            "QUEEN_SYNC_SECRET": "",
                                            "QUEEN_MESH_REQUIRE_SECRET": "true"})


def test_mutual_tls_between_two_brokers(fresh_database, tmp_path, queue_name):
    import ssl

    from tests.mesh_pki import make_pki, tls_env
    pki = make_pki(tmp_path / "pki")
    port_a, port_b = free_port(), free_port()
    a = start_broker(fresh_database, tmp_path,
                     **mesh_env("queen-ta", port_a, [port_b], **NO_TIMER, **tls_env(pki, "a")))
    b = start_broker(fresh_database, tmp_path,
                     **mesh_env("queen-tb", port_b, [port_a], **NO_TIMER, **tls_env(pki, "b")))
    pool = ThreadPoolExecutor(1)
    try:
        for x in (a, b):
            wait_until(lambda x=x: all_connected(x.url, 1), what="TLS mesh up")
            assert transport(x.url)["tls"] is True
        pop = park_pop(pool, b, queue_name)
        wait_until(lambda: parked(b) == 1, 10, "pop parked on B")
        httpx.post(a.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 7}]})
        assert [m["data"] for m in pop.result().json()["messages"]] == [7]
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": True})
        wait_until(lambda: flags(b)[0], 5, "flag on B over TLS")
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": False})
        wait_until(lambda: not flags(b)[0], 5, "flag off on B over TLS")

        # A client with a certificate from another CA (and a valid HELLO) is refused, and
        # so is plain TCP carrying a valid HELLO: each connection ends without a byte
        # and without a server joining.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.load_cert_chain(pki["rogue"]["cert"], pki["rogue"]["key"])
        try:
            with socket.create_connection(("127.0.0.1", port_b), timeout=20) as raw, \
                    ctx.wrap_socket(raw) as s:
                s.sendall(RawPeer("intruder").hello)
                assert s.recv(1) == b""
        except (ssl.SSLError, OSError):
            pass
        assert send_until_closed(port_b, RawPeer("plain").hello, timeout=30) == b""
        assert transport(b.url)["servers_alive"] == 1  # A only
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        a.stop()
        b.stop()
