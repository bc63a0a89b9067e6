"""The push and ack functions of two schema versions, side by side on one PostgreSQL.

    .venv/bin/python benchmarks/datapath_sql_ab.py [--calls 1000] [--rounds 4] [--groups 64]

Starts an embedded PostgreSQL (or uses PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB),
applies the schema, and calls ``queen.push_ordered`` (migration 0001) and
``queen.push_ordered_v2`` (0006) with the same arguments the broker sends, one
call at a time on one connection, alternating the two functions in rounds so
that machine noise falls on both alike. No HTTP, no broker, no lock waits: this
isolates what the SQL itself costs per call. Workloads:

  fresh-1     one new message per call (16 partitions, round robin)
  fresh-100   100 new messages per call, one partition per call
  dup-100     the same 100 messages again (every item a duplicate)
  fresh-1000  1,000 new messages per call (what a fold of ten 100-item pushes sends)

Then the ack: ``queen.ack_messages`` (0001) and ``queen.ack_messages_v2`` (0007)
each acknowledge, in one call, a fold of --groups leased batches of 100 messages
(one per partition), as the ack batcher sends them under load.

Prints, per workload, the median wall microseconds per call and the PostgreSQL
backend's CPU microseconds per call (from /proc: steadier than wall time on a
shared machine) of each function, and the ratios v2 / v1.
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

FUNCTIONS = ("queen.push_ordered", "queen.push_ordered_v2")
ACK_FUNCTIONS = ("queen.ack_messages", "queen.ack_messages_v2")
PARTITIONS = 16


def call_sql(function: str) -> str:
    return (f"SELECT idx, message_id, partition_id, status, late, peer FROM "
            f"{function}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)")


def args_for(queue: str, partition: str, txids: list[str]) -> tuple:
    n = len(txids)
    now_us = int(time.time() * 1_000_000)
    return (list(range(n)), [queue] * n, [partition] * n,
            [uuid.uuid4() for _ in txids], txids, [None] * n,
            ['{"k": 1, "v": "payload"}'] * n, [False] * n, [None] * n,
            [now_us] * n, "bench", False, None, 5000)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc; steadier than wall time here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed_calls(conn: asyncpg.Connection, function: str, queue: str, tag: str,
                      batch: int, calls: int, start: int,
                      duplicate_of: int | None = None) -> list[float]:
    sql = call_sql(function)
    took = []
    for c in range(calls):
        k = c if duplicate_of is None else c % max(duplicate_of, 1)
        txids = [f"{tag}-{start + k}-{i}" for i in range(batch)]
        args = args_for(queue, f"p{k % PARTITIONS}", txids)
        t0 = time.perf_counter()
        rows = await conn.fetch(sql, *args)
        took.append(time.perf_counter() - t0)
        want = "duplicate" if duplicate_of is not None else "queued"
        if len(rows) != batch or any(r["status"] != want for r in rows):
            raise SystemExit(f"{function}: unexpected answer {rows[:1]}")
    return took


async def ack_fold(conn: asyncpg.Connection, backend: int, function: str, queue: str,
                   groups: int) -> float:
    """Push and lease ``groups`` batches of 100, then ack them all in one call: its CPU."""
    for p in range(groups):
        await conn.fetch(call_sql(FUNCTIONS[1]),
                         *args_for(queue, f"p{p}", [f"a{p}-{i}" for i in range(100)]))
    leased = []  # (transaction id, partition id, lease id) of every popped message
    for p in range(groups):
        lease_id = uuid.uuid4()
        rows = await conn.fetch("SELECT * FROM queen.pop_messages($1, $2, NULL, NULL, "
                                "'__QUEUE_MODE__', 100, 1, false, $3, NULL, false)",
                                queue, f"p{p}", str(lease_id))
        leased += [(r["transaction_id"], r["partition_id"], lease_id)
                   for r in rows if r["message_id"] is not None]
    n = len(leased)
    used = cpu_seconds(backend)
    rows = await conn.fetch(f"SELECT * FROM {function}($1, $2, $3, $4, $5, $6, $7, false)",
                            list(range(n)), [t for t, _, _ in leased], [p for _, p, _ in leased],
                            ["completed"] * n, [None] * n, ["__QUEUE_MODE__"] * n,
                            [lease for _, _, lease in leased])
    used = cpu_seconds(backend) - used
    if len(rows) != groups * 100 or not all(r["success"] for r in rows):
        raise SystemExit(f"{function}: not every ack succeeded")
    return used


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per workload and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--groups", type=int, default=64,
                        help="(partition, group) batches of 100 in the ack fold")
    args = parser.parse_args()
    db = start_database()
    try:
        conn = await asyncpg.connect(db.dsn)
        await apply_schema(conn)
        workloads = (("fresh-1", 1, args.calls), ("fresh-100", 100, args.calls // 10),
                     ("dup-100", 100, args.calls // 10), ("fresh-1000", 1000, args.calls // 100))
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        per: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        for rnd in range(args.rounds):
            order = FUNCTIONS if rnd % 2 == 0 else tuple(reversed(FUNCTIONS))
            for function in order:
                queue = f"ab-{function.split('.')[1]}"
                base = rnd * args.calls
                for name, batch, calls in workloads:
                    dup = calls if name.startswith("dup") else None
                    tag = "fresh-100" if dup is not None else name  # dup-100 re-sends fresh-100
                    used = cpu_seconds(backend)
                    took = await timed_calls(conn, function, queue, tag, batch, calls, base, dup)
                    used = cpu_seconds(backend) - used
                    per.setdefault((name, function), []).append(statistics.median(took) * 1e6)
                    cpu.setdefault((name, function), []).append(used / calls * 1e6)
        ack_cpu: dict[str, list[float]] = {}
        for rnd in range(args.rounds):
            for function in ACK_FUNCTIONS if rnd % 2 == 0 else tuple(reversed(ACK_FUNCTIONS)):
                queue = f"ack-{rnd}-{function.split('.')[1]}"
                ack_cpu.setdefault(function, []).append(
                    await ack_fold(conn, backend, function, queue, args.groups))
        await conn.close()
    finally:
        db.stop()
    print("median wall µs per call (round trip included), and PostgreSQL backend CPU µs per call")
    print(f"{'workload':<10} {'v1 wall':>9} {'v2 wall':>9} {'v2/v1':>6} "
          f"{'v1 cpu':>9} {'v2 cpu':>9} {'v2/v1':>6}")
    for name, _batch, _calls in workloads:
        w1, w2 = (statistics.median(per[(name, f)]) for f in FUNCTIONS)
        c1, c2 = (statistics.median(cpu[(name, f)]) for f in FUNCTIONS)
        print(f"{name:<10} {w1:>9.0f} {w2:>9.0f} {w2 / w1:>6.2f} "
              f"{c1:>9.0f} {c2:>9.0f} {c2 / c1:>6.2f}")
    a1, a2 = (statistics.median(ack_cpu[f]) * 1e3 for f in ACK_FUNCTIONS)
    print(f"ack fold of {args.groups} x 100: backend CPU v1 {a1:.0f} ms, v2 {a2:.0f} ms, "
          f"v2/v1 {a2 / a1:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
