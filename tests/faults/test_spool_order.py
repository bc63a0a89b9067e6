"""Per-partition order across brokers' spools, with real broker
processes on one real PostgreSQL that these tests stop and start.

Producers send each partition's messages one at a time, in sequence,
alternating brokers (as a load balancer would); during an outage each broker
spools what it accepts in its own node-local files. When PostgreSQL returns,
the brokers register their backlogs in ``queen.spool_backlog`` and merge their
replays in accept order, so every consumer group sees each partition in the
order its pushes were acknowledged.
"""
from __future__ import annotations

import os
import signal
import time

import asyncpg
import httpx
import pytest

from tests.conftest import start_broker
from tests.faults.test_maintenance_and_outage import db, maintenance, stored  # noqa: F401
from tests.waiting import wait_until_async

PARTITIONS = ("k0", "k1", "k2", "k3")


def push_one(url: str, queue: str, partition: str, txid: str) -> str:
    r = httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": partition, "transactionId": txid, "payload": {"t": txid}}]})
    assert r.status_code in (200, 201), r.text
    return r.json()[0]["status"]


def consume_all(url: str, queue: str, partition: str, group: str) -> list[str]:
    """Everything a consumer group gets from one partition, acked batch by batch."""
    seen: list[str] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        while True:
            r = http.get(f"/api/v1/pop/queue/{queue}/partition/{partition}",
                         params={"consumerGroup": group, "batch": 500, "wait": "false"})
            messages = r.json().get("messages") or [] if r.status_code == 200 else []
            if not messages:
                return seen
            seen += [m["transactionId"] for m in messages]
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"} for m in messages]
            assert http.post("/api/v1/ack/batch", json={"acknowledgments": acks,
                                                        "consumerGroup": group}).status_code == 200


async def wait_stored(database, queue: str, n: int, timeout: float) -> list:
    """(partition, transactionId) of the stored messages of ``queue``, once there are at
    least ``n``; fails the test after ``timeout`` s."""
    async def enough() -> list | None:
        rows = await stored(database, queue)
        return rows if len(rows) >= n else None
    return await wait_until_async(enough, timeout, f"{n} stored messages of {queue}",
                                  interval=0.2)


async def spools_registered(database, queue: str, n: int) -> None:
    """Wait until ``n`` spools list pushes of ``queue`` in queen.spool_backlog."""
    conn = await asyncpg.connect(database.dsn)

    async def registered() -> bool:
        return await conn.fetchval("SELECT count(DISTINCT server_id) FROM queen.spool_backlog "
                                   "WHERE queue_name = $1", queue) >= n
    try:
        await wait_until_async(registered, 10, "the spools registering their backlogs")
    finally:
        await conn.close()


@pytest.fixture
def trio(db, tmp_path):  # noqa: F811
    # No mesh: the brokers are told how long the database settles after its restart
    # (FILE_BUFFER_SETTLE_MS), or one may merge before another registered its spool.
    brokers = [start_broker(db, tmp_path, DB_CONNECTION_TIMEOUT="500",
                            FILE_BUFFER_SETTLE_MS="1500",
                            QUEEN_SERVER_ID=f"order-{name}") for name in "abc"]
    yield brokers
    for b in brokers:
        b.stop()


async def test_an_outage_behind_a_load_balancer_keeps_every_partition_in_send_order(
        db, trio, queue_name):  # noqa: F811
    """Three brokers, sequential producers alternating brokers per request,
    PostgreSQL stopped for a few seconds: 0 lost, 0 duplicated, 0 out of
    order, for two consumer groups."""
    sent: dict[str, list[str]] = {p: [] for p in PARTITIONS}
    statuses: dict[str, int] = {}
    turn = 0

    def send_round(tag: str) -> None:
        nonlocal turn
        for partition in PARTITIONS:
            txid = f"{partition}-{tag}-{len(sent[partition]):04d}"
            status = push_one(trio[turn % 3].url, queue_name, partition, txid)
            turn += 1
            statuses[status] = statuses.get(status, 0) + 1
            sent[partition].append(txid)

    for _ in range(5):
        send_round("before")
    db.embedded.stop(mode="immediate")
    try:
        for _ in range(30):  # every broker spools every partition's pushes in turn
            send_round("down")
    finally:
        db.embedded.start()
    for _ in range(30):  # while the three spools drain: queued behind them, in order
        send_round("after")
    total = sum(len(v) for v in sent.values())
    rows = await wait_stored(db, queue_name, total, timeout=60)
    assert statuses.get("buffered", 0) >= 120, statuses
    for partition, txids in sent.items():
        assert [t for p, t in rows if p == partition] == txids, partition
    assert len(rows) == total
    for group in ("g1", "g2"):
        for partition, txids in sent.items():
            assert consume_all(trio[0].url, queue_name, partition, group) == txids
    for b in trio:
        spool = httpx.get(b.url + "/health", timeout=10).json()["spool"]
        assert spool["orderExceptions"] == 0 and spool["pendingCount"] == 0
    conn = await asyncpg.connect(db.dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM queen.spool_backlog") == 0
    finally:
        await conn.close()


async def test_a_killed_peer_holds_its_partitions_for_the_bounded_wait_only(
        db, tmp_path, queue_name):  # noqa: F811
    """A broker killed with spooled pushes: the other one proceeds after
    FILE_BUFFER_ORDER_WAIT_MS; when the killed one restarts, its pushes land
    and each is counted as an order exception."""
    env = {"FILE_BUFFER_ORDER_WAIT_MS": "3000", "QUEEN_CACHE_REFRESH_INTERVAL_MS": "500"}
    a_dir, b_dir = tmp_path / "spool-a", tmp_path / "spool-b"
    a = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(a_dir), QUEEN_SERVER_ID="kill-a", **env)
    b = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(b_dir), QUEEN_SERVER_ID="kill-b", **env)
    try:
        maintenance(a.url, True)
        maintenance(b.url, True)
        order = []
        for i in range(6):
            broker = (a, b)[i % 2]
            txid = f"m{i}-{'ab'[i % 2]}"
            assert push_one(broker.url, queue_name, "p", txid) == "buffered"
            order.append(txid)
        await spools_registered(db, queue_name, 2)  # they do so while paused
        backlog = httpx.get(b.url + "/api/v1/system/maintenance").json()["clusterBacklog"]
        assert sorted((x["partitions"], x["spool"].split("-")[1]) for x in backlog
                      if x["spool"].startswith("kill-")) == [(1, "a"), (1, "b")]
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(10)
        killed_at = time.monotonic()
        conn = await asyncpg.connect(db.dsn)
        try:  # a's last heartbeat: the bounded wait runs from it
            last_beat = await conn.fetchval(
                "SELECT seen_at FROM queen.spool_servers WHERE server_id LIKE 'kill-a-%'")
        finally:
            await conn.close()
        assert last_beat is not None
        maintenance(b.url, False)
        rows = await wait_stored(db, queue_name, 3, timeout=30)
        assert [t for _, t in rows] == ["m1-b", "m3-b", "m5-b"]
        # b held back behind a's older pushes for the bounded wait, which runs from a's last
        # heartbeat (before the kill, so not from killed_at): both times on PostgreSQL's clock.
        conn = await asyncpg.connect(db.dsn)
        try:
            first_stored = await conn.fetchval(
                "SELECT min(m.created_at) FROM queen.messages m "
                "JOIN queen.partitions p ON p.id = m.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1", queue_name)
        finally:
            await conn.close()
        held_for = (first_stored - last_beat).total_seconds()
        assert held_for >= 3.0, held_for
        assert time.monotonic() - killed_at < 30
        assert httpx.get(b.url + "/health").json()["spool"]["orderExceptions"] == 0

        a = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(a_dir), QUEEN_SERVER_ID="kill-a2", **env)
        rows = await wait_stored(db, queue_name, 6, timeout=30)
        assert [t for _, t in rows] == ["m1-b", "m3-b", "m5-b", "m0-a", "m2-a", "m4-a"]
        # Counted by the broker whose merge found them: either may merge.
        spools = [httpx.get(x.url + "/health").json()["spool"] for x in (a, b)]
        assert sum(s["orderExceptions"] for s in spools) == 3, spools
        counted = next(s for s in spools if s["orderExceptions"])
        assert counted["orderExceptionPartitions"] == [
            {"queue": queue_name, "partition": "p", "count": 3}]
        proms = [httpx.get(x.url + "/metrics/prometheus").text for x in (a, b)]
        assert sum("queen_file_buffer_order_exceptions_total 3.0" in p for p in proms) == 1
    finally:
        a.stop()
        b.stop()


async def test_spools_merge_when_maintenance_ends_on_one_broker_first(
        db, tmp_path, queue_name):  # noqa: F811
    """Push maintenance on two brokers without a mesh; it is turned off on A
    first: A's spool waits for B's earlier pushes, and direct pushes through A
    queue behind B's spool (held), so the partition keeps the send order."""
    env = {"QUEEN_CACHE_REFRESH_INTERVAL_MS": "60000"}  # B does not learn the flip on its own
    a = start_broker(db, tmp_path, QUEEN_SERVER_ID="merge-a", **env)
    b = start_broker(db, tmp_path, QUEEN_SERVER_ID="merge-b", **env)
    try:
        maintenance(a.url, True)
        maintenance(b.url, True)
        order = []
        for i in range(10):
            broker = (a, b)[i % 2]
            assert push_one(broker.url, queue_name, "p", f"s{i:02d}") == "buffered"
            order.append(f"s{i:02d}")
        await spools_registered(db, queue_name, 2)
        # Tell A only: B keeps its flag until its reconcile loop, a minute away.
        r = httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": False}, timeout=10)
        assert r.status_code == 200
        rows = await wait_stored(db, queue_name, 1, timeout=10)
        assert [t for _, t in rows] == ["s00"]  # then A waits for B's s01
        assert push_one(a.url, queue_name, "p", "direct") == "buffered"  # behind the spools
        order.append("direct")
        maintenance(b.url, False)
        rows = await wait_stored(db, queue_name, 11, timeout=30)
        assert [t for _, t in rows] == order
        for broker in (a, b):
            assert httpx.get(broker.url + "/health").json()["spool"]["orderExceptions"] == 0
    finally:
        a.stop()
        b.stop()
