"""``push``: msg/s through ``POST /api/v1/push`` against a raw-asyncpg baseline.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench push``).

At 1 item per request (``--push-n1`` messages) and at 100 (``--push-n100``), ``--concurrency``
client tasks push over ``--partitions`` partitions (one partition per request); then the raw
baseline inserts the same rows into a scratch table ``bench_raw`` shaped like
``queen.messages`` (one ``INSERT`` per message at batch 1, one ``INSERT ... SELECT FROM
unnest(...)`` per 100 rows) over a pool of the same size.  ``--rounds`` repeats each
broker-then-raw pair (medians reported).  Reported: msg/s of both, broker / raw, request
p50/p99, broker CPU per 1,000 messages and RSS, and the load generator's ceiling
(``GET /health`` req/s at the same concurrency, measured after a warm-up off the clock).
"""
from __future__ import annotations

import argparse
import uuid

import _loadgen as loadgen
from _harness import BrokerMeter, fmt_broker
from _loadgen import (
    RAW_TABLE,
    THROUGHPUT_HEADERS,
    Env,
    Rows,
    broker_summary,
    check_phases,
    fmt_ms,
    fmt_rate,
    http_push,
    latency_summary,
    log,
    median,
    ratio,
    raw_push,
    table,
    throughput_rows,
    throughput_summary_rows,
    warm_up,
)

NAME = "push"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--push-n1", type=int, default=5000, help="messages pushed at batch 1")
    ap.add_argument("--push-n100", type=int, default=50000, help="messages pushed at batch 100")


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    sizes = [(1, args.push_n1), (100, args.push_n100)]
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
                    queue = f"bench-push-{batch}-{uuid.uuid4().hex[:8]}"
                    meter = BrokerMeter(env.broker)
                    p = await http_push(env.broker.url, queue, rows, batch, args.concurrency,
                                        args.max_seconds, f"push broker b={batch} r={rnd}")
                    p.broker = meter.figures(p.done)
                    log(f"broker push batch {batch}: {p.done} msgs in {p.elapsed:.2f}s = "
                        f"{fmt_rate(p.rate)} msg/s; {fmt_broker(p.broker)}")
                    await pool.execute("TRUNCATE bench_raw")
                    q = await raw_push(pool, rows, batch, args.concurrency, args.max_seconds,
                                       f"push raw b={batch} r={rnd}")
                    log(f"raw    push batch {batch}: {q.done} msgs in {q.elapsed:.2f}s = "
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
    print(table(["push", *THROUGHPUT_HEADERS], throughput_rows(results)))
    for res in results:
        lat = res["request_ms"]
        print(f"  batch {res['batch']}: request p50 / p99 {fmt_ms(lat['p50'])} / "
              f"{fmt_ms(lat['p99'])} ms")
    print(f"  load generator: {loadgen.CLIENT} client; ceiling at C={args.concurrency} (GET /health): "
          f"{fmt_rate(ceiling[loadgen.CLIENT])} req/s (httpx: {fmt_rate(ceiling['httpx'])} req/s)")
    return {"client": loadgen.CLIENT, "client_ceiling_req_per_s": ceiling, "results": results}


def summary_rows(res: dict) -> list[list[str]]:
    return throughput_summary_rows(NAME, "push", res)
