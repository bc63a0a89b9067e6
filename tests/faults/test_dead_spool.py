"""A spool whose disk is gone for good (a node replaced: its broker comes back with a new
spool id, or never): its rows in queen.spool_backlog, with real broker processes on a real
PostgreSQL (a database of each test's own, since the figures are cluster-wide).

The bound (docs/behaviour.md §5.8): a silent spool's rows hold a partition back from a broker
until FILE_BUFFER_ORDER_WAIT_MS after the later of the spool's last heartbeat and the start of
that broker's own run of heartbeats. A broker starts beating at its start, so a spool dead for
an hour still holds its partitions for that long after every broker start, until the
retention job removes it (FILE_BUFFER_ORDER_FORGET_MS) or an operator releases it.

Dead spools are fabricated through the store's own registration (``Store.register_spool``
under an id no broker has), their heartbeat then set back in time.
"""
from __future__ import annotations

import uuid

import asyncpg
import httpx

from broker.store.db import Store, now_us
from tests.conftest import Database, start_broker
from tests.waiting import wait_until_async

WAIT_MS = 5000  # long enough that a push right after a broker start comes within it


def push_one(url: str, queue: str, partition: str, txid: str) -> str:
    r = httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": partition, "transactionId": txid, "payload": {"t": txid}}]})
    assert r.status_code in (200, 201), r.text
    return r.json()[0]["status"]


async def dead_spool(database: Database, queue: str, partitions: list[str],
                     silent_s: float = 3600.0) -> str:
    """A spool holding ``partitions`` of ``queue`` whose last heartbeat was ``silent_s`` ago
    (PostgreSQL's clock), registered as a spool registers itself."""
    spool = f"gone-{uuid.uuid4().hex[:8]}"
    store = await Store.connect(database.dsn, pool_size=1, connect_timeout_ms=5000,
                                statement_timeout_ms=30000, lock_timeout_ms=10000,
                                idle_timeout_ms=30000)
    try:
        store.server_id = spool
        await store.register_spool({(queue, p): now_us() - 10_000_000 for p in partitions})
    finally:
        await store.close()
    conn = await asyncpg.connect(database.dsn)
    try:
        await conn.execute("UPDATE queen.spool_servers SET seen_at = now() - make_interval("
                           "secs => $2), since = now() - make_interval(secs => $2) "
                           "WHERE server_id = $1", spool, silent_s)
    finally:
        await conn.close()
    return spool


async def stored_at(database: Database, queue: str, txid: str):
    """When ``txid`` was stored in ``queue`` (PostgreSQL's clock), or None."""
    conn = await asyncpg.connect(database.dsn)
    try:
        return await conn.fetchval(
            "SELECT m.created_at FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id "
            "WHERE q.name = $1 AND m.transaction_id = $2", queue, txid)
    finally:
        await conn.close()


async def beating_since(database: Database, server_prefix: str):
    """The start of the run of heartbeats of the spool of broker ``server_prefix``."""
    conn = await asyncpg.connect(database.dsn)
    try:
        return await conn.fetchval("SELECT since FROM queen.spool_servers "
                                   "WHERE server_id LIKE $1 || '-%'", server_prefix)
    finally:
        await conn.close()


async def backlog_rows(database: Database, spool: str) -> int:
    conn = await asyncpg.connect(database.dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM queen.spool_backlog "
                                   "WHERE server_id = $1", spool)
    finally:
        await conn.close()


async def test_a_long_dead_spool_holds_its_partitions_for_the_order_wait_after_each_broker_start(
        fresh_database, tmp_path, queue_name):
    """A spool silent for an hour: a push through a broker that just started is staged behind
    it and stored FILE_BUFFER_ORDER_WAIT_MS after that broker began beating, a later push goes
    straight in, /health and Prometheus show the silent spool and its partition, and the same
    hold comes back after the broker restarts (the rows are never removed with
    FILE_BUFFER_ORDER_FORGET_MS=0)."""
    spool_dir = tmp_path / "spool-a"
    env = {"FILE_BUFFER_ORDER_WAIT_MS": str(WAIT_MS), "FILE_BUFFER_ORDER_FORGET_MS": "0",
           "FILE_BUFFER_DIR": str(spool_dir), "QUEEN_SERVER_ID": "bound-a"}
    dead = await dead_spool(fresh_database, queue_name, ["p"])
    a = start_broker(fresh_database, tmp_path, **env)
    try:
        since = await wait_until_async(lambda: beating_since(fresh_database, "bound-a"), 10,
                                       "the broker's spool beating")
        assert push_one(a.url, queue_name, "p", "t1") == "buffered"
        first = await wait_until_async(lambda: stored_at(fresh_database, queue_name, "t1"),
                                       WAIT_MS / 1000 + 20, "t1 stored", interval=0.1)
        assert (first - since).total_seconds() >= WAIT_MS / 1000  # held for the whole wait
        assert push_one(a.url, queue_name, "p", "t2") == "queued"

        holds = httpx.get(a.url + "/health", timeout=10).json()["spoolHolds"]
        assert holds["boundMs"] == WAIT_MS and holds["forgetMs"] == 0
        assert holds["silentSpools"] == 1 and holds["silentHeldPartitions"] == 1
        [spool] = holds["spools"]
        assert spool["spool"] == dead and spool["silent"] is True and spool["partitions"] == 1
        assert spool["silentSeconds"] >= 3600 and spool["lastHeartbeat"].endswith("Z")
        prom = httpx.get(a.url + "/metrics/prometheus", timeout=10).text
        assert "queen_spool_silent_held_partitions 1.0" in prom
        assert "queen_spool_silent_spools 1.0" in prom
    finally:
        a.stop()

    a = start_broker(fresh_database, tmp_path, **env)  # same spool, a new run of heartbeats
    try:
        assert push_one(a.url, queue_name, "p", "t3") == "buffered"
        await wait_until_async(lambda: stored_at(fresh_database, queue_name, "t3"),
                               WAIT_MS / 1000 + 20, "t3 stored", interval=0.1)
        assert await backlog_rows(fresh_database, dead) == 1
    finally:
        a.stop()


async def test_the_retention_job_removes_a_spool_silent_for_the_forget_time_for_good(
        fresh_database, tmp_path, queue_name):
    """With FILE_BUFFER_ORDER_FORGET_MS set, the retention job deletes the dead spool's rows
    (counted as expired holds) but no heartbeat row of a live broker; after a restart, a push
    to its partition goes straight in."""
    spool_dir = tmp_path / "spool-b"
    env = {"FILE_BUFFER_ORDER_WAIT_MS": "1000", "FILE_BUFFER_ORDER_FORGET_MS": "2000",
           "RETENTION_INTERVAL": "200", "FILE_BUFFER_DIR": str(spool_dir),
           "QUEEN_SERVER_ID": "forget-b"}
    dead = await dead_spool(fresh_database, queue_name, ["p", "q"])
    b = start_broker(fresh_database, tmp_path, **env)
    try:
        async def forgotten() -> bool:
            return await backlog_rows(fresh_database, dead) == 0
        await wait_until_async(forgotten, 20, "the dead spool's rows removed", interval=0.1)
        holds = httpx.get(b.url + "/health", timeout=10).json()["spoolHolds"]
        assert holds["spools"] == [] and holds["silentHeldPartitions"] == 0
        assert holds["ended"] == {"expired": 2, "released": 0}
        prom = httpx.get(b.url + "/metrics/prometheus", timeout=10).text
        assert 'queen_spool_holds_ended_total{reason="expired"} 2.0' in prom
        assert httpx.get(b.url + "/api/v1/system/jobs", timeout=10).json()[
            "retention"]["spoolsForgotten"] == 1
        assert await beating_since(fresh_database, "forget-b") is not None
        assert f"spool {dead} was silent" in b.log()
    finally:
        b.stop()
    b = start_broker(fresh_database, tmp_path, **env)
    try:
        assert push_one(b.url, queue_name, "p", "after") == "queued"
    finally:
        b.stop()


async def test_the_retention_job_forgets_no_spool_before_it_reached_the_database_for_the_wait(
        fresh_database):
    """After an outage no spool could beat: the job removes nothing until its own cycles have
    reached the database for FILE_BUFFER_ORDER_WAIT_MS, time for every live spool to beat."""
    from actors.leader_jobs import RetentionJob
    from broker.store.schema import apply_schema

    conn = await asyncpg.connect(fresh_database.dsn)
    try:
        await apply_schema(conn)
    finally:
        await conn.close()
    dead = await dead_spool(fresh_database, "forget-guard", ["p"])
    store = await Store.connect(fresh_database.dsn, pool_size=2, connect_timeout_ms=5000,
                                statement_timeout_ms=30000, lock_timeout_ms=10000,
                                idle_timeout_ms=30000)
    try:
        job = RetentionJob(store, interval_ms=3_600_000, batch_size=100,
                           partition_cleanup_days=30, metrics_retention_days=90,
                           spool_forget_ms=2000, spool_wait_ms=1000)
        first = await job.run_once()
        assert first["spoolsForgotten"] == [], first
        assert await backlog_rows(fresh_database, dead) == 1

        async def removed() -> bool:
            return (await job.run_once()).get("spoolsForgotten") == [dead]
        await wait_until_async(removed, 10, "the dead spool removed once the wait passed",
                               interval=0.1)
        assert await backlog_rows(fresh_database, dead) == 0
    finally:
        await store.close()
