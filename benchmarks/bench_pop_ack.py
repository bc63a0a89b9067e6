"""``pop``: msg/s of pop + ack over HTTP against a raw-asyncpg baseline.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench pop``).

A queue pre-filled off the clock (batch-100 pushes over ``--partitions`` partitions); then
``--concurrency`` workers each do ``GET /api/v1/pop/queue/{q}?batch=B&wait=false`` and
``POST /api/v1/ack/batch`` with every returned item, at B=1 (``--pop-n1`` messages) and B=100
(``--pop-n100``).  The raw baseline, per worker and in one transaction: ``SELECT ... FROM
bench_raw LIMIT B FOR UPDATE SKIP LOCKED`` + ``DELETE ... WHERE id = ANY(...)``.  Reported:
msg/s of both, broker / raw, empty pops, broker CPU per 1,000 messages and RSS, the load
generator's ceiling.
"""
from __future__ import annotations

import argparse
import uuid

import _loadgen as loadgen
from _harness import BrokerMeter, fmt_broker
from _loadgen import (
    RAW_INSERT_MANY,
    RAW_TABLE,
    THROUGHPUT_HEADERS,
    Env,
    Rows,
    broker_summary,
    check_phases,
    fmt_rate,
    http_pop_ack,
    http_push,
    latency_summary,
    log,
    median,
    ratio,
    raw_pop_ack,
    table,
    throughput_rows,
    throughput_summary_rows,
    warm_up,
)

NAME = "pop"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pop-n1", type=int, default=3000, help="messages popped at batch 1")
    ap.add_argument("--pop-n100", type=int, default=30000, help="messages popped at batch 100")


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    sizes = [(1, args.pop_n1), (100, args.pop_n100)]
    results = []
    with Env() as env:
        pool = await env.pool(args.concurrency)
        try:
            await pool.execute(RAW_TABLE)
            ceiling = await warm_up(env, args)
            for batch, n in sizes:
                broker_rates, raw_rates, phases = [], [], []
                for rnd in range(args.rounds):
                    rows = Rows(n, args.partitions)
                    queue = f"bench-pop-{batch}-{uuid.uuid4().hex[:8]}"
                    # pre-fill (not timed): batch-100 pushes, message i -> partition i % P
                    fill = await http_push(env.broker.url, queue, rows, 100,
                                           args.concurrency, 120, f"pop prefill b={batch}")
                    if fill.done != n:
                        failures.append(f"pop prefill: {fill.done}/{n} queued "
                                        f"({fill.first_error})")
                    await pool.execute("TRUNCATE bench_raw")
                    for chunk in rows.chunks(100):
                        await pool.execute(RAW_INSERT_MANY, *rows.raw_args(chunk, 100))
                    await pool.execute("VACUUM ANALYZE bench_raw")

                    meter = BrokerMeter(env.broker)
                    p = await http_pop_ack(env.broker.url, queue, n, batch, args.concurrency,
                                           args.max_seconds, f"pop broker b={batch} r={rnd}")
                    p.broker = meter.figures(p.done)
                    log(f"broker pop+ack batch {batch}: {p.done} msgs in {p.elapsed:.2f}s = "
                        f"{fmt_rate(p.rate)} msg/s ({p.empty} empty pops); {fmt_broker(p.broker)}")
                    q = await raw_pop_ack(pool, n, batch, args.concurrency, args.max_seconds,
                                          f"pop raw b={batch} r={rnd}")
                    log(f"raw    pop+del batch {batch}: {q.done} msgs in {q.elapsed:.2f}s = "
                        f"{fmt_rate(q.rate)} msg/s")
                    phases += [p, q]
                    broker_rates.append(p.rate or 0.0)
                    raw_rates.append(q.rate or 0.0)
                check_phases(phases, failures)
                b, r = median(broker_rates), median(raw_rates)
                mine = [x for x in phases if x.broker is not None]
                results.append({"batch": batch, "messages": n, "broker_msgs_per_s": b,
                                "raw_msgs_per_s": r, "ratio": ratio(b, r),
                                "broker": broker_summary(mine),
                                "request_ms": latency_summary(mine),
                                "phases": [x.as_dict() for x in phases]})
        finally:
            await pool.close()
    print()
    print(table(["pop+ack", *THROUGHPUT_HEADERS], throughput_rows(results)))
    print(f"  load generator: {loadgen.CLIENT} client; ceiling at C={args.concurrency} (GET /health): "
          f"{fmt_rate(ceiling[loadgen.CLIENT])} req/s (httpx: {fmt_rate(ceiling['httpx'])} req/s); "
          f"pop+ack costs 2 requests per pop")
    return {"client": loadgen.CLIENT, "client_ceiling_req_per_s": ceiling, "results": results}


def summary_rows(res: dict) -> list[list[str]]:
    return throughput_summary_rows(NAME, "pop+ack", res)
