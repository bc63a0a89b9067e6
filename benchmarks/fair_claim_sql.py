"""The claim order of a scanning wildcard pop, version against version, on one PostgreSQL.

    .venv/bin/python benchmarks/fair_claim_sql.py [--partitions 64,1000] [--calls 400] [--rounds 3]

Starts an embedded PostgreSQL (or uses PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB), applies the
schema, fills one queue per size with that many partitions, each holding a backlog, and lets
one consumer group pop it with wildcard scans (no hints, batch 10, one partition a pop), one
call at a time on one connection, each claim released before the next as an ack releases it
(the cursor moved to the lease's last position, the lease columns cleared, lease_acquired_at
included). ``queen.pop_messages_v2`` (order: lease_acquired_at) and ``queen.pop_messages_v3``
(order: last_claimed_at, migration 0015) alternate in rounds, so machine noise falls on both.

Prints the plan of the candidate scan under each order (EXPLAIN ANALYZE of the function's
candidate query with the group's rows in place), and per function: the median wall and
PostgreSQL backend CPU microseconds per pop and its release (/proc, in ticks), how many partitions the calls claimed, and the
longest run of calls that left one partition out (every partition holds a backlog throughout).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402

from _harness import start_database  # noqa: E402
from broker.store.schema import apply_schema  # noqa: E402

FUNCTIONS = {"v2 (lease_acquired_at)": "queen.pop_messages_v2",
             "v3 (last_claimed_at)": "queen.pop_messages_v3"}
POP = ("SELECT kind, partition_name, verdict FROM {fn}($1, NULL, NULL, NULL, 'g', 10, 1, false, "
       "$2, NULL, false)")
RELEASE = """
UPDATE queen.log_consumers SET cursor_seq = lease_last_seq, lease_id = NULL,
       lease_acquired_at = NULL, lease_expires_at = NULL, lease_last_seq = NULL,
       batch_size = 0, acked_count = 0, updated_at = now()
WHERE lease_id = $1
"""
CANDIDATES = """
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT pt.id, pt.name
FROM queen.queues q
JOIN queen.partitions pt ON pt.queue_id = q.id
LEFT JOIN queen.log_consumers l ON l.partition_id = pt.id AND l.consumer_group = 'g'
LEFT JOIN queen.group_policies gp ON gp.queue_name = q.name AND gp.consumer_group = 'g'
WHERE q.name = $1 AND pt.last_seq > coalesce(l.cursor_seq, 0)
  AND (l.lease_expires_at IS NULL OR l.lease_expires_at <= now())
ORDER BY array_position(NULL::text[], pt.name) NULLS LAST,
         coalesce(l.{column}, '-infinity'::timestamptz), pt.id
LIMIT 20
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc; steadier than wall time here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fill(conn: asyncpg.Connection, queue: str, partitions: int, n: int) -> None:
    """``partitions`` partitions of ``queue``, each with ``n`` messages, through the
    broker's own push function (one call per partition)."""
    now_us = int(time.time() * 1_000_000)
    for p in range(partitions):
        await conn.execute(
            "SELECT count(*) FROM queen.push_ordered_v4($1, $2, $3, $4, $5, $6, $7, $8, $9, "
            "$10, $11, $12, $13, $14)",
            list(range(n)), [queue] * n, [f"p{p}"] * n, [uuid.uuid4() for _ in range(n)],
            [str(uuid.uuid4()) for _ in range(n)], [None] * n, ['{"v": 1}'] * n,
            [False] * n, [None] * n, [now_us] * n, "bench", 0, 0, [None] * n)


def longest_wait(claims: list[str], names: list[str]) -> int:
    worst = 0
    for p in names:
        at = [-1, *(i for i, c in enumerate(claims) if c == p), len(claims)]
        worst = max(worst, max(b - a - 1 for a, b in zip(at, at[1:], strict=False)))
    return worst


async def run(args: argparse.Namespace) -> None:
    db = start_database()
    try:
        conn = await asyncpg.connect(db.dsn)
        await apply_schema(conn)
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        for size in args.partitions:
            names = [f"p{p}" for p in range(size)]
            queues = {label: f"fair-{size}-{i}-{uuid.uuid4().hex[:6]}"
                      for i, label in enumerate(FUNCTIONS)}
            # deeper than the calls can drain, had one partition all of them
            backlog = 10 * (args.rounds * args.calls // size + 2)
            for queue in queues.values():
                await fill(conn, queue, size, backlog)
            walls: dict[str, list[float]] = {label: [] for label in FUNCTIONS}
            cpus: dict[str, float] = dict.fromkeys(FUNCTIONS, 0.0)
            claims: dict[str, list[str]] = {label: [] for label in FUNCTIONS}
            for _ in range(args.rounds):
                for label, fn in FUNCTIONS.items():
                    sql = POP.format(fn=fn)
                    cpu0 = cpu_seconds(pid)
                    for _ in range(args.calls):
                        lease = uuid.uuid4()
                        t = time.perf_counter()
                        rows = await conn.fetch(sql, queues[label], lease)
                        walls[label].append(time.perf_counter() - t)
                        took = [r["partition_name"] for r in rows if r["verdict"] == "took"]
                        claims[label].extend(took)
                        await conn.execute(RELEASE, lease)
                    cpus[label] += cpu_seconds(pid) - cpu0
            print(f"\n== {size} partitions, backlog {backlog} each, "
                  f"{args.rounds} x {args.calls} pops per function")
            for label, column in (("v2 (lease_acquired_at)", "lease_acquired_at"),
                                  ("v3 (last_claimed_at)", "last_claimed_at")):
                plan = await conn.fetch(CANDIDATES.format(column=column), queues[label])
                print(f"-- candidate scan, order by {column}:")
                for r in plan:
                    print("   " + r[0])
            print(f"{'function':24} {'wall us/pop':>12} {'CPU us/pop+release':>19} "
                  f"{'partitions claimed':>19} {'longest wait (pops)':>20}")
            for label in FUNCTIONS:
                calls = len(walls[label])
                print(f"{label:24} {statistics.median(walls[label]) * 1e6:12.0f} "
                      f"{cpus[label] / calls * 1e6:19.0f} "
                      f"{len(set(claims[label])):>12} of {size:<5} "
                      f"{longest_wait(claims[label], names):>20}")
        await conn.close()
    finally:
        db.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="64,1000",
                    type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--calls", type=int, default=400, help="pops per function per round")
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
