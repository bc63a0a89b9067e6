"""A PostgreSQL failover under a running broker: HA operated for real.

Real parts: a primary and a streaming standby (pg_basebackup -R, synchronous replication, so
an acknowledged ``queued`` push is on the standby before it is answered), a broker process
whose PG_HOST lists both. The primary is killed (immediate stop) and the standby promoted, as
Patroni or a managed service would. Invariants:

* every push answered queued or buffered is on the new primary exactly once, in push order;
* pushes during the failover are spooled (``buffered``), none is refused or a 500;
* a long poll parked across the failover is answered by a push made after it;
* the pool reconnects to the new primary by itself, /health and the log name it, and a
  leader job takes its advisory lock there;
* a broker pointed at the standby alone (PG_TARGET_SESSION_ATTRS=any) writes nothing to it:
  its pushes are spooled and land once that server is promoted.
"""
from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
from pathlib import Path

import asyncpg
import httpx
import pytest

from broker.store.embedded_pg import EmbeddedPostgres
from tests.conftest import Database, free_port, launch_broker, start_broker
from tests.waiting import wait_until, wait_until_async


@pytest.fixture
def pg_pair():
    root = Path(tempfile.mkdtemp(prefix="qfo", dir="/tmp"))
    primary = EmbeddedPostgres(root / "primary", port=free_port())
    standby = EmbeddedPostgres(root / "standby", port=free_port())
    primary.start()
    try:
        standby.clone_from(primary)
        standby.start()
        # After the clone, so that the standby does not inherit it (a promoted server that
        # waits for a synchronous standby of its own would never commit).
        sql(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        sql(primary, "SELECT pg_reload_conf()")
        wait_until(lambda: sql(primary, "SELECT sync_state FROM pg_stat_replication") == "sync",
                   30, "the standby replicating synchronously")
        yield primary, standby
    finally:
        for pg in (standby, primary):
            pg.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


def sql(pg: EmbeddedPostgres, statement: str):
    import asyncio

    async def run():
        conn = await asyncpg.connect(pg.dsn)
        try:
            return await conn.fetchval(statement)
        finally:
            await conn.close()
    return asyncio.run(run())


def database(pg: EmbeddedPostgres) -> Database:
    return Database(pg.host, pg.port, "postgres", "postgres", "postgres", embedded=pg)


async def stored(pg: EmbeddedPostgres, queue: str) -> list[str]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        rows = await conn.fetch(
            "SELECT m.transaction_id FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY m.seq", queue)
        return [r["transaction_id"] for r in rows]
    finally:
        await conn.close()


def answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
        return True
    except httpx.HTTPError:
        return False


def push(url: str, queue: str, txid: str) -> str:
    r = httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": "p", "transactionId": txid, "payload": {"t": txid}}]})
    assert r.status_code in (200, 201), r.text
    return r.json()[0]["status"]


async def test_a_failover_to_the_promoted_standby_loses_and_reorders_nothing(pg_pair, tmp_path):
    primary, standby = pg_pair
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    broker = start_broker(database(primary), tmp_path, PG_HOST=hosts,
                          DB_CONNECTION_TIMEOUT="500", RETENTION_INTERVAL="3600000")
    misdirected = launch_broker(database(standby), tmp_path, PG_TARGET_SESSION_ATTRS="any",
                                DB_CONNECTION_TIMEOUT="500")
    try:
        wait_until(lambda: answers(misdirected.url + "/health"), 90,
                   f"the misdirected broker serving:\n{misdirected.log()}")
        health = httpx.get(broker.url + "/health", timeout=10).json()
        assert health["databaseServer"]["address"] == f"127.0.0.1:{primary.port}"
        assert health["databaseServer"]["readOnly"] is False

        # The standby, reached by mistake: nothing is written there, pushes are spooled.
        r = httpx.get(misdirected.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["databaseServer"]["readOnly"] is True
        assert push(misdirected.url, "fo-misdirected", "m-0") == "buffered"

        acknowledged = []
        for i in range(5):
            assert push(broker.url, "fo-orders", f"before-{i}") == "queued"
            acknowledged.append(f"before-{i}")

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            parked = pool.submit(httpx.get, f"{broker.url}/api/v1/pop/queue/fo-wake",
                                 params={"wait": "true", "timeout": "90000"}, timeout=120)
            primary.stop(mode="immediate")  # the primary dies
            for i in range(5):
                assert push(broker.url, "fo-orders", f"down-{i}") == "buffered"
                acknowledged.append(f"down-{i}")
            standby.promote()  # the failover tool promotes the standby
            statuses = []
            for i in range(5):
                statuses.append(push(broker.url, "fo-orders", f"after-{i}"))
                acknowledged.append(f"after-{i}")
            assert set(statuses) <= {"queued", "buffered"}

            async def all_stored() -> bool:
                return len(await stored(standby, "fo-orders")) >= len(acknowledged)
            await wait_until_async(all_stored, 60, "every acknowledged push on the new primary")
            assert await stored(standby, "fo-orders") == acknowledged

            # The parked long poll rode it out: a push after the failover answers it.
            wait_until(lambda: push(broker.url, "fo-wake", "wake-0") == "queued", 30,
                       "a queued push on the new primary")
            answer = parked.result(timeout=60)
            assert answer.status_code == 200, answer.text
            assert [m["transactionId"] for m in answer.json()["messages"]] == ["wake-0"]

        health = httpx.get(broker.url + "/health", timeout=10)
        assert health.status_code == 200
        assert health.json()["databaseServer"]["address"] == f"127.0.0.1:{standby.port}"
        assert f"database: now on 127.0.0.1:{standby.port}" in broker.log()

        # A leader job takes its advisory lock on the new primary (the one it held on the old
        # one died with that session).
        jobs = broker.url + "/api/v1/system/jobs"
        ran = httpx.get(jobs, timeout=10).json()["retention"]["ran"]
        r = httpx.post(jobs + "/retention/run", timeout=30)
        assert r.status_code == 200, r.text
        retention = httpx.get(jobs, timeout=10).json()["retention"]
        assert retention["ran"] == ran + 1, retention

        # The misdirected broker's spooled push landed once its server became writable.
        async def misdirected_landed() -> bool:
            return await stored(standby, "fo-misdirected") == ["m-0"]
        await wait_until_async(misdirected_landed, 60, "the misdirected broker's push")
        wait_until(lambda: httpx.get(misdirected.url + "/health", timeout=10).status_code == 200,
                   30, "the misdirected broker healthy on the promoted server")
    finally:
        broker.stop()
        misdirected.stop()
