"""Several real broker processes on one PostgreSQL, meshed over loopback.

The invariants: any broker serves any route; a push on A wakes a pop parked
on B through the mesh (not through B's backoff timer); queue-config
invalidations cross brokers; hostile mesh clients are rejected and counted
while HTTP keeps serving; losing the mesh costs latency, never correctness.
"""
from __future__ import annotations

import asyncio
import socket
import time

import asyncpg
import httpx
import pytest

from tests.conftest import free_port
from tests.waiting import wait_until, wait_until_async

SECRET = "ab" * 32
SLOW_TIMER = {"POP_WAIT_INITIAL_INTERVAL_MS": "8000", "POP_WAIT_MAX_INTERVAL_MS": "8000"}


def mesh_env(server_id: str, port: int, peers: list[int], **extra: str) -> dict[str, str]:
    return {"QUEEN_SERVER_ID": server_id, "QUEEN_MESH_PORT": str(port),
            "QUEEN_MESH_PEERS": ",".join(f"127.0.0.1:{p}" for p in peers),
            "QUEEN_SYNC_SECRET": SECRET, "QUEEN_SYNC_HEARTBEAT_MS": "200",
            "QUEEN_SYNC_DEAD_THRESHOLD_MS": "1500", **extra}


def start_cluster(broker_factory, n: int, **extra: str):
    ports = [free_port() for _ in range(n)]
    return [broker_factory(**mesh_env(f"queen-{i}", ports[i],
                                      [p for j, p in enumerate(ports) if j != i], **extra))
            for i in range(n)]


def transport(url: str) -> dict:
    return httpx.get(url + "/health", timeout=5).json()["shared_state"]["transport"]


def all_connected(url: str, peers: int) -> bool:
    t = transport(url)
    return (t is not None and sum(p["connected"] for p in t["peers"]) == peers
            and t["servers_alive"] == peers)


@pytest.fixture(scope="module")
def pair(module_broker_factory):
    """Two meshed brokers whose backoff timer alone would take 8 s to re-check."""
    a, b = start_cluster(module_broker_factory, 2, **SLOW_TIMER)
    for x in (a, b):
        wait_until(lambda x=x: all_connected(x.url, 1), what=f"mesh up on {x.url}")
    return a, b


async def _wait_parked(client: httpx.AsyncClient, count: int) -> None:
    async def parked() -> bool:
        return (await client.get("/health")).json()["shared_state"]["parkedPops"] == count
    await wait_until_async(parked, 10, f"{count} parked pops", interval=0.05)


async def test_push_on_a_wakes_a_pop_parked_on_b_through_the_mesh(pair, queue_name):
    a, b = pair
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as on_b, \
            httpx.AsyncClient(base_url=a.url, timeout=30) as on_a:
        started = time.monotonic()
        pop = asyncio.create_task(on_b.get(f"/api/v1/pop/queue/{queue_name}",
                                           params={"wait": "true", "timeout": "20000"}))
        await _wait_parked(on_b, 1)
        await on_a.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": "hi"}]})
        body = (await pop).json()
        elapsed = time.monotonic() - started
    assert [m["data"] for m in body["messages"]] == ["hi"]
    assert elapsed < 6, f"answered after {elapsed:.1f}s: B's 8 s timer, not the mesh wake"


def test_a_burst_of_pushes_sends_a_peer_one_wake_per_window_not_one_per_push(
        broker_factory, queue_name):
    """Wakes to the peers go through the same per-queue gate as received ones: a burst of
    pushes to one queue costs a peer a wake frame when it starts and one per 250 ms window
    after, not a frame per push. (No hot-list, so no dirty hints: every frame A sends is a
    wake.)"""
    a, b = start_cluster(broker_factory, 2, QUEEN_HOTLIST="false")
    for x in (a, b):
        wait_until(lambda x=x: all_connected(x.url, 1), what=f"mesh up on {x.url}")
    pushes = 60
    sent_before = transport(a.url)["messages_sent"]
    started = time.monotonic()
    with httpx.Client(base_url=a.url, timeout=30) as on_a:
        for i in range(pushes):
            r = on_a.post("/api/v1/push", json={"items": [
                {"queue": queue_name, "partition": "p", "payload": i}]})
            assert r.status_code in (200, 201) and r.json()[0]["status"] == "queued"
    elapsed = time.monotonic() - started
    time.sleep(0.6)  # the trailing folded wake of the last window goes out
    frames = transport(a.url)["messages_sent"] - sent_before
    windows = elapsed / 0.25 + 2  # the first wake, and one at the end of each window
    assert frames <= windows, (frames, elapsed)
    assert frames < pushes / 2


async def test_a_burst_of_pushes_to_many_partitions_reaches_b_in_a_few_frames(
        broker_factory, queue_name):
    """A burst of pushes to 60 partitions on A: B's hot-list ring learns every partition
    (dirty hints), in a few frames: a wake frame per 250 ms window and a dirty-hint frame at
    most every 50 ms, not a frame of each per push."""
    a, b = start_cluster(broker_factory, 2)
    for x in (a, b):
        wait_until(lambda x=x: all_connected(x.url, 1), what=f"mesh up on {x.url}")
    pushes = 60
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as on_b, \
            httpx.AsyncClient(base_url=a.url, timeout=30) as on_a:
        # a ring of group g for the queue on B
        await on_a.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "partition": "seed", "payload": 0}]})
        seed = (await on_b.get(f"/api/v1/pop/queue/{queue_name}",
                               params={"consumerGroup": "g", "batch": "10"})).json()
        assert [m["data"] for m in seed["messages"]] == [0]
        await on_b.post("/api/v1/ack/batch", json={"consumerGroup": "g", "acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"} for m in seed["messages"]]})
        await asyncio.sleep(0.6)  # the wake and dirty windows of the seed push are over
        sent_before = transport(a.url)["messages_sent"]
        started = time.monotonic()
        answers = await asyncio.gather(*(on_a.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "partition": f"p{i}", "payload": i}]}) for i in range(pushes)))
        elapsed = time.monotonic() - started
        assert all(r.json()[0]["status"] == "queued" for r in answers)

        async def ring_knows_all() -> bool:
            hot = (await on_b.get("/health")).json()["shared_state"]["hotList"]
            return hot["ready"] + hot["wheel"] + hot["inflight"] >= pushes
        await wait_until_async(ring_knows_all, 10, "B's ring holding the 60 partitions",
                               interval=0.05)
    await asyncio.sleep(0.6)  # the trailing frames of the last windows
    frames = transport(a.url)["messages_sent"] - sent_before
    allowed = (elapsed / 0.25 + 2) + (elapsed / 0.05 + 2)
    assert frames <= allowed, (frames, elapsed)
    assert frames < pushes / 2, (frames, elapsed)


async def test_a_pop_parked_on_b_within_a_folded_wake_window_is_woken(pair, queue_name):
    """A push whose wake the sender folds (it comes within the window of an earlier one)
    still wakes a pop parked on the peer, at the window's end, not at B's 8 s timer."""
    a, b = pair
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as on_b, \
            httpx.AsyncClient(base_url=a.url, timeout=30) as on_a:
        # opens the window on A for the queue (nobody is parked yet)
        await on_a.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "partition": "first", "payload": "first"}]})
        first = (await on_b.get(f"/api/v1/pop/queue/{queue_name}",
                                params={"batch": "10"})).json()
        assert [m["data"] for m in first["messages"]] == ["first"]
        await on_b.post("/api/v1/ack/batch", json={"acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"} for m in first["messages"]]})
        started = time.monotonic()
        pop = asyncio.create_task(on_b.get(f"/api/v1/pop/queue/{queue_name}",
                                           params={"wait": "true", "timeout": "20000"}))
        await _wait_parked(on_b, 1)
        await on_a.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "partition": "second", "payload": "second"}]})
        body = (await pop).json()
        elapsed = time.monotonic() - started
    assert [m["data"] for m in body["messages"]] == ["second"]
    assert elapsed < 6, f"answered after {elapsed:.1f}s: B's 8 s timer, not the mesh wake"


def test_lease_taken_on_a_is_acked_on_b(pair, queue_name):
    a, b = pair
    httpx.post(a.url + "/api/v1/push", json={"items": [
        {"queue": queue_name, "payload": 1}, {"queue": queue_name, "payload": 2}]})
    popped = httpx.get(f"{a.url}/api/v1/pop/queue/{queue_name}", params={"batch": "1"}).json()
    [m] = popped["messages"]
    # B sees A's lease: the partition is held for the group.
    held = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}/partition/Default").json()
    assert held["messages"] == [] and held["error"] == "lease_held"
    ack = httpx.post(b.url + "/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "leaseId": m["leaseId"], "status": "completed"}).json()
    assert ack[0]["success"] is True and ack[0]["leaseReleased"] is True
    nxt = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}/partition/Default").json()
    assert [x["data"] for x in nxt["messages"]] == [2]


async def test_queue_config_invalidation_crosses_brokers(broker_factory, queue_name, database):
    """B caches 'not encrypted' for a queue; configuring encryption on A reaches B as a
    QUEUE_CONFIG_SET hint (name only), so B's next pushes are encrypted long before
    the 60 s reconcile would have cleared its cache."""
    key = {"QUEEN_ENCRYPTION_KEY": "22" * 32}
    a, b = start_cluster(broker_factory, 2, **key)
    for x in (a, b):
        wait_until(lambda x=x: all_connected(x.url, 1), what="mesh up")
    httpx.post(b.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": "plain"}]})
    httpx.post(a.url + "/api/v1/configure", json={"queue": queue_name,
                                                  "options": {"encryptionEnabled": True}})

    async def stored() -> list:
        conn = await asyncpg.connect(database.dsn)
        try:
            return await conn.fetch(
                "SELECT m.transaction_id, m.is_encrypted FROM queen.messages m "
                "JOIN queen.partitions p ON p.id = m.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1", queue_name)
        finally:
            await conn.close()

    deadline = time.monotonic() + 5
    encrypted = False
    while time.monotonic() < deadline and not encrypted:
        txid = f"probe-{time.monotonic_ns()}"
        httpx.post(b.url + "/api/v1/push", json={"items": [
            {"queue": queue_name, "payload": "secret", "transactionId": txid}]})
        rows = {r["transaction_id"]: r["is_encrypted"] for r in await stored()}
        encrypted = rows[txid]
        await asyncio.sleep(0.1)
    assert encrypted, "B kept its stale 'not encrypted' flag"
    popped = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}", params={"batch": "100"}).json()
    assert "secret" in [m["data"] for m in popped["messages"]]


def test_three_brokers_with_one_secret_see_every_peer_connected(broker_factory):
    brokers = start_cluster(broker_factory, 3)
    for x in brokers:
        wait_until(lambda x=x: all_connected(x.url, 2), what=f"full mesh on {x.url}")
        t = transport(x.url)
        assert t["transport"] == "tcp-mesh" and t["peer_count"] == 2


def _mesh_port(b) -> int:
    return int(b.env["QUEEN_MESH_PORT"])


@pytest.mark.parametrize("frame", [
    b"\xff\xff\xff\xff",                                    # length far over 16 MiB
    b"\x00\x00\x00\x00",                                    # zero length
    b"\x00\x00\x00\x10\x04{\"server",                       # truncated
    b"\x00\x00\x00\x03\x03{}",                              # HEARTBEAT before HELLO
    b"\x00\x00\x00\x3b\x04" + b'{"server_id":"evil","nonce":"00","mac":"' + b"0" * 16 + b'"}',
    b"\x00\x00\x00\x05\x04garb",                            # garbage JSON HELLO
])
def test_hostile_mesh_client_is_rejected_counted_and_http_keeps_serving(pair, frame):
    a, _ = pair
    before = transport(a.url)["handshake_failures"]
    with socket.create_connection(("127.0.0.1", _mesh_port(a)), timeout=5) as s:
        s.sendall(frame)
        s.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := s.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    assert received == b"", "the broker wrote on an accepted mesh connection"
    wait_until(lambda: transport(a.url)["handshake_failures"] > before, 5, "failure counted")
    assert httpx.get(a.url + "/health").json()["status"] == "healthy"


def test_mesh_bind_failure_is_a_warning_and_the_broker_serves(broker_factory, queue_name):
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        b = broker_factory(**mesh_env("queen-squat", port, [free_port()]))
        assert "TCP mesh bind failed" in b.log()
        r = httpx.post(b.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]})
        assert r.status_code == 200


def test_without_the_mesh_a_push_on_a_reaches_a_pop_on_b_by_backoff(broker_factory, queue_name):
    """Mesh cut: correctness holds, latency is bounded by POP_WAIT_MAX_INTERVAL_MS."""
    a = broker_factory()
    b = broker_factory(POP_WAIT_MAX_INTERVAL_MS="1000")

    async def scenario() -> tuple[list, float]:
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as on_b:
            pop = asyncio.create_task(on_b.get(f"/api/v1/pop/queue/{queue_name}",
                                               params={"wait": "true", "timeout": "15000"}))
            await asyncio.sleep(1.5)
            pushed = time.monotonic()
            httpx.post(a.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 5}]})
            body = (await pop).json()
            return body["messages"], time.monotonic() - pushed

    messages, latency = asyncio.run(scenario())
    assert [m["data"] for m in messages] == [5]
    assert latency < 5, f"delivered {latency:.1f}s after the push"


def test_boot_log_reports_sync_auth_and_never_the_secret(pair, broker):
    """Invariant 63: the `config: sync` block says auth=hmac with a secret, auth=off
    without, the mesh start line is there, and the secret never appears."""
    a, _ = pair
    log = a.log()
    sync_line = next(line for line in log.splitlines() if "config: sync" in line)
    assert "auth=hmac" in sync_line and "secret=<set:64 chars>" in sync_line
    assert "mesh started: server_id=queen-0" in log
    assert SECRET not in log
    open_line = next(line for line in broker.log().splitlines() if "config: sync" in line)
    assert "auth=off" in open_line
