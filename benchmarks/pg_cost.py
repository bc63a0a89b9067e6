"""PostgreSQL's own cost per message: the broker's SQL beside the plain statements.

    .venv/bin/python benchmarks/pg_cost.py [--messages 60000] [--push1 6000] [--rounds 2]
                                           [--concurrency 16] [--partitions 16] [--json F]

The figure every change to the hot-path SQL is judged by. More brokers cannot lower it: every
microsecond of PostgreSQL CPU per message is paid once per message whatever the number of
brokers, so it bounds the cluster. It does not depend on the load generator sharing the
cores, as wall-clock rates do.

One embedded PostgreSQL (``pg_stat_statements`` preloaded, ``track = all`` so the statements
inside the PL/pgSQL functions are counted too), the broker's schema, and per round, one after
the other on the same server:

  push 1     the broker's store (``Store.push``, one request per message: push_ordered_v*)
             beside a plain ``INSERT`` of one row
  push 100   the same, 100 messages per request, one partition per request, beside a plain
             ``INSERT ... SELECT FROM unnest(...)`` of 100 rows
  push 100 folded  100 messages per call over every partition (item i to partition
             i % P), as many calls in flight as one broker sends (PUSH_MAX_CONCURRENT's
             default): the shape of the calls in which a broker folds concurrent pushes
             (actors/batcher.py), beside the same plain insert of 100 rows. (At 16 clients
             every call would wait for the others' locks on the same 16 partitions.)
  pop+ack 1  the broker's pop of one message (queue mode, any partition) and its ack, the
             push 1 messages, beside the plain claim-and-delete of one row: a consumer at
             small batches pays these calls' fixed cost once per message
  pop+ack    the broker's pop of 100 (queue mode, any partition) and its ack of the batch
             (``Store.pop`` + ``Store.ack``) beside the plain claim-and-delete
             (``SELECT ... LIMIT 100 FOR UPDATE SKIP LOCKED`` + ``DELETE ... = ANY``)

The plain table has the same primary key, dedup key and partition column as queen.messages
(``_loadgen.RAW_TABLE``); the same rows, clients and partitions go to both. For each phase:
PostgreSQL's CPU per message (user + system of the postmaster and every child, reaped ones
included, from /proc), WAL bytes per message (``pg_current_wal_lsn()``), and the ratio broker
÷ plain. With ``--statements`` the top statements of each broker phase from
``pg_stat_statements`` (execution time per message, calls, rows).

A CHECKPOINT precedes every phase, so each starts without full-page images pending.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402
import psutil  # noqa: E402

from _harness import Database, PgMeter, enable_pg_statements, start_database  # noqa: E402
from _loadgen import (  # noqa: E402
    RAW_TABLE,
    Phase,
    Rows,
    fmt_ratio,
    log,
    raw_pop_ack,
    raw_push,
    table,
)
from _store_floor import open_store, store_pop_ack, store_push  # noqa: E402
from broker.core.config import load_settings  # noqa: E402
from broker.store.schema import apply_schema  # noqa: E402

FOLD_IN_FLIGHT = load_settings({}).push_max_concurrent  # a broker's default

TOP_STATEMENTS = """
SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g') AS query
FROM pg_stat_statements
WHERE query NOT ILIKE '%pg_stat_statements%' AND query NOT ILIKE 'CHECKPOINT%'
ORDER BY total_exec_time DESC LIMIT $1
"""


class Measured:
    """One phase's PostgreSQL figures around ``run``."""

    def __init__(self, admin: asyncpg.Connection, meter: PgMeter, top: int) -> None:
        self.admin, self.meter, self.top = admin, meter, top

    async def __call__(self, label: str, run) -> dict[str, Any]:
        await self.admin.execute("CHECKPOINT")
        await self.admin.execute("SELECT pg_stat_statements_reset()")
        lsn0 = await self.admin.fetchval("SELECT pg_current_wal_lsn()")
        cpu0 = self.meter.cpu_s()
        phase: Phase = await run()
        cpu = self.meter.cpu_s() - cpu0
        wal = await self.admin.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)",
                                        lsn0)
        statements = [dict(r) for r in await self.admin.fetch(TOP_STATEMENTS, self.top)]
        n = max(phase.done, 1)
        if phase.errors or phase.truncated:
            log(f"{label}: {phase.errors} errors, {phase.done}/{phase.target} done "
                f"(first: {phase.first_error})")
        return {"label": label, "messages": phase.done, "errors": phase.errors,
                "msgs_per_s": phase.rate, "pg_cpu_us": cpu * 1e6 / n,
                "wal_bytes": float(wal) / n,
                "statements": [{"query": s["query"][:160], "calls": s["calls"],
                                "rows": s["rows"],
                                "exec_us_per_msg": s["total_exec_time"] * 1000 / n}
                               for s in statements]}


async def one_round(args: argparse.Namespace, db: Database, measure: Measured,
                    k: int) -> list[dict[str, Any]]:
    c, p, cap = args.concurrency, args.partitions, args.cap_s
    pool = await asyncpg.create_pool(db.dsn, min_size=c, max_size=c)
    store = await open_store(db.dsn, c)
    try:
        async with pool.acquire() as con:
            await con.execute(RAW_TABLE)
        q1, q100 = f"cost1-{k}-{uuid.uuid4().hex[:6]}", f"cost100-{k}-{uuid.uuid4().hex[:6]}"
        q100f = f"cost100f-{k}-{uuid.uuid4().hex[:6]}"  # the folded pushes' own queue
        # the queues and partitions exist before the clock starts, as on a running broker
        await store_push(store, Rows(p, p), q1, 1, c, cap, "warm")
        await store_push(store, Rows(p * 100, p), q100, 100, c, cap, "warm")
        await store_push(store, Rows(p, p), q100f, 1, c, cap, "warm")
        await store_pop_ack(store, q100, p * 100, 100, c, cap, "warm")
        await store_pop_ack(store, q1, p, 100, c, cap, "warm")
        out = []
        rows1, rows100 = Rows(args.push1, p), Rows(args.messages, p)
        out.append(await measure("push 1: broker", lambda: store_push(
            store, rows1, q1, 1, c, cap, "push 1")))
        out.append(await measure("push 1: plain insert", lambda: raw_push(
            pool, Rows(args.push1, p), 1, c, cap, "raw 1")))
        # A pop of one message and its ack: what a consumer at small batches pays per
        # message, mostly the calls' fixed cost.
        out.append(await measure("pop+ack 1: broker", lambda: store_pop_ack(
            store, q1, args.push1, 1, c, cap, "pop+ack 1")))
        raw_rows = await pool.fetchval("SELECT count(*) FROM bench_raw")
        out.append(await measure("pop+ack 1: plain claim-and-delete", lambda: raw_pop_ack(
            pool, raw_rows, 1, c, cap, "raw pop 1")))
        async with pool.acquire() as con:  # the plain pop takes the 100-row pushes' rows
            await con.execute("TRUNCATE bench_raw")
        out.append(await measure("push 100: broker", lambda: store_push(
            store, rows100, q100, 100, c, cap, "push 100")))
        out.append(await measure("push 100: plain insert", lambda: raw_push(
            pool, Rows(args.messages, p), 100, c, cap, "raw 100")))
        out.append(await measure("push 100 folded: broker", lambda: store_push(
            store, Rows(args.messages, p), q100f, 100, FOLD_IN_FLIGHT, cap, "push 100 folded",
            spread=True)))
        async with pool.acquire() as con:
            await con.execute("ANALYZE queen.messages, bench_raw")
        out.append(await measure("pop+ack 100: broker", lambda: store_pop_ack(
            store, q100, args.messages, 100, c, cap, "pop+ack")))
        raw_rows = await pool.fetchval("SELECT count(*) FROM bench_raw")
        out.append(await measure("pop+ack 100: plain claim-and-delete", lambda: raw_pop_ack(
            pool, raw_rows, 100, c, cap, "raw pop")))
        return out
    finally:
        await store.close()
        await pool.close()


PAIRS = [("push 1: broker", "push 1: plain insert"),
         ("push 100: broker", "push 100: plain insert"),
         ("push 100 folded: broker", "push 100: plain insert"),
         ("pop+ack 1: broker", "pop+ack 1: plain claim-and-delete"),
         ("pop+ack 100: broker", "pop+ack 100: plain claim-and-delete")]


def report(rounds: list[list[dict[str, Any]]], statements: bool) -> str:
    lines = []
    rows = []
    for broker, plain in PAIRS:
        b = [next(x for x in r if x["label"] == broker) for r in rounds]
        p = [next(x for x in r if x["label"] == plain) for r in rounds]
        cpu_ratio = [x["pg_cpu_us"] / y["pg_cpu_us"] for x, y in zip(b, p)]
        wal_ratio = [x["wal_bytes"] / y["wal_bytes"] for x, y in zip(b, p)]
        rows.append([broker.split(":")[0],
                     " / ".join(f"{x['pg_cpu_us']:.1f}" for x in b),
                     " / ".join(f"{x['pg_cpu_us']:.1f}" for x in p),
                     f"**{statistics.median(cpu_ratio):.2f}** "
                     f"({min(cpu_ratio):.2f}-{max(cpu_ratio):.2f})",
                     " / ".join(f"{x['wal_bytes']:.0f}" for x in b),
                     " / ".join(f"{x['wal_bytes']:.0f}" for x in p),
                     fmt_ratio(statistics.median(wal_ratio))])
    lines.append(table(["workload", "PG CPU µs/msg broker (per round)", "plain", "× (spread)",
                        "WAL B/msg broker", "plain", "WAL ×"], rows))
    if statements:
        for phase in rounds[-1]:
            if "broker" not in phase["label"]:
                continue
            lines.append(f"\n{phase['label']} (last round): pg_stat_statements, "
                         f"execution µs per message")
            lines.append(table(["µs/msg", "calls", "rows", "statement"],
                               [[f"{s['exec_us_per_msg']:.2f}", s["calls"], s["rows"],
                                 s["query"][:110]] for s in phase["statements"]]))
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    db = start_database()
    try:
        await enable_pg_statements(db)
        admin = await asyncpg.connect(db.dsn)
        try:
            await apply_schema(admin)
            postmaster = psutil.Process(
                await admin.fetchval("SELECT pg_backend_pid()")).ppid()
            measure = Measured(admin, PgMeter(postmaster), args.top)
            rounds = []
            for k in range(args.rounds):
                t = time.perf_counter()
                rounds.append(await one_round(args, db, measure, k))
                log(f"round {k + 1}/{args.rounds} in {time.perf_counter() - t:.0f}s")
        finally:
            await admin.close()
    finally:
        db.stop()
    print(report(rounds, args.statements))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=60_000, help="messages of push 100, pop+ack")
    ap.add_argument("--push1", type=int, default=6_000, help="messages of push 1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--cap-s", type=float, default=120.0, help="time cap of one phase")
    ap.add_argument("--statements", action="store_true", help="print pg_stat_statements")
    ap.add_argument("--top", type=int, default=8, help="statements kept per phase")
    ap.add_argument("--json", help="write every round's figures here")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
