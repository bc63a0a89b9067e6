"""``backlog``: pops and the background jobs over a backlog of 10 M messages.

Registered in run.py (``python3 dev.py bench backlog``; ``--backlog-messages`` sets the size).

1. **Load** (SQL, like stats_scale.py, before the broker starts): the schema, one queue with
   ``--backlog-partitions`` partitions and ``--backlog-messages`` messages in
   ``queen.messages`` (``generate_series``; ``seq`` dense 1..n per partition and
   ``partitions.last_seq = n``, so pushes continue after them; ids ordered like the broker's
   UUIDv7s; creation times spread evenly over the hour that ended an hour ago), in statements of
   ``--backlog-chunk`` rows, then ``VACUUM ANALYZE``.  The load's duration is reported.
2. **Broker** on that database with ``STATS_INTERVAL_MS`` and ``RETENTION_INTERVAL`` at one
   hour, so its own jobs only run when asked: ``POST /api/v1/system/jobs/<job>/run`` runs one
   cycle of the broker's job and answers its result (``durationMs`` is the job's own timing).
3. **Statistics**: the first cycle (no stats yet: every partition counted over the backlog).
4. **Pops**: ``--backlog-consumers`` consumers, ``--backlog-pops`` wildcard pops in all
   (``GET /api/v1/pop/queue/{q}?batch=B&wait=false``), each acked; p50/p99/max of the pop
   request, msg/s, broker CPU per 1,000 messages and RSS.
5. **Statistics again** (incremental: the partitions the pops touched), then a forced full
   recount (``POST /api/v1/stats/refresh`` with ``{"full": true}``).
6. **Retention**: ``POST /api/v1/configure`` sets ``retentionEnabled`` and a
   ``retentionSeconds`` that makes the oldest ``--backlog-retention-fraction`` of every
   partition due; one retention cycle deletes them (in rounds of ``RETENTION_BATCH_SIZE``); a
   second cycle with nothing due shows the cost of the sweep itself on the backlog.  Messages
   left in ``queen.messages`` are checked against what should be left (invariant).
"""
from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import asyncpg
import httpx

from _harness import Broker, BrokerMeter, fmt_broker, start_database
from _loadgen import (
    ack_completed,
    fmt_ms,
    fmt_rate,
    http_client,
    log,
    percentile,
    table,
)
from broker.store.schema import apply_schema

NAME = "backlog"
HOUR_MS = 3_600_000


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--backlog-messages", type=int, default=10_000_000,
                    help="backlog: messages bulk-loaded with SQL")
    ap.add_argument("--backlog-partitions", type=int, default=100,
                    help="backlog: partitions of the backlog queue")
    ap.add_argument("--backlog-chunk", type=int, default=1_000_000,
                    help="backlog: rows per load statement (progress is logged per chunk)")
    ap.add_argument("--backlog-pops", type=int, default=1000,
                    help="backlog: wildcard pops measured (each acked)")
    ap.add_argument("--backlog-consumers", type=int, default=4,
                    help="backlog: concurrent consumers")
    ap.add_argument("--backlog-batch", type=int, default=100, help="backlog: pop batch")
    ap.add_argument("--backlog-retention-fraction", type=float, default=0.01,
                    help="backlog: share of every partition (the oldest) the retention cycle "
                         "finds due")


LOAD_QUEUE = "INSERT INTO queen.queues (name) VALUES ($1) RETURNING id"
LOAD_PARTITIONS = """
INSERT INTO queen.partitions (queue_id, name, last_seq, last_message_at)
SELECT $1, 'p' || j, $3, now() - interval '1 hour' FROM generate_series(0, $2 - 1) j"""
# Rows $2..$3 of partition $1 (seq dense from 1).  Ids: a UUIDv7-shaped value ordered by
# (partition index, seq), as the broker's time-ordered ids are (random ids would cost a random
# B-tree insert per row and make the load several times slower).  Creation times: evenly over
# the hour that ended an hour before the load, in seq order.
LOAD_MESSAGES = """
INSERT INTO queen.messages (id, partition_id, seq, transaction_id, payload, created_at)
SELECT ('00000000-0000-7000-8' || lpad(to_hex($4::int), 3, '0') || '-'
        || lpad(to_hex(g), 12, '0'))::uuid,
       $1, g, 'bl-' || g, '{"n": 1, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb,
       $5::timestamptz + (g * 3600.0 / $6) * interval '1 second'
FROM generate_series($2::bigint, $3::bigint) g"""


DUE_BEFORE = """
SELECT count(*) FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 AND m.created_at < $2"""


async def load(dsn: str, queue: str, messages: int, partitions: int, chunk: int) -> dict:
    per = messages // partitions
    conn = await asyncpg.connect(dsn)
    try:
        await apply_schema(conn)
        t0 = time.perf_counter()
        qid = await conn.fetchval(LOAD_QUEUE, queue)
        await conn.execute(LOAD_PARTITIONS, qid, partitions, per)
        parts = await conn.fetch("SELECT id, name FROM queen.partitions WHERE queue_id = $1 "
                                 "ORDER BY substr(name, 2)::int", qid)
        start = await conn.fetchval("SELECT now() - interval '2 hours'")
        done = next_log = 0
        for idx, p in enumerate(parts):
            for lo in range(1, per + 1, chunk):
                hi = min(per, lo + chunk - 1)
                await conn.execute(LOAD_MESSAGES, p["id"], lo, hi, idx, start, per)
                done += hi - lo + 1
                if done >= next_log:
                    log(f"backlog load: {done:,} / {per * partitions:,} rows "
                        f"({time.perf_counter() - t0:.0f}s)")
                    next_log = done + chunk
        t_rows = time.perf_counter() - t0
        await conn.execute("VACUUM ANALYZE queen.messages")
        await conn.execute("VACUUM ANALYZE queen.partitions")
        total = time.perf_counter() - t0
        size = await conn.fetchval("SELECT pg_total_relation_size('queen.messages')")
    finally:
        await conn.close()
    return {"messages": per * partitions, "partitions": partitions, "per_partition": per,
            "rows_s": t_rows, "vacuum_s": total - t_rows, "load_s": total,
            "table_mb": size / 2**20}


async def run_job(client: httpx.AsyncClient, job: str) -> dict:
    r = await client.post(f"/api/v1/system/jobs/{job}/run", timeout=600)
    r.raise_for_status()
    return r.json()


async def timed_pops(url: str, queue: str, args: argparse.Namespace,
                     failures: list[str]) -> dict:
    lat: list[float] = []
    delivered = errors = empty = 0
    left = args.backlog_pops
    path = f"/api/v1/pop/queue/{queue}?batch={args.backlog_batch}&wait=false"
    deadline = time.perf_counter() + args.max_seconds
    async with http_client(url, args.backlog_consumers) as client:
        async def consumer() -> None:
            nonlocal delivered, errors, empty, left
            while left > 0 and time.perf_counter() < deadline:
                left -= 1
                t = time.perf_counter()
                r = await client.get(path)
                lat.append((time.perf_counter() - t) * 1000)
                if r.status_code not in (200, 204):
                    errors += 1
                    continue
                msgs = (r.json() if r.content else {}).get("messages") or []
                if not msgs:
                    empty += 1
                    continue
                a = await ack_completed(client, msgs)
                if a.status_code != 200:
                    errors += 1
                delivered += len(msgs)
        t0 = time.perf_counter()
        await asyncio.gather(*(consumer() for _ in range(args.backlog_consumers)))
        elapsed = time.perf_counter() - t0
    if errors:
        failures.append(f"backlog: {errors} pop/ack requests failed")
    return {"pops": len(lat), "delivered": delivered, "empty_pops": empty, "errors": errors,
            "elapsed_s": elapsed, "msgs_per_s": delivered / elapsed if elapsed else None,
            "pop_ms": {"p50": percentile(lat, 50), "p99": percentile(lat, 99),
                       "max": max(lat) if lat else None}}


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    queue = f"bench-backlog-{uuid.uuid4().hex[:6]}"
    db = start_database()
    broker = None
    res: dict = {}
    try:
        log(f"{db.kind} PostgreSQL on {db.host}:{db.port}; loading {args.backlog_messages:,} "
            f"messages into {args.backlog_partitions} partitions")
        res["load"] = ld = await load(db.dsn, queue, args.backlog_messages,
                                      args.backlog_partitions, args.backlog_chunk)
        log(f"loaded {ld['messages']:,} messages in {ld['load_s']:.0f}s (rows {ld['rows_s']:.0f}s, "
            f"VACUUM ANALYZE {ld['vacuum_s']:.0f}s; queen.messages {ld['table_mb']:,.0f} MB)")
        broker = Broker(db, STATS_INTERVAL_MS=str(HOUR_MS), RETENTION_INTERVAL=str(HOUR_MS))
        meter_all = BrokerMeter(broker)
        async with httpx.AsyncClient(base_url=broker.url, timeout=600) as ctl:
            res["stats_first"] = await run_job(ctl, "stats")
            log(f"stats cycle, first (every partition counted): "
                f"{res['stats_first']['durationMs']:.0f} ms")
            meter = BrokerMeter(broker)
            res["pops"] = pops = await timed_pops(broker.url, queue, args, failures)
            pops["broker"] = meter.figures(pops["delivered"])
            log(f"{pops['pops']} pops: p50/p99 {fmt_ms(pops['pop_ms']['p50'])}/"
                f"{fmt_ms(pops['pop_ms']['p99'])} ms, {fmt_rate(pops['msgs_per_s'])} msg/s; "
                f"{fmt_broker(pops['broker'])}")
            res["stats_incremental"] = await run_job(ctl, "stats")
            r = await ctl.post("/api/v1/stats/refresh", json={"full": True}, timeout=600)
            res["stats_full"] = r.json()
            log(f"stats cycle after the pops {res['stats_incremental']['durationMs']:.0f} ms; "
                f"forced full {res['stats_full'].get('durationMs', 0):.0f} ms")
            # retention: the oldest fraction of every partition falls due
            conn = await asyncpg.connect(db.dsn)
            try:
                due_seq = max(1, int(ld["per_partition"] * args.backlog_retention_fraction))
                age = await conn.fetchval(
                    "SELECT extract(epoch FROM now() - m.created_at) FROM queen.messages m "
                    "JOIN queen.partitions p ON p.id = m.partition_id "
                    "JOIN queen.queues q ON q.id = p.queue_id "
                    "WHERE q.name = $1 AND p.name = 'p0' AND m.seq = $2", queue, due_seq)
                seconds = int(age) - 1  # messages older than this: seq <= due_seq (about)
                r = await ctl.post("/api/v1/configure", json={
                    "queue": queue, "options": {"retentionEnabled": True,
                                                "retentionSeconds": seconds}})
                r.raise_for_status()
                # Due at this moment; the job's own cut-off is later (its now()), so every
                # message older than this one must be gone after the cycle.
                cutoff = await conn.fetchval("SELECT now() - make_interval(secs => $1)", seconds)
                expect = await conn.fetchval(DUE_BEFORE, queue, cutoff)
                res["retention_due"] = expect
                res["retention_cycle"] = await run_job(ctl, "retention")
                res["retention_idle_cycle"] = await run_job(ctl, "retention")
                left_due = await conn.fetchval(DUE_BEFORE, queue, cutoff)
                res["left"] = await conn.fetchval(
                    "SELECT count(*) FROM queen.messages m JOIN queen.partitions p "
                    "ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id "
                    "WHERE q.name = $1", queue)
            finally:
                await conn.close()
            deleted = (res["retention_cycle"].get("deleted") or {}).get("retention")
            res["retention_deleted"] = deleted
            if left_due or deleted is None or deleted < expect:
                failures.append(f"backlog: retention left {left_due} messages that were due "
                                f"before the cycle (deleted {deleted}; {expect} were due)")
            log(f"retention cycle: {deleted} deleted in "
                f"{res['retention_cycle']['durationMs']:.0f} ms; nothing due: "
                f"{res['retention_idle_cycle']['durationMs']:.0f} ms")
            res["stats_after_retention"] = await run_job(ctl, "stats")
        meter_all.stop()
        res["broker"] = meter_all.figures(pops["delivered"])
    finally:
        if broker is not None:
            broker.stop()
        db.stop()
    print_result(res, args)
    return res


def _ms(cycle: dict | None) -> str:
    return "-" if not cycle or cycle.get("durationMs") is None else f"{cycle['durationMs']:,.0f}"


def print_result(res: dict, args: argparse.Namespace) -> None:
    ld, pops = res["load"], res["pops"]
    print()
    print(table([f"backlog: {ld['messages']:,} messages, {ld['partitions']} partitions", "value"], [
        ["load: rows / VACUUM ANALYZE / total (s)",
         f"{ld['rows_s']:.0f} / {ld['vacuum_s']:.0f} / {ld['load_s']:.0f}"],
        ["queen.messages size (MB)", f"{ld['table_mb']:,.0f}"],
        ["stats cycle, first: every partition counted (ms)", _ms(res["stats_first"])],
        [f"pop (batch {args.backlog_batch}, {args.backlog_consumers} consumers) p50 / p99 / max "
         f"(ms)", f"{fmt_ms(pops['pop_ms']['p50'])} / {fmt_ms(pops['pop_ms']['p99'])} / "
         f"{fmt_ms(pops['pop_ms']['max'])}"],
        ["pop+ack msg/s (pops, empty)",
         f"{fmt_rate(pops['msgs_per_s'])} ({pops['pops']}, {pops['empty_pops']})"],
        ["broker during the pops", fmt_broker(pops["broker"])],
        ["stats cycle after the pops (ms)", _ms(res["stats_incremental"])],
        ["stats cycle, forced full recount (ms)", _ms(res["stats_full"])],
        [f"retention cycle deleting {res['retention_deleted']} of {res['retention_due']} due (ms)",
         _ms(res["retention_cycle"])],
        ["retention cycle, nothing due (ms)", _ms(res["retention_idle_cycle"])],
        ["stats cycle after retention (ms)", _ms(res["stats_after_retention"])],
        ["broker (whole run)", fmt_broker(res["broker"])],
    ]))


def summary_rows(res: dict) -> list[list[str]]:
    ld, pops = res["load"], res["pops"]
    p = pops["pop_ms"]
    return [[f"backlog: {ld['messages']:,} msgs, pop p50/p99",
             f"{fmt_ms(p['p50'])}/{fmt_ms(p['p99'])} ms", f"load {ld['load_s']:.0f} s", ""],
            ["backlog: stats cycle first / after pops / full",
             f"{_ms(res['stats_first'])} / {_ms(res['stats_incremental'])} / "
             f"{_ms(res['stats_full'])} ms", "", ""],
            ["backlog: retention cycle deleting / nothing due",
             f"{_ms(res['retention_cycle'])} / {_ms(res['retention_idle_cycle'])} ms",
             f"{res['retention_deleted']} deleted", ""]]
