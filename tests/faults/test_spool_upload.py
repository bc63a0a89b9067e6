"""The spool's drain through PostgreSQL's staging table (docs/spool-drain.md), with
real broker processes on one real PostgreSQL.

Invariants:

* a broker killed while its upload runs loses nothing and stores nothing twice:
  the upload is one transaction, and the file is deleted only after it committed;
* the same transactionId accepted by two brokers' spools (and one stored before
  the outage) is stored once: the first accepted copy wins, whichever spool held it;
* a direct push to a partition with staged pushes is staged behind them
  (answered ``buffered``), and lands after them.
"""
from __future__ import annotations

import asyncio
import os
import signal

import asyncpg
import httpx

from tests.conftest import start_broker
from tests.faults.test_maintenance_and_outage import db, maintenance, stored  # noqa: F401
from tests.faults.test_spool_order import push_one, spools_registered, wait_stored
from tests.waiting import wait_until_async


async def test_a_broker_killed_during_its_upload_loses_and_repeats_nothing(
        db, tmp_path, queue_name):  # noqa: F811
    spool_dir = tmp_path / "spool"
    a = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(spool_dir), QUEEN_SERVER_ID="up-a")
    sent = [f"u{i:03d}" for i in range(200)]
    blocker = await asyncpg.connect(db.dsn)
    try:
        maintenance(a.url, True)
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as http:
            for n in range(0, len(sent), 50):
                r = await http.post("/api/v1/push", json={"items": [
                    {"queue": queue_name, "partition": f"p{i % 3}", "transactionId": t,
                     "payload": {"t": t}} for i, t in enumerate(sent[n:n + 50], start=n)]})
                assert r.status_code == 201 and {x["status"] for x in r.json()} == {"buffered"}
        # Hold the staging table: the upload's COPY waits on this lock, inside its
        # transaction, with its ledger row written and nothing committed.
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE queen.staged IN EXCLUSIVE MODE")
        maintenance(a.url, False)

        async def upload_waiting() -> bool:
            # (not on the blocker: inside a transaction pg_stat_activity is one snapshot)
            watcher = await asyncpg.connect(db.dsn)
            try:
                return bool(await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'COPY%staged%'"))
            finally:
                await watcher.close()
        await wait_until_async(upload_waiting, 30, "the upload's COPY waiting on the lock")
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(10)
        await tx.rollback()
        assert await blocker.fetchval("SELECT count(*) FROM queen.uploaded_files") == 0
        assert await blocker.fetchval("SELECT count(*) FROM queen.staged") == 0

        a = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(spool_dir), QUEEN_SERVER_ID="up-a2")
        rows = await wait_stored(db, queue_name, len(sent), timeout=60)
        assert sorted(t for _, t in rows) == sent  # each once
        for p in range(3):
            assert [t for q, t in rows if q == f"p{p}"] == sent[p::3]
        # A clean stop leaves no registration behind (it would hold the partitions
        # until the spool is taken for dead).
        a.stop()
        assert await blocker.fetchval("SELECT count(*) FROM queen.spool_backlog "
                                      "WHERE queue_name = $1", queue_name) == 0
    finally:
        await blocker.close()
        a.stop()


async def test_duplicate_transaction_ids_across_spools_are_stored_once_first_accepted_wins(
        db, tmp_path, queue_name):  # noqa: F811
    env = {"QUEEN_CACHE_REFRESH_INTERVAL_MS": "60000"}
    a = start_broker(db, tmp_path, QUEEN_SERVER_ID="dup-a", **env)
    b = start_broker(db, tmp_path, QUEEN_SERVER_ID="dup-b", **env)

    def push(broker, txid: str, origin: str) -> str:
        r = httpx.post(broker.url + "/api/v1/push", timeout=30, json={"items": [
            {"queue": queue_name, "partition": "p", "transactionId": txid,
             "payload": {"from": origin}}]})
        assert r.status_code in (200, 201), r.text
        return r.json()[0]["status"]

    try:
        assert push(a, "stored-before", "before") == "queued"
        maintenance(a.url, True)
        maintenance(b.url, True)
        # Accept order: b's x1, a's x1, a's x2, b's x2, both "stored-before".
        assert push(b, "x1", "b") == "buffered"
        assert push(a, "x1", "a") == "buffered"
        assert push(a, "x2", "a") == "buffered"
        assert push(b, "x2", "b") == "buffered"
        assert push(a, "stored-before", "a") == "buffered"
        assert push(b, "stored-before", "b") == "buffered"
        await spools_registered(db, queue_name, 2)
        maintenance(a.url, False)
        maintenance(b.url, False)

        conn = await asyncpg.connect(db.dsn)
        try:
            async def drained() -> bool:
                left = await conn.fetch("SELECT * FROM queen.spool_backlog WHERE queue_name = $1",
                                        queue_name)
                return (await conn.fetchval("SELECT count(*) FROM queen.staged") == 0
                        and not left)
            try:
                await wait_until_async(drained, 30, "staging and every spool empty")
            except AssertionError:
                print("LEFT", await conn.fetch("SELECT * FROM queen.spool_backlog"),
                      await conn.fetch("SELECT * FROM queen.staged_partitions"))
                raise
            rows = await conn.fetch(
                "SELECT m.transaction_id, m.payload->>'from' AS origin, m.seq "
                "FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY m.seq",
                queue_name)
        finally:
            await conn.close()
        assert [(r["transaction_id"], r["origin"]) for r in rows] == [
            ("stored-before", "before"), ("x1", "b"), ("x2", "a")]
        assert [r["seq"] for r in rows] == [1, 2, 3]
        staging = [httpx.get(x.url + "/health").json()["spool"]["staging"] for x in (a, b)]
        # a's x1 behind b's, b's x2 behind a's, and both copies of "stored-before"
        assert sum(s["duplicatesDropped"] for s in staging) == 4, staging
        assert sum(s["orderExceptions"] for s in staging) == 0
    finally:
        a.stop()
        b.stop()


async def test_a_direct_push_behind_staged_pushes_is_staged_and_lands_after_them(
        db, tmp_path, queue_name):  # noqa: F811
    """A holds spooled pushes (maintenance, registered); B is not in maintenance:
    B's direct push to the same partition is staged behind A's, not committed
    ahead of them, and not spooled on B's disk."""
    env = {"QUEEN_CACHE_REFRESH_INTERVAL_MS": "60000"}
    a = start_broker(db, tmp_path, QUEEN_SERVER_ID="st-a", **env)
    b = start_broker(db, tmp_path, QUEEN_SERVER_ID="st-b", **env)
    try:
        r = httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": True}, timeout=10)
        assert r.status_code == 200
        for i in range(3):
            assert push_one(a.url, queue_name, "p", f"a{i}") == "buffered"
        await spools_registered(db, queue_name, 1)
        assert push_one(b.url, queue_name, "p", "b-direct") == "buffered"
        assert push_one(b.url, queue_name, "other", "b-free") == "queued"  # not held
        b_spool = httpx.get(b.url + "/health").json()["spool"]
        assert b_spool["pendingCount"] == 0  # staged in PostgreSQL, not on B's disk
        conn = await asyncpg.connect(db.dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM queen.staged") == 1
        finally:
            await conn.close()
        maintenance(a.url, False)
        rows = await wait_stored(db, queue_name, 5, timeout=30)
        assert [t for p, t in rows if p == "p"] == ["a0", "a1", "a2", "b-direct"]
    finally:
        a.stop()
        b.stop()


async def test_json_values_still_work_on_the_connection_that_uploaded(
        db, tmp_path, queue_name):  # noqa: F811
    """The upload switches its connection's jsonb codec to binary for COPY; the
    pooled connection must come back with the pool's codec (Python values in and
    out), or the next JSON-valued statement on it is refused. The smallest pool
    (two connections) and a put on each, so the upload's connection is used."""
    a = start_broker(db, tmp_path, DB_POOL_SIZE="2", QUEEN_SERVER_ID="codec-a")
    try:
        maintenance(a.url, True)
        assert push_one(a.url, queue_name, "p", "c0") == "buffered"
        maintenance(a.url, False)
        rows = await wait_stored(db, queue_name, 1, timeout=30)
        assert [t for _, t in rows] == ["c0"]
        async with httpx.AsyncClient(base_url=a.url, timeout=10) as http:
            async def put_get(n: int) -> None:
                r = await http.post("/api/v1/kv", json={"operations": [
                    {"op": "put", "ns": f"codec-{queue_name}", "key": f"k{n}", "value": {"n": n},
                     "forever": True},
                    {"op": "get", "ns": f"codec-{queue_name}", "key": f"k{n}"}]})
                assert r.status_code == 200, r.text
                assert r.json()["results"][1]["value"] == {"n": n}
            await asyncio.gather(*(put_get(n) for n in range(16)))  # both connections busy
    finally:
        a.stop()
