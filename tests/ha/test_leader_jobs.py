"""Leader-gated background jobs with two or three real brokers on one PostgreSQL
(docs/behaviour.md §7, §14 invariants 50-57).

Every test gets an empty database (``fresh_database``) and its own brokers with
short cadences, so other tests' data and cadence do not interfere. The job
counters come from ``GET /api/v1/system/jobs``; the locks are read from
``pg_locks`` joined with ``pg_stat_activity`` (broker sessions are named
``queen-broker:<server id>``).
"""
from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import httpx
import pytest

from tests.conftest import start_broker
from tests.waiting import wait_until_async

RETENTION_LOCK = 737001
STATS_LOCK = 737002
FAST = {"RETENTION_INTERVAL": "200", "STATS_INTERVAL_MS": "1000", "METRICS_FLUSH_MS": "1000"}

HOLDERS = """
SELECT a.pid, a.application_name, a.state, a.xact_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = $1 AND l.objsubid = 1
  AND l.granted AND a.application_name LIKE 'queen-broker%'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
"""Broker sessions holding advisory lock $1 in this test's database (advisory locks
are per database; brokers of other tests use other databases of the same server).
A bigint key shows as classid = high half, objid = low half, objsubid = 1."""

LOCKED_BY = """
SELECT statement_timestamp() AS at, array_agg(l.pid) FILTER (WHERE l.pid IS NOT NULL) AS pids
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = $1 AND l.objsubid = 1
  AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
"""The sessions holding advisory lock $1 in this test's database, and when the statement that
read them started (before pg_locks was read)."""

SESSIONS = """
SELECT pid, state, state_change FROM pg_stat_activity
WHERE pid = ANY($1::int[]) AND application_name LIKE 'queen-broker%'
"""
"""Those sessions' states, read in a statement of their own (pg_stat_activity is read once per
transaction, so a later read is a later picture)."""


@pytest.fixture
def cluster(fresh_database, tmp_path):
    started = []

    def start(n: int = 1, **env: str):
        brokers = [start_broker(fresh_database, tmp_path, **{**FAST, **env}) for _ in range(n)]
        started.extend(brokers)
        return brokers

    yield start
    for b in started:
        b.stop()


@pytest.fixture
async def db(fresh_database):
    conn = await asyncpg.connect(fresh_database.dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


# -- helpers ------------------------------------------------------------------

async def jobs(client, b) -> dict:
    r = await client.get(f"{b.url}/api/v1/system/jobs")
    assert r.status_code == 200, r.text
    return r.json()


async def total(client, brokers, job: str, key: str) -> int:
    return sum([(await jobs(client, b))[job][key] for b in brokers])


async def _ran_at_least(client, brokers, job: str, n: int) -> bool:
    return await total(client, brokers, job, "ran") >= n


async def configure(client, b, queue: str, **options):
    r = await client.post(f"{b.url}/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text


async def push(client, b, queue: str, n: int, partition: str | None = None, start: int = 0):
    items = [{"queue": queue, "payload": {"i": start + i},
              **({"partition": partition} if partition else {})} for i in range(n)]
    r = await client.post(f"{b.url}/api/v1/push", json={"items": items})
    assert r.status_code == 200, r.text
    assert all(x["status"] == "queued" for x in r.json()), r.text


async def pop(client, b, queue: str, partition: str | None = None, **params) -> list[dict]:
    params = {"wait": "false", **params}
    path = f"/api/v1/pop/queue/{queue}" + (f"/partition/{partition}" if partition else "")
    r = await client.get(b.url + path, params=params)
    assert r.status_code == 200, r.text
    return r.json().get("messages", [])


async def ack(client, b, msgs: list[dict], group: str | None = None, status: str = "completed"):
    for m in msgs:
        r = await client.post(f"{b.url}/api/v1/ack", json={
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": status, "consumerGroup": group})
        assert r.status_code == 200 and r.json()[0]["success"], r.text


async def consume(client, b, queue: str, n: int, group: str | None = None,
                  partition: str | None = None) -> list[dict]:
    params = {"batch": n, **({"consumerGroup": group} if group else {})}
    msgs = await pop(client, b, queue, partition, **params)
    assert len(msgs) == n, msgs
    await ack(client, b, msgs, group)
    return msgs


async def refresh(client, b, **body) -> dict:
    """A stats cycle on broker b that ran (a skip because another replica was in
    its cycle at that instant is retried)."""
    for _ in range(50):
        r = await client.post(f"{b.url}/api/v1/stats/refresh", json=body or None)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["success"] is True and isinstance(answer["durationMs"], (int, float))
        if not answer["skipped"]:
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError("stats refresh kept skipping")


async def seqs(db, queue: str, partition: str = "Default") -> list[int]:
    rows = await db.fetch("""
        SELECT m.seq FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
        JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1 AND p.name = $2 ORDER BY m.seq""", queue, partition)
    return [r["seq"] for r in rows]


async def history(db, queue: str, kind: str) -> int:
    return await db.fetchval("""SELECT coalesce(sum(messages_deleted), 0) FROM queen.retention_history
                                WHERE queue_name = $1 AND retention_type = $2""", queue, kind)


async def history_reaches(db, queue: str, kind: str, expected: int) -> int:
    """The sweep deletes, then records the cycle's history in its next statement:
    an observer can see the rows gone a moment before the history row lands."""
    await wait_until_async(lambda: _history_is(db, queue, kind, expected), 5, interval=0.1)
    return await history(db, queue, kind)


async def _history_is(db, queue: str, kind: str, expected: int) -> bool:
    return await history(db, queue, kind) == expected


# -- retention gate: lock 737001 ----------------------------------------------------

async def test_replica_without_737001_skips_and_deletes_nothing_then_sweeps(cluster, client, db):
    """Inv. 50, 52, 54: while another session holds 737001 every replica skips and
    nothing is deleted (stats cycles still run); once it is free one replica sweeps."""
    brokers = cluster(3)
    b = brokers[0]
    await configure(client, b, "ret.all", retentionEnabled=True, retentionSeconds=1)
    await db.execute("SELECT pg_advisory_lock($1)", RETENTION_LOCK)
    try:
        await push(client, b, "ret.all", 5)
        ran = await total(client, brokers, "retention", "ran")
        skipped = await total(client, brokers, "retention", "skipped")
        stats_ran = await total(client, brokers, "stats", "ran")
        await asyncio.sleep(2.2)  # the messages are now older than retentionSeconds
        assert await seqs(db, "ret.all") == [1, 2, 3, 4, 5]
        assert await total(client, brokers, "retention", "ran") == ran
        for each in brokers:  # every replica tried, and skipped
            assert (await jobs(client, each))["retention"]["skipped"] > 0
        assert await total(client, brokers, "retention", "skipped") >= skipped + 3 * 5
        # holding 737001 does not stop the stats job
        assert await total(client, brokers, "stats", "ran") > stats_ran
        assert (await refresh(client, brokers[1]))["skipped"] is False
        assert await history(db, "ret.all", "retention") == 0
    finally:
        assert await db.fetchval("SELECT pg_advisory_unlock($1)", RETENTION_LOCK)
    await wait_until_async(lambda: _empty(db, "ret.all"), 5, interval=0.1)
    assert await history_reaches(db, "ret.all", "retention", 5) == 5


async def _empty(db, queue: str) -> bool:
    return not await seqs(db, queue)


async def test_one_sweeper_at_a_time_and_737001_released_even_by_failing_cycles(
        cluster, client, db, fresh_database):
    """Inv. 51, 52: with three replicas at 200 ms, pg_locks never shows two broker
    holders of 737001; cycles that fail midway (a step times out on a table lock)
    still release it: other replicas' cycles are skips while one is in its cycle,
    and once the table is free every replica sweeps again."""
    brokers = cluster(3, DB_LOCK_TIMEOUT="400")
    samples: list[int] = []

    async def sample(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            samples.append(len(await db.fetch(HOLDERS, RETENTION_LOCK)))
            await asyncio.sleep(0.01)

    await sample(1.0)
    assert max(samples) <= 1 and samples.count(0) > 0

    # Make the purge step fail: it waits 400 ms for a table we lock, then errors.
    blocker = await asyncpg.connect(fresh_database.dsn)
    failures = await total(client, brokers, "retention", "failures")
    skipped = await total(client, brokers, "retention", "skipped")
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE queen.retention_history IN ACCESS EXCLUSIVE MODE")
        samples.clear()
        await sample(2.5)
        assert max(samples) <= 1
        assert await total(client, brokers, "retention", "failures") > failures
        # the cycles overlap now (each holds the lock ~400 ms): concurrent ones skip
        assert await total(client, brokers, "retention", "skipped") > skipped
        await tx.rollback()
    finally:
        await blocker.close()
    ran = [(await jobs(client, b))["retention"]["ran"] for b in brokers]

    async def all_swept_again() -> bool:
        now = [(await jobs(client, b))["retention"]["ran"] for b in brokers]
        return all(n > before for n, before in zip(now, ran))

    await wait_until_async(all_swept_again, 5, interval=0.1)
    samples.clear()
    await sample(1.0)
    assert max(samples) <= 1 and samples.count(0) > 0
    for b in brokers:
        r = (await jobs(client, b))["retention"]
        assert r["unlockNotHeld"] == 0 and r["connectionsDiscarded"] == 0


async def test_737001_is_not_held_after_a_failing_or_successful_cycle(cluster, client, db,
                                                                       fresh_database):
    """Inv. 51, deterministic: one broker whose periodic sweep is far away runs
    cycles on demand; right after each (failing midway or not) no broker session
    holds 737001, and the job's connection went back to a usable pool."""
    (b,) = cluster(1, RETENTION_INTERVAL="3600000", DB_LOCK_TIMEOUT="300")
    run = f"{b.url}/api/v1/system/jobs/retention/run"
    blocker = await asyncpg.connect(fresh_database.dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE queen.worker_metrics IN ACCESS EXCLUSIVE MODE")
        for _ in range(3):
            result = (await client.post(run)).json()
            assert "error" in result and "lock" in result["error"].lower(), result
            assert await db.fetch(HOLDERS, RETENTION_LOCK) == []
        await tx.rollback()
    finally:
        await blocker.close()
    for _ in range(3):
        result = (await client.post(run)).json()
        assert result["skipped"] is False and "error" not in result, result
        assert await db.fetch(HOLDERS, RETENTION_LOCK) == []
    stats = (await jobs(client, b))["retention"]
    assert stats["failures"] == 3 and stats["ran"] == 3 and stats["unlockNotHeld"] == 0
    # and the test's own session can take it at once: nobody holds it
    assert await db.fetchval("SELECT pg_try_advisory_lock($1)", RETENTION_LOCK)
    assert await db.fetchval("SELECT pg_advisory_unlock($1)", RETENTION_LOCK)


# -- stats gate: lock 737002 ----------------------------------------------------------

async def test_stats_skip_while_737002_held_and_retention_keeps_running(cluster, client, db):
    """Inv. 53, 54: a replica that cannot take 737002 skips (and says so); retention
    is not held up meanwhile; the lock is only ever held inside a transaction."""
    brokers = cluster(2)
    tx = db.transaction()
    await tx.start()
    await db.fetchval("SELECT pg_advisory_xact_lock($1)", STATS_LOCK)
    try:
        ran = await total(client, brokers, "retention", "ran")
        stats_ran = await total(client, brokers, "stats", "ran")
        for b in brokers:
            r = await client.post(f"{b.url}/api/v1/stats/refresh")
            assert r.status_code == 200 and r.json()["success"] is True
            assert r.json()["skipped"] is True
        # The signal: each broker's scheduled stats cycle came and skipped too (2 more skips
        # than the refreshes), and retention kept sweeping meanwhile (4 cycles).
        async def both_jobs_cycled() -> bool:
            return (await total(client, brokers, "stats", "skipped") >= 2 + 2
                    and await total(client, brokers, "retention", "ran") >= ran + 4)

        await wait_until_async(both_jobs_cycled, 15, "scheduled stats skips, retention sweeps",
                               interval=0.1)
        assert await total(client, brokers, "stats", "ran") == stats_ran
    finally:
        await tx.rollback()
    for b in brokers:
        assert (await refresh(client, b))["skipped"] is False

    # Sample the lock while both brokers refresh in a loop. A holder is outside a
    # transaction when its session, read after the lock was seen, has been idle since
    # before the lock was read: a transaction lock's holder is never idle while it holds it,
    # and one seen just before its COMMIT went idle after the read.
    seen = held_outside = 0

    async def hammer(b) -> None:
        for _ in range(20):
            await client.post(f"{b.url}/api/v1/stats/refresh")

    async def sample() -> None:
        nonlocal seen, held_outside
        for _ in range(200):
            locked = await db.fetchrow(LOCKED_BY, STATS_LOCK)
            if locked["pids"]:
                sessions = await db.fetch(SESSIONS, locked["pids"])
                seen += len(sessions)
                held_outside += sum(s["state"] == "idle" and s["state_change"] < locked["at"]
                                    for s in sessions)
            await asyncio.sleep(0.005)

    await asyncio.gather(sample(), *(hammer(b) for b in brokers))
    assert seen > 0 and held_outside == 0, (seen, held_outside)
    # and it is free as soon as the brokers are between cycles
    await wait_until_async(
        lambda: db.fetchval("SELECT pg_try_advisory_lock($1)", STATS_LOCK), 2, interval=0.02)
    assert await db.fetchval("SELECT pg_advisory_unlock($1)", STATS_LOCK)


# -- retention semantics ----------------------------------------------------------------

async def test_retention_disabled_or_zero_windows_delete_nothing(cluster, client, db):
    """Inv. 55: retentionSeconds without retentionEnabled, or retentionEnabled with
    both windows at 0, never deletes anything, consumed or not."""
    brokers = cluster(2)
    b = brokers[0]
    await configure(client, b, "keep.off", retentionEnabled=False, retentionSeconds=1,
                    completedRetentionSeconds=1)
    await configure(client, b, "keep.zero", retentionEnabled=True, retentionSeconds=0,
                    completedRetentionSeconds=0)
    for q in ("keep.off", "keep.zero"):
        await push(client, b, q, 4)
        await consume(client, b, q, 2)
    ran = await total(client, brokers, "retention", "ran")
    # The signal: five sweeps ran after the messages were older than every window.
    await wait_until_async(
        lambda: _ran_at_least(client, brokers, "retention", ran + 5), 15, "five retention sweeps",
        interval=0.1)
    for q in ("keep.off", "keep.zero"):
        assert await seqs(db, q) == [1, 2, 3, 4]
    assert await db.fetchval("SELECT count(*) FROM queen.retention_history") == 0


async def test_retention_deletes_old_messages_consumed_or_not(cluster, client, db):
    (b,) = cluster(1)
    await configure(client, b, "ret.old", retentionEnabled=True, retentionSeconds=1)
    await push(client, b, "ret.old", 6)
    await consume(client, b, "ret.old", 2)
    await wait_until_async(lambda: _empty(db, "ret.old"), 5, interval=0.1)
    assert await history_reaches(db, "ret.old", "retention", 6) == 6
    # the cursor is a position: pushing again continues after it
    await push(client, b, "ret.old", 1, start=100)
    msgs = await pop(client, b, "ret.old", batch=5)
    assert [m["data"] for m in msgs] == [{"i": 100}]


async def test_completed_retention_never_deletes_what_a_group_has_not_consumed(
        cluster, client, db):
    """Inv. 56: only messages at or before the least advanced cursor of all groups
    go; a partition without cursor rows keeps everything."""
    brokers = cluster(2)
    b = brokers[0]
    q = "ret.done"
    await configure(client, b, q, retentionEnabled=True, completedRetentionSeconds=1)
    await push(client, b, q, 10, partition="p")
    await push(client, b, q, 3, partition="lonely")
    # The slow group first: a group with no cursor row yet is unknown to the sweep
    # (it would start wherever retention left the partition).
    await consume(client, brokers[1], q, 4, group="slow", partition="p")
    await consume(client, b, q, 10, group="fast", partition="p")

    async def settled() -> bool:
        return await seqs(db, q, "p") == [5, 6, 7, 8, 9, 10]

    await wait_until_async(settled, 6, interval=0.1)
    # More sweeps after it settled: still nothing the slow group has not seen.
    ran = await total(client, brokers, "retention", "ran")
    await wait_until_async(
        lambda: _ran_at_least(client, brokers, "retention", ran + 3), 15,
        "three more retention sweeps", interval=0.1)
    assert await seqs(db, q, "p") == [5, 6, 7, 8, 9, 10]
    assert await seqs(db, q, "lonely") == [1, 2, 3]
    assert await history_reaches(db, q, "completed_retention", 4) == 4
    # the slow group catches up: the rest may go
    await consume(client, brokers[1], q, 6, group="slow", partition="p")
    await wait_until_async(lambda: _empty_partition(db, q, "p"), 6, interval=0.1)
    assert await seqs(db, q, "lonely") == [1, 2, 3]
    assert await history_reaches(db, q, "completed_retention", 10) == 10


async def _empty_partition(db, queue: str, partition: str) -> bool:
    return not await seqs(db, queue, partition)


async def test_max_wait_eviction_removes_what_some_group_has_not_consumed(cluster, client, db):
    """Max-wait eviction (retention disabled): old messages after the smallest cursor,
    or in a partition no group consumed, are evicted; what all groups consumed stays."""
    (b,) = cluster(1)
    q = "ret.wait"
    await configure(client, b, q, maxWaitTimeSeconds=1)
    await push(client, b, q, 6, partition="p")
    await push(client, b, q, 2, partition="nobody")
    await consume(client, b, q, 3, group="a", partition="p")

    async def settled() -> bool:
        return (await seqs(db, q, "p") == [1, 2, 3]
                and await seqs(db, q, "nobody") == [])

    await wait_until_async(settled, 6, interval=0.1)
    assert await history_reaches(db, q, "max_wait_time_eviction", 5) == 5
    assert await pop(client, b, q, "p", consumerGroup="a", batch=10) == []


# -- metrics -------------------------------------------------------------------------

async def test_each_replica_writes_its_own_metrics_rows_without_any_lock(cluster, client, db,
                                                                          fresh_database):
    """Inv. 57: each replica upserts its own system_metrics / worker_metrics rows every
    METRICS_FLUSH_MS, even while both job locks are held elsewhere; worker counters
    are deltas added per minute, so their sum is what the broker counted."""
    brokers = cluster(3)
    ids = []
    for b in brokers:
        health = (await client.get(f"{b.url}/health")).json()
        ids.append((b.port, health["worker_id"], b.proc.pid))
    await push(client, brokers[0], "metrics.q", 7)
    await push(client, brokers[1], "metrics.q", 3)

    tx = db.transaction()
    await tx.start()
    await db.fetchval("SELECT pg_advisory_lock($1)", RETENTION_LOCK)
    await db.fetchval("SELECT pg_advisory_xact_lock($1)", STATS_LOCK)
    try:
        checker = await asyncpg.connect(fresh_database.dsn)
        try:
            async def queued(pid: int) -> int:
                return await checker.fetchval("""
                    SELECT coalesce(sum((counters->>'messages.queued')::numeric), 0)::int
                    FROM queen.worker_metrics WHERE pid = $1""", pid)

            async def flushed() -> bool:
                return (await queued(ids[0][2]) == 7 and await queued(ids[1][2]) == 3)

            await wait_until_async(flushed, 5, interval=0.1)
            before = await checker.fetchval("SELECT max(updated_at) FROM queen.worker_metrics")

            async def every_replica_flushed_again() -> bool:
                # The signal: a flush after `before`, and rows of all three replicas, all
                # written while both job locks are held here.
                after = await checker.fetchval("SELECT max(updated_at) FROM queen.worker_metrics")
                rows = await checker.fetch(
                    "SELECT DISTINCT port, worker_id FROM queen.system_metrics")
                pids = await checker.fetch(
                    "SELECT DISTINCT pid, worker_id FROM queen.worker_metrics")
                return (after > before
                        and {(r["port"], r["worker_id"]) for r in rows}
                        == {(p, w) for p, w, _ in ids}
                        and {(r["pid"], r["worker_id"]) for r in pids}
                        == {(pid, w) for _, w, pid in ids})

            await wait_until_async(every_replica_flushed_again, 15,
                                   "every replica's metrics flushed under both locks",
                                   interval=0.1)
            assert await queued(ids[2][2]) == 0
            m = await checker.fetchrow("""SELECT metrics, sample_count FROM queen.system_metrics
                                          WHERE port = $1 ORDER BY timestamp DESC LIMIT 1""",
                                       ids[0][0])
            metrics = json.loads(m["metrics"])
            for key in ("cpu_percent", "memory_rss_bytes", "db_pool_size", "db_pool_idle",
                        "uptime_seconds", "event_loop_lag_ms", "mesh"):
                assert key in metrics, metrics
            assert metrics["memory_rss_bytes"] > 0 and m["sample_count"] >= 1
        finally:
            await checker.close()
    finally:
        await tx.rollback()
        await db.fetchval("SELECT pg_advisory_unlock($1)", RETENTION_LOCK)


# -- stats exactness ------------------------------------------------------------------

REFERENCE = """
WITH passed AS (
    -- is every consumer of the partition past the message? (no consumer yet: no)
    SELECT m.id, m.partition_id, m.seq, m.created_at,
           EXISTS (SELECT 1 FROM queen.log_consumers l WHERE l.partition_id = m.partition_id)
           AND NOT EXISTS (SELECT 1 FROM queen.log_consumers l
                           WHERE l.partition_id = m.partition_id AND l.cursor_seq < m.seq)
               AS by_all
    FROM queen.messages m
), state AS (
    -- each message in one state (the definition in docs/operations/metrics.md), written
    -- message by message, independently of broker/store/figures_sql.py
    SELECT x.partition_id, x.created_at, x.by_all,
           CASE WHEN EXISTS (SELECT 1 FROM queen.dead_letter_queue d WHERE d.message_id = x.id)
                     THEN 'dead'
                WHEN x.by_all THEN 'completed'
                WHEN EXISTS (SELECT 1 FROM queen.log_consumers l
                             WHERE l.partition_id = x.partition_id AND l.lease_expires_at > now()
                               AND x.seq > l.cursor_seq AND x.seq <= l.lease_last_seq)
                     THEN 'processing'
                ELSE 'pending' END AS st
    FROM passed x
)
SELECT p.id::text AS key, q.name AS queue,
       count(s.st) AS total,
       count(*) FILTER (WHERE s.st = 'pending') AS pending,
       count(*) FILTER (WHERE s.st = 'processing') AS processing,
       count(*) FILTER (WHERE s.st = 'completed') AS completed,
       count(*) FILTER (WHERE s.st = 'dead') AS dead,
       min(s.created_at) FILTER (WHERE NOT s.by_all) AS oldest,
       max(s.created_at) AS newest
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
LEFT JOIN state s ON s.partition_id = p.id
GROUP BY p.id, q.name
"""

def _figures(r) -> tuple:
    return (r["total_messages"], r["pending_messages"], r["processing_messages"],
            r["completed_messages"], r["dead_letter_messages"])


async def assert_stats_exact(db) -> dict:
    """queen.stats == count(*) for every partition, queue, namespace, task and the system."""
    ref = await db.fetch(REFERENCE)
    queues = {r["name"]: r for r in await db.fetch("SELECT name, namespace, task FROM queen.queues")}
    got = {(r["stat_type"], r["stat_key"]): r for r in await db.fetch("SELECT * FROM queen.stats")}
    want: dict[tuple, list] = {}

    def add(key, figures, children=0, oldest=None, newest=None):
        acc = want.setdefault(key, [[0] * 5, 0, None, None])
        acc[0] = [a + b for a, b in zip(acc[0], figures)]
        acc[1] += children
        if oldest is not None:
            acc[2] = oldest if acc[2] is None else min(acc[2], oldest)
        if newest is not None:
            acc[3] = newest if acc[3] is None else max(acc[3], newest)

    for name in queues:
        want[("queue", name)] = [[0] * 5, 0, None, None]
    for r in ref:
        figures = (r["total"], r["pending"], r["processing"], r["completed"], r["dead"])
        assert sum(figures[1:]) == figures[0], figures
        row = got.get(("partition", r["key"]))
        assert row is not None, f"no stats row for partition {r['key']}"
        assert _figures(row) == figures, (r["queue"], _figures(row), figures)
        assert row["oldest_pending_at"] == r["oldest"] and row["newest_message_at"] == r["newest"]
        add(("queue", r["queue"]), figures, 1, r["oldest"], r["newest"])
    for name, q in queues.items():
        figures, _, oldest, newest = want[("queue", name)]
        for kind in ("namespace", "task"):
            if q[kind]:
                add((kind, q[kind]), figures, 1, oldest, newest)
        add(("system", "system"), figures, 1, oldest, newest)
    for key, (figures, children, oldest, newest) in want.items():
        row = got.get(key)
        assert row is not None, f"no stats row {key}"
        assert list(_figures(row)) == figures, (key, _figures(row), figures)
        assert row["child_count"] == children, (key, row["child_count"], children)
        assert row["oldest_pending_at"] == oldest and row["newest_message_at"] == newest, key
    extra = [k for k in got if k not in want and k[0] != "partition"]
    extra += [k for k in got if k[0] == "partition" and k[1] not in {r["key"] for r in ref}]
    assert not extra, f"orphan stats rows: {extra}"
    return got


async def test_stats_counts_are_exact_across_groups_leases_dlq_and_retention(
        cluster, client, db):
    """queen.stats (contract in migrations/0001_base.sql) matches count(*) after pushes, pops,
    acks, live and expired leases, dead letters, a DLQ retry, retention deletions
    and a queue deletion, through incremental cycles run by either replica."""
    brokers = cluster(2)
    a, b = brokers
    await configure(client, a, "jobs.email", retryLimit=0)
    await configure(client, a, "jobs.sms", leaseTime=2)
    await configure(client, a, "other.email")
    await configure(client, a, "ret.gone", retentionEnabled=True, retentionSeconds=1)
    await push(client, a, "jobs.email", 6, partition="p1")
    await push(client, b, "jobs.email", 4, partition="p2")
    await push(client, a, "jobs.sms", 5)
    await push(client, b, "other.email", 3)
    await push(client, a, "ret.gone", 4)

    # queue mode: 3 acked in p1, then 2 popped and left leased (processing)
    await consume(client, a, "jobs.email", 3, partition="p1")
    leased = await pop(client, b, "jobs.email", "p1", batch=2)
    assert len(leased) == 2
    # a named group behind queue mode on p2, another one dead-letters one message
    await consume(client, b, "jobs.email", 1, group="g1", partition="p2")
    failed = await pop(client, a, "jobs.email", "p2", batch=1, consumerGroup="g2")
    await ack(client, a, failed, group="g2", status="failed")
    # jobs.sms: a one-second lease that will expire; other.email: only g1, all acked
    assert len(await pop(client, a, "jobs.sms", batch=2)) == 2
    sms_lease_ends = time.monotonic() + 2
    await consume(client, b, "other.email", 3, group="g1")

    await refresh(client, a)
    got = await assert_stats_exact(db)
    assert got[("partition", failed[0]["partitionId"])]["dead_letter_messages"] == 1
    assert got[("queue", "jobs.email")]["processing_messages"] == 2
    assert got[("queue", "jobs.sms")]["processing_messages"] == 2

    # retention empties ret.gone; the lease of jobs.sms expires; nothing is pushed
    await wait_until_async(lambda: _empty(db, "ret.gone"), 5, interval=0.1)
    await asyncio.sleep(max(0.0, sms_lease_ends + 0.3 - time.monotonic()))
    await refresh(client, b)
    got = await assert_stats_exact(db)
    assert got[("queue", "ret.gone")]["total_messages"] == 0
    assert got[("queue", "jobs.sms")]["processing_messages"] == 0

    # a quiet system: the next cycle recounts nothing
    result = (await client.post(f"{a.url}/api/v1/system/jobs/stats/run")).json()
    if not result["skipped"]:
        assert result["recounted"] == 0, result

    # more traffic: pushes, acks of the leased batch, a DLQ retry, new partitions
    await push(client, b, "jobs.email", 2, partition="p1", start=50)
    await ack(client, a, leased)
    r = await client.post(
        f"{b.url}/api/v1/messages/{failed[0]['partitionId']}/{failed[0]['transactionId']}/retry")
    assert r.status_code == 200, r.text
    await push(client, a, "jobs.sms", 2, partition="extra")
    await consume(client, b, "jobs.sms", 1, partition="extra")
    await refresh(client, b)
    got = await assert_stats_exact(db)
    assert got[("partition", failed[0]["partitionId"])]["dead_letter_messages"] == 0

    # a deleted queue leaves no rows behind; the namespace rows follow
    r = await client.delete(f"{a.url}/api/v1/resources/queues/other.email")
    assert r.status_code == 200
    await refresh(client, a)
    got = await assert_stats_exact(db)
    assert ("queue", "other.email") not in got and ("namespace", "other") not in got
    assert got[("task", "email")]["child_count"] == 1

    # a forced full recount agrees with the incremental figures
    await refresh(client, b, full=True)
    await assert_stats_exact(db)
    stats = (await jobs(client, a))["stats"]
    assert stats["failures"] == 0


# -- the retention connection closed under a cycle ------------------------------------------

async def test_retention_connection_killed_mid_cycle_is_not_unlocked_after_the_fact(
        fresh_database, db):
    """The cycle's connection is killed (pg_terminate_backend) while it holds 737001 and
    waits in a step: the cycle fails as StoreUnavailable, nothing is tried on the dead
    connection (no "pg_advisory_unlock ... failed" warning about a connection already given
    back to the pool, none counted as discarded), the lock went with the session, and the
    next cycle sweeps on a fresh pooled connection. In-process: a real Store, the real job."""
    from loguru import logger

    from actors.leader_jobs import RetentionJob
    from broker.store.db import Store

    store = await Store.connect(fresh_database.dsn, pool_size=2, connect_timeout_ms=5000,
                                statement_timeout_ms=60_000, lock_timeout_ms=60_000,
                                idle_timeout_ms=60_000, application_name="retention-kill-test")
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    blocker = await asyncpg.connect(fresh_database.dsn)
    try:
        job = RetentionJob(store, interval_ms=3_600_000, batch_size=10,
                           partition_cleanup_days=30, metrics_retention_days=90)
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE queen.messages IN ACCESS EXCLUSIVE MODE")
        cycle = asyncio.ensure_future(job.run_once())

        async def holder_waiting() -> int | None:
            return await db.fetchval("""
                SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                WHERE l.locktype = 'advisory' AND l.objid = $1 AND l.granted
                  AND a.application_name = 'retention-kill-test'
                  AND a.wait_event_type = 'Lock'""", RETENTION_LOCK)

        await wait_until_async(holder_waiting, 10, "the sweep holding 737001, waiting",
                               interval=0.05)
        assert await db.fetchval("SELECT pg_terminate_backend($1)", await holder_waiting())
        result = await asyncio.wait_for(cycle, 10)
        await tx.rollback()

        assert result["error"].startswith("StoreUnavailable: "), result
        assert job.sessions_lost == 1, job.stats()
        assert job.connections_discarded == 0 and job.unlock_not_held == 0, job.stats()
        assert not [w for w in warnings if "pg_advisory_unlock" in w], warnings
        assert await db.fetch(HOLDERS.replace("queen-broker%", "retention-kill-test"),
                              RETENTION_LOCK) == []
        again = await job.run_once()
        assert again["skipped"] is False and "error" not in again, again
        assert await db.fetchval("SELECT pg_try_advisory_lock($1)", RETENTION_LOCK)
        assert await db.fetchval("SELECT pg_advisory_unlock($1)", RETENTION_LOCK)
    finally:
        logger.remove(sink)
        await blocker.close()
        await store.close()
