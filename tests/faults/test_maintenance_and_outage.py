"""Maintenance modes, the disk spool and a PostgreSQL outage, with real broker
processes and a real PostgreSQL that these tests stop and start.

Invariant above all: every push the broker acknowledged (queued or buffered)
ends up in PostgreSQL exactly once, in per-partition push order.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time

import asyncpg
import httpx
import pytest

from tests.conftest import Database, start_broker
from tests.waiting import wait_until_async


@pytest.fixture
def db(stoppable_db: Database) -> Database:
    return stoppable_db


@pytest.fixture
def brokers(tmp_path):
    started = []

    def make(database: Database, **env: str):
        b = start_broker(database, tmp_path, **env)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


async def stored(db: Database, queue: str) -> list[tuple[str, str]]:
    """(partition, transactionId) of every stored message, in position order."""
    conn = await asyncpg.connect(db.dsn)
    try:
        rows = await conn.fetch(
            "SELECT p.name, m.transaction_id FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY p.name, m.seq",
            queue)
        return [(r["name"], r["transaction_id"]) for r in rows]
    finally:
        await conn.close()


async def stored_ids(db: Database, queue: str) -> dict[str, str]:
    """transactionId -> message id of every stored message of ``queue``."""
    conn = await asyncpg.connect(db.dsn)
    try:
        rows = await conn.fetch(
            "SELECT m.transaction_id, m.id FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1", queue)
        return {r["transaction_id"]: str(r["id"]) for r in rows}
    finally:
        await conn.close()


async def stored_at_least(db: Database, queue: str, n: int, timeout: float) -> None:
    """Wait until ``n`` messages of ``queue`` are stored (a spool drains in the background)."""
    async def enough() -> bool:
        return len(await stored(db, queue)) >= n
    await wait_until_async(enough, timeout, f"{n} stored messages of {queue}", interval=0.1)


def push(url: str, queue: str, partition: str, txids: list[str]) -> httpx.Response:
    return httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}
        for t in txids]})


def maintenance(url: str, enabled) -> httpx.Response:
    return httpx.post(url + "/api/v1/system/maintenance", json={"enabled": enabled}, timeout=10)


def test_maintenance_requires_a_boolean(db, brokers):
    b = brokers(db)
    for body in ({}, {"enabled": "yes"}, {"enabled": 1}):
        r = maintenance(b.url, body.get("enabled")) if body else httpx.post(
            b.url + "/api/v1/system/maintenance", json=body)
        assert r.status_code == 400 and r.json() == {"error": "enabled (boolean) is required"}


async def test_pushes_during_maintenance_are_buffered_then_land_in_order(db, brokers, queue_name):
    """Invariants 39 and 40."""
    b = brokers(db)
    assert maintenance(b.url, True).json()["maintenanceMode"] is True
    try:
        expected = []
        for batch in range(5):
            for part in ("p1", "p2"):
                txids = [f"{part}-{batch}-{i}" for i in range(3)]
                r = push(b.url, queue_name, part, txids)
                assert r.status_code == 201
                assert {x["status"] for x in r.json()} == {"buffered"}
                expected += [(part, t) for t in txids]
        assert await stored(db, queue_name) == []
        state = httpx.get(b.url + "/api/v1/system/maintenance").json()
        assert state["maintenanceMode"] is True and state["bufferedMessages"] == 30
    finally:
        r = maintenance(b.url, False)
        assert "DISABLED" in r.json()["message"]
    await stored_at_least(db, queue_name, 30, 15)
    assert await stored(db, queue_name) == sorted(expected, key=lambda x: x[0])


async def test_a_buffered_push_answers_the_id_it_is_popped_with_after_the_drain(
        db, brokers, queue_name):
    """A push spooled under maintenance answers a message_id, as a queued one does; the
    drain stores it under that id, so a pop hands it out with it."""
    b = brokers(db)
    assert maintenance(b.url, True).json()["maintenanceMode"] is True
    try:
        r = push(b.url, queue_name, "p", ["m-0", "m-1"])
        assert r.status_code == 201
        answered = {x["transactionId"]: x["message_id"] for x in r.json()}
        assert {x["status"] for x in r.json()} == {"buffered"}
        assert len(set(answered.values())) == 2 and all(answered.values())
    finally:
        maintenance(b.url, False)
    await stored_at_least(db, queue_name, 2, 15)
    popped = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}", params={"batch": 10},
                       timeout=10).json()["messages"]
    assert {m["transactionId"]: m["id"] for m in popped} == answered


async def test_pushes_while_postgres_is_down_are_buffered_and_arrive_once(db, brokers, queue_name):
    """Invariant 42, and recovery without a restart."""
    b = brokers(db, DB_CONNECTION_TIMEOUT="500")
    assert push(b.url, queue_name, "p", ["before"]).status_code == 200
    db.embedded.stop(mode="immediate")
    try:
        buffered, answered_ids = [], {}
        for i in range(10):
            r = push(b.url, queue_name, "p", [f"down-{i}"])
            assert r.status_code == 201, r.text
            assert r.json()[0]["status"] == "buffered"
            buffered.append(f"down-{i}")
            answered_ids[f"down-{i}"] = r.json()[0]["message_id"]
        # Non-waiting pops and acks answer 503 with a clear error while it is down.
        r = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}", timeout=10)
        assert r.status_code == 503 and "error" in r.json()
        health = httpx.get(b.url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["database"] == "disconnected"
    finally:
        db.embedded.start()
    await stored_at_least(db, queue_name, 11, 30)
    got = [t for _, t in await stored(db, queue_name)]
    assert got == ["before", *buffered]
    # each stored under the id its buffered answer gave
    assert {t: i for t, i in (await stored_ids(db, queue_name)).items()
            if t != "before"} == answered_ids
    # Recovered by itself: normal pushes are queued again.
    assert push(b.url, queue_name, "p", ["after"]).json()[0]["status"] == "queued"


def test_long_poll_rides_out_an_outage_and_answers_empty(db, brokers, queue_name):
    b = brokers(db, DB_CONNECTION_TIMEOUT="500")
    db.embedded.stop(mode="immediate")
    try:
        r = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}",
                      params={"wait": "true", "timeout": "1500"}, timeout=20)
        assert r.status_code == 200 and r.json()["messages"] == []
    finally:
        db.embedded.start()


async def test_kill_9_with_undrained_spool_then_restart_drains_everything(db, tmp_path, queue_name):
    env = {"FILE_BUFFER_DIR": str(tmp_path / "spool")}
    b = start_broker(db, tmp_path, **env)
    try:
        maintenance(b.url, True)
        txids = [f"k-{i}" for i in range(20)]
        for t in txids:
            assert push(b.url, queue_name, "p", [t]).json()[0]["status"] == "buffered"
        os.kill(b.proc.pid, signal.SIGKILL)
        b.proc.wait(10)
    finally:
        b.stop()
    # The flag is in PostgreSQL: switch it off there, then restart the broker.
    conn = await asyncpg.connect(db.dsn)
    await conn.execute("UPDATE queen.system_state SET value = '{\"enabled\": false}' "
                       "WHERE key = 'maintenance_mode'")
    await conn.close()
    b2 = start_broker(db, tmp_path, **env)
    try:
        await stored_at_least(db, queue_name, 20, 15)
        assert [t for _, t in await stored(db, queue_name)] == txids
    finally:
        b2.stop()


def test_unwritable_spool_reports_each_item_failed(db, brokers, tmp_path, queue_name):
    spool_dir = tmp_path / "spool-broken"
    b = brokers(db, FILE_BUFFER_DIR=str(spool_dir))
    maintenance(b.url, True)
    try:
        shutil.rmtree(spool_dir)
        spool_dir.write_text("not a directory")  # every file operation now fails
        r = push(b.url, queue_name, "p", ["x1", "x2"])
        assert r.status_code == 503 and r.headers["retry-after"] == "1"  # not acknowledged
        body = r.json()
        assert [x["status"] for x in body] == ["failed", "failed"]
        assert all(x["error"] for x in body)
    finally:
        spool_dir.unlink()
        spool_dir.mkdir()
        maintenance(b.url, False)


async def test_order_holds_when_pushes_continue_while_the_spool_drains(db, brokers, queue_name):
    """Pushes acknowledged after PostgreSQL returns queue behind the ones the
    spool still holds for the same partition: per-partition order is the order
    of acknowledgement."""
    b = brokers(db, DB_CONNECTION_TIMEOUT="500")
    sent = []

    def send(txid: str) -> str:
        sent.append(txid)
        return push(b.url, queue_name, "p", [txid]).json()[0]["status"]

    assert send("before") == "queued"
    db.embedded.stop(mode="immediate")
    try:
        assert {send(f"down-{i}") for i in range(20)} == {"buffered"}
    finally:
        db.embedded.start()
    statuses = {send(f"after-{i}") for i in range(20)}  # at once, while the spool drains
    assert statuses <= {"queued", "buffered"}
    await stored_at_least(db, queue_name, len(sent), 30)
    assert [t for _, t in await stored(db, queue_name)] == sent


async def test_an_outage_reads_as_a_few_clear_lines_without_tracebacks(db, brokers, queue_name):
    """While PostgreSQL is down, requests keep failing (503) and asyncpg keeps retrying its
    pool; the log says so in three lines: down, back (with how long and counts),
    drained (with counts), and no traceback. The other parts that meet the outage (the timer
    sweeper, the staging merger, the jobs, the spool's registration, the pool) say it at
    DEBUG only."""
    b = brokers(db, DB_CONNECTION_TIMEOUT="500")
    assert push(b.url, queue_name, "p", ["before"]).status_code == 200
    mark = len(b.log())
    db.embedded.stop(mode="immediate")
    try:
        for i in range(10):
            assert push(b.url, queue_name, "p", [f"down-{i}"]).status_code == 201
        for _ in range(30):
            assert httpx.get(f"{b.url}/api/v1/resources/queues", timeout=10).status_code == 503
        # the spool's drain loop (every 100 ms) has met the outage too
        await wait_until_async(
            lambda: httpx.get(b.url + "/health", timeout=10).json()["spool"]["dbHealthy"] is False,
            15, "the spool retrying")
        # long enough for the timer sweeper, the merger and the retention job to meet it
        await asyncio.sleep(6)
    finally:
        db.embedded.start()
    await stored_at_least(db, queue_name, 11, 30)
    await wait_until_async(lambda: "spool: drained" in b.log(), 30, "the drained line")
    outage = b.log()[mark:]
    assert "Traceback" not in outage, outage
    assert "database: unreachable" in outage
    back = [line for line in outage.splitlines() if "database: reachable again" in line]
    assert len(back) == 1 and "10 push item(s) spooled meanwhile" in back[0], outage
    drained = [line for line in outage.splitlines() if "spool: drained" in line]
    assert len(drained) == 1 and "10 event(s) stored, 0 quarantined" in drained[0], outage
    # 40 failed requests, background jobs and a retrying pool, yet one warning
    warnings = [line for line in outage.splitlines() if " WARNING " in line or " ERROR " in line]
    assert len(warnings) == 1 and "database: unreachable" in warnings[0], "\n".join(warnings)
    back_at = next(n for n, line in enumerate(outage.splitlines()) if "reachable again" in line)
    after = [line for line in outage.splitlines()[back_at + 1:]
             if "spool:" in line or "retention" in line or "stats" in line]
    assert [line for line in after if "succeed again" in line or "registered" in line] == []


async def test_a_spool_left_at_shutdown_is_told_and_its_drain_timed_from_the_first_push(
        db, tmp_path, queue_name):
    """A broker stopped while pushes wait in its spool says how many and where,
    and the next start's "drained" line counts from the first spooled push (read from the
    spool), not from that start."""
    spool = tmp_path / "spool"
    b = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(spool), DB_CONNECTION_TIMEOUT="500")
    db.embedded.stop(mode="immediate")
    try:
        first_at = time.time()
        for i in range(5):
            assert push(b.url, queue_name, "p", [f"s-{i}"]).json()[0]["status"] == "buffered"
        b.stop()
        assert b.proc.returncode == 0
        told = [line for line in b.log().splitlines() if "stopping with" in line]
        assert len(told) == 1 and "5 event(s) still spooled" in told[0], b.log()
        assert str(spool) in told[0] and "next start" in told[0], told[0]
        await asyncio.sleep(4)  # the gap the drained line must include
    finally:
        db.embedded.start()
    b2 = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(spool))
    try:
        await stored_at_least(db, queue_name, 5, 30)
        await wait_until_async(lambda: "spool: drained" in b2.log(), 30, "the drained line")
        [line] = [line for line in b2.log().splitlines() if "spool: drained" in line]
        took = float(re.search(r"([0-9.]+) s after the first was spooled", line)[1])
        assert "5 event(s) stored" in line
        assert took >= 4 and took <= time.time() - first_at + 1, line
    finally:
        b2.stop()
