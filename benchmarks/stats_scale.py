"""Stats reconciler at scale: 1,000,000 messages in 100 partitions.

    .venv/bin/python benchmarks/stats_scale.py [--messages 1000000] [--partitions 100]

Starts an embedded PostgreSQL (or uses PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB),
creates a scratch database, applies the schema, and bulk-loads the messages with
SQL (generate_series; seq dense 1..n per partition, partitions.last_seq = n,
creation times increasing with seq). Sets cursors for queue mode and two consumer
groups, live and expired leases and dead letters, then drives the real StatsJob
actor (actors/leader_jobs.py) and times:

  1. the first cycle (empty stats: every partition counted),
  2. a cycle with nothing changed,
  3. incremental cycles after a few pushes, pops and acks, a dead-lettering and
     a retention-style deletion (the data path's own SQL functions),
  4. a forced full recount (warm cache),

checking every partition, queue, namespace, task and system row against
count(*) reference queries after each cycle.

Then (unless --no-brokers) two broker processes (STATS_INTERVAL_MS=1000, meshed)
on that database: their stats jobs run periodically (cycles ran / skipped and
their durations read from GET /api/v1/system/jobs; a ran cycle must stay under
1 s, and no two ran cycles may overlap), and the operator routes are checked
against count(*) SQL and timed on both brokers: /api/v1/status,
/status/queues, /status/queues/{q}, /resources/overview, /consumer-groups,
/consumer-groups/{g}, /consumer-groups/lagging, /dlq, /resources/queues/{q}/depth
and /metrics/prometheus (parsed with prometheus_client's parser), on the bulk
data and again after pushes, pops and acks made through HTTP and the next stats
cycle (benchmarks/_stats_brokers.py). Routes slower than 2 s are listed as
findings.

Exit status 1 when a count is off, a route answers wrong or not 200, a stats
cycle fails or takes 1 s or more.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402
from loguru import logger  # noqa: E402

from _harness import start_database  # noqa: E402
from _stats_brokers import run_brokers_phase  # noqa: E402
from actors.leader_jobs import StatsJob  # noqa: E402
from actors.runtime import stop_all  # noqa: E402
from broker.core.domain import AckRow, PushRow  # noqa: E402
from broker.store.db import Store  # noqa: E402
from broker.store.schema import apply_schema  # noqa: E402

QUEUES = 10
GROUPS = ("g1", "g2")

REFERENCE_PARTITIONS = """
WITH eff AS (
    SELECT p.id, q.name AS queue,
           coalesce((SELECT l.cursor_seq FROM queen.log_consumers l
                     WHERE l.partition_id = p.id AND l.consumer_group = '__QUEUE_MODE__'),
                    (SELECT min(l.cursor_seq) FROM queen.log_consumers l
                     WHERE l.partition_id = p.id), 0) AS cur
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
)
SELECT e.id::text AS key, e.queue,
       (SELECT count(*) FROM queen.messages m WHERE m.partition_id = e.id) AS total,
       (SELECT count(*) FROM queen.messages m WHERE m.partition_id = e.id AND m.seq > e.cur) AS pending,
       (SELECT count(DISTINCT m.id) FROM queen.messages m
        JOIN queen.log_consumers l ON l.partition_id = m.partition_id
         AND l.lease_expires_at > now() AND m.seq > l.cursor_seq AND m.seq <= l.lease_last_seq
        WHERE m.partition_id = e.id) AS processing,
       (SELECT count(*) FROM queen.dead_letter_queue d WHERE d.partition_id = e.id) AS dead
FROM eff e
"""

FIGURES = ("total", "pending", "processing", "completed", "dead")


async def verify(conn: asyncpg.Connection) -> list[str]:
    """Differences between queen.stats and count(*) references (empty when exact)."""
    problems: list[str] = []
    ref = {r["key"]: r for r in await conn.fetch(REFERENCE_PARTITIONS)}
    rows = await conn.fetch("SELECT * FROM queen.stats")
    got = {(r["stat_type"], r["stat_key"]): r for r in rows}

    def figures(r) -> tuple:
        return (r["total_messages"], r["pending_messages"], r["processing_messages"],
                r["completed_messages"], r["dead_letter_messages"])

    expected_queue: dict[str, list[int]] = {}
    for key, r in ref.items():
        want = (r["total"], r["pending"], r["processing"], r["total"] - r["pending"], r["dead"])
        row = got.get(("partition", key))
        if row is None or figures(row) != want:
            problems.append(f"partition {key}: stats {row and figures(row)} != count(*) {want}")
        acc = expected_queue.setdefault(r["queue"], [0] * 5)
        for i, v in enumerate(want):
            acc[i] += v
    system = [0] * 5
    for queue, want in expected_queue.items():
        row = got.get(("queue", queue))
        if row is None or list(figures(row)) != want:
            problems.append(f"queue {queue}: stats {row and figures(row)} != count(*) {want}")
        for i, v in enumerate(want):
            system[i] += v
    row = got.get(("system", "system"))
    if row is None or list(figures(row)) != system:
        problems.append(f"system: stats {row and figures(row)} != count(*) {system}")
    stale = [k for k in got if k[0] == "partition" and k[1] not in ref]
    if stale:
        problems.append(f"orphan partition rows: {stale[:3]}")
    return problems


async def load(conn: asyncpg.Connection, messages: int, partitions: int) -> float:
    per = messages // partitions
    started = time.perf_counter()
    await conn.execute("""
        INSERT INTO queen.queues (name, namespace, task)
        SELECT 'bench.q' || i, 'bench', 'task' || (i % 3) FROM generate_series(1, $1) i""",
                       QUEUES)
    await conn.execute("""
        INSERT INTO queen.partitions (queue_id, name, last_seq, last_message_at)
        SELECT q.id, 'p' || j, $2, now()
        FROM queen.queues q, generate_series(1, $1) j""", partitions // QUEUES, per)
    await conn.execute("""
        INSERT INTO queen.messages (id, partition_id, seq, transaction_id, payload, created_at)
        SELECT gen_random_uuid(), p.id, g, 'tx-' || g, '{"n": 1}'::jsonb,
               now() - interval '2 hours' + g * interval '1 ms'
        FROM queen.partitions p, generate_series(1, $1) g""", per)
    # cursors: queue mode somewhere in the partition, two groups, some leases
    await conn.execute("""
        INSERT INTO queen.log_consumers (partition_id, consumer_group, cursor_seq)
        SELECT p.id, '__QUEUE_MODE__', (abs(hashtext(p.id::text)) % $1)
        FROM queen.partitions p""", per)
    for group in GROUPS:
        await conn.execute("""
            INSERT INTO queen.log_consumers (partition_id, consumer_group, cursor_seq)
            SELECT p.id, $2, (abs(hashtext(p.id::text || $2)) % $1)
            FROM queen.partitions p""", per, group)
    await conn.execute("""
        UPDATE queen.log_consumers l
        SET lease_id = gen_random_uuid(), lease_acquired_at = now(),
            lease_expires_at = now() + CASE WHEN abs(hashtext(l.partition_id::text)) % 2 = 0
                                           THEN interval '1 hour' ELSE interval '-1 minute' END,
            lease_last_seq = least(l.cursor_seq + 100, $1), batch_size = 100
        WHERE l.consumer_group IN ('__QUEUE_MODE__', 'g1')
          AND abs(hashtext(l.partition_id::text || l.consumer_group)) % 3 = 0""", per)
    # what the ack path would have written with those cursors: consumption counters and
    # the id/time of the message at the cursor
    await conn.execute("""
        UPDATE queen.log_consumers l
        SET total_messages_consumed = l.cursor_seq, total_batches_consumed = l.cursor_seq / 100,
            last_consumed_id = m.id, last_consumed_created_at = m.created_at,
            last_consumed_at = now() - interval '90 minutes'
        FROM queen.messages m
        WHERE m.partition_id = l.partition_id AND m.seq = l.cursor_seq""")
    # dead letters of g1, only at positions g1 has already passed (an ack with status dlq
    # moves the cursor over the message): about 5 per partition
    await conn.execute("""
        INSERT INTO queen.dead_letter_queue
            (message_id, partition_id, consumer_group, error_message, original_created_at)
        SELECT m.id, m.partition_id, 'g1', 'bench', m.created_at
        FROM queen.messages m
        JOIN queen.log_consumers l ON l.partition_id = m.partition_id AND l.consumer_group = 'g1'
        WHERE m.seq % 1000 = 7 AND m.seq <= l.cursor_seq""")
    await conn.execute("VACUUM ANALYZE queen.messages")
    await conn.execute("VACUUM ANALYZE queen.log_consumers")
    await conn.execute("VACUUM ANALYZE queen.partitions")
    return time.perf_counter() - started


async def changes(store: Store, conn: asyncpg.Connection) -> str:
    """A few pushes, pops and acks through the data path's functions, one
    dead-lettering, and a retention-style delete of 500 old messages."""
    parts = await conn.fetch("""
        SELECT q.name AS queue, p.name AS partition, p.id FROM queen.partitions p
        JOIN queen.queues q ON q.id = p.queue_id ORDER BY p.id LIMIT 5""")
    rows = [PushRow(queue=p["queue"], partition=p["partition"], message_id=str(uuid.uuid4()),
                    transaction_id=f"new-{uuid.uuid4()}", trace_id=None, payload={"x": i})
            for p in parts for i in range(20)]
    await store.push(rows)
    acked = 0
    for p in parts[:3]:
        got = await store.pop(queue=p["queue"], partition=p["partition"], namespace=None,
                              task=None, group="g2", batch=10, max_partitions=1,
                              auto_ack=False, lease_id=str(uuid.uuid4()))
        msgs = [r for r in got if r["kind"] == "msg"]
        acks = [AckRow(m["transaction_id"], str(m["partition_id"]), "completed", None, "g2", None)
                for m in msgs[:-1]]
        if msgs:
            acks.append(AckRow(msgs[-1]["transaction_id"], str(msgs[-1]["partition_id"]), "dlq",
                               "bench", "g2", None))
        await store.ack(acks)
        acked += len(acks)
    await conn.execute("""
        DELETE FROM queen.messages WHERE id IN (
            SELECT id FROM queen.messages WHERE partition_id = $1 ORDER BY seq LIMIT 500)""",
                       parts[4]["id"])
    return f"{len(rows)} pushed into 5 partitions, {acked} acked (1 dlq) in 3, 500 deleted in 1"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--incremental-rounds", type=int, default=3)
    ap.add_argument("--no-brokers", dest="brokers", action="store_false",
                    help="skip the two-broker phase (route checks)")
    ap.add_argument("--settle-seconds", type=float, default=6.0,
                    help="periodic stats cycles to let run before the first route round")
    ap.add_argument("--traffic-seconds", type=float, default=8.0,
                    help="upper bound of the HTTP push/pop/ack traffic")
    args = ap.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="INFO")

    db = start_database()
    name = f"qbench_stats_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(db.dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = db.dsn.rsplit("/", 1)[0] + "/" + name
    failed = False
    brokers_ok = True
    results: list[tuple[str, float, str]] = []
    try:
        conn = await asyncpg.connect(dsn)
        await apply_schema(conn)
        print(f"database: {db.kind}; loading {args.messages:,} messages into "
              f"{args.partitions} partitions ...", flush=True)
        seconds = await load(conn, args.messages, args.partitions)
        total = await conn.fetchval("SELECT count(*) FROM queen.messages")
        print(f"loaded {total:,} messages in {seconds:.1f} s", flush=True)
        store = await Store.connect(dsn, pool_size=4, connect_timeout_ms=5000,
                                    statement_timeout_ms=120_000, lock_timeout_ms=10_000,
                                    idle_timeout_ms=120_000, apply=False)
        job = StatsJob.start(store, interval_ms=10**9).proxy()  # driven by hand only

        async def cycle(label: str, **options) -> None:
            nonlocal failed
            result = await job.run_once(**options)
            if "error" in result:
                raise RuntimeError(result["error"])
            problems = await verify(conn)
            failed = failed or bool(problems)
            note = f"{result['recounted']} partition(s) recounted" + (
                "" if not problems else f"; {len(problems)} MISMATCH(ES): {problems[:2]}")
            results.append((label, result["durationMs"], note))
            print(f"{label:<34} {result['durationMs']:>9.1f} ms   {note}", flush=True)

        await cycle("first cycle (empty stats, full)")
        await cycle("no change")
        for i in range(args.incremental_rounds):
            what = await changes(store, conn)
            await cycle(f"incremental #{i + 1}")
            if i == 0:
                print(f"  (each round: {what})")
        await conn.execute("""
            UPDATE queen.log_consumers SET lease_expires_at = now() - interval '1 second'
            WHERE lease_expires_at > now() AND consumer_group = '__QUEUE_MODE__'""")
        await cycle("after lease expiries")
        await cycle("forced full recount (warm)", full=True)
        await stop_all()
        await store.close()
        if args.brokers:
            # the brokers connect to the scratch database through PG_DB
            brokers_ok = await run_brokers_phase(
                dataclasses.replace(db, db=name), conn, verify,
                settle_seconds=args.settle_seconds, traffic_seconds=args.traffic_seconds)
        await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()
        db.stop()
    print()
    print("cycle                               time (ms)")
    for label, ms, _ in results:
        print(f"  {label:<34}{ms:>9.1f}")
    print("counts exact vs count(*):", "NO" if failed else "yes")
    if args.brokers:
        print("two brokers: stats exact, cycles < 1 s, routes match count(*):",
              "yes" if brokers_ok else "NO")
    return 1 if failed or not brokers_ok else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
