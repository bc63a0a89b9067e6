"""``fanout``: 1, 5 and 10 consumer groups consuming the same messages.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench fanout``).

For each group count G of ``--fanout-groups`` (1, 5, 10): a fresh queue pre-filled (off the
clock) with ``--fanout-n`` messages over ``--partitions`` (16) partitions in batch-100 pushes;
then G consumer groups consume it at once, each with ceil(``--concurrency`` / G) workers doing
``GET /api/v1/pop/queue/{q}?consumerGroup=g<i>&batch=B&wait=false`` and
``POST /api/v1/ack/batch`` (``consumerGroup`` set) for what they got, until the group has all
messages (or ``--fanout-max-s``: a phase cut short is reported as truncated, not failed).
Reported: deliveries/s (deliveries / elapsed), broker CPU per 1,000 deliveries and RSS (from
/proc), and the ratio of CPU per delivery to the one-group figure (target: 10 groups <= 1.2 x
one group).  Invariant: every group receives every message exactly once
(within the time cap) and never one twice.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import time
import uuid

from _harness import BrokerMeter, fmt_broker
from _loadgen import (
    Env,
    Rows,
    ack_completed,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    http_client,
    http_push,
    log,
    ratio,
    table,
)

NAME = "fanout"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--fanout-groups", type=lambda v: [int(x) for x in v.split(",")],
                    default=[1, 5, 10], metavar="G,G", help="fanout: consumer group counts")
    ap.add_argument("--fanout-n", type=int, default=20000,
                    help="fanout: messages every group consumes")
    ap.add_argument("--fanout-max-s", type=float, default=180.0,
                    help="fanout: time cap of one group count's consumption (a phase cut short "
                         "is reported as truncated; its CPU per delivery still counts)")
    ap.add_argument("--fanout-batch", type=int, default=100, help="fanout: pop batch")


async def consume_groups(url: str, queue: str, groups: int, n: int, args: argparse.Namespace,
                         failures: list[str]) -> dict:
    seen: list[dict[str, int]] = [{} for _ in range(groups)]
    errors = empty = requests = 0
    workers = math.ceil(args.concurrency / groups)
    deadline = time.perf_counter() + args.fanout_max_s
    async with http_client(url, workers * groups) as client:
        async def worker(g: int) -> None:
            nonlocal errors, empty, requests
            group = f"g{g}"
            path = (f"/api/v1/pop/queue/{queue}?consumerGroup={group}&batch={args.fanout_batch}"
                    f"&wait=false")
            mine = seen[g]
            while len(mine) < n and time.perf_counter() < deadline:
                r = await client.get(path)
                requests += 1
                if r.status_code not in (200, 204):
                    errors += 1
                    continue
                msgs = (r.json() if r.content else {}).get("messages") or []
                if not msgs:
                    empty += 1
                    await asyncio.sleep(0.002)
                    continue
                for m in msgs:
                    mine[m["transactionId"]] = mine.get(m["transactionId"], 0) + 1
                a = await ack_completed(client, msgs, group)
                requests += 1
                if a.status_code != 200:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(g) for g in range(groups) for _ in range(workers)))
        elapsed = time.perf_counter() - t0
    missing = sum(n - len(s) for s in seen)
    twice = sum(1 for s in seen for c in s.values() if c > 1)
    truncated = missing > 0 and time.perf_counter() >= deadline
    if truncated:
        log(f"note: fanout {groups} groups hit the time cap ({args.fanout_max_s:g} s) with "
            f"{missing} deliveries to go")
    if (missing and not truncated) or twice or errors:
        failures.append(f"fanout {groups} groups: {missing} deliveries missing, {twice} "
                        f"twice, {errors} failed requests")
    deliveries = sum(sum(s.values()) for s in seen)
    return {"groups": groups, "workers_per_group": workers, "messages": n,
            "deliveries": deliveries, "elapsed_s": elapsed,
            "deliveries_per_s": deliveries / elapsed if elapsed else None,
            "requests": requests, "empty_pops": empty, "errors": errors,
            "missing": missing, "delivered_twice": twice, "truncated_by_time_cap": truncated}


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    results: list[dict] = []
    with Env() as env:
        url = env.broker.url
        await http_push(url, f"bench-warmup-{uuid.uuid4().hex[:8]}", Rows(500, 16), 1,
                        args.concurrency, 30, "warm-up")
        for groups in args.fanout_groups:
            queue = f"bench-fanout-{groups}-{uuid.uuid4().hex[:6]}"
            fill = await http_push(url, queue, Rows(args.fanout_n, args.partitions), 100,
                                   args.concurrency, 120, f"fanout prefill {groups}")
            if fill.done != args.fanout_n:
                failures.append(f"fanout prefill: {fill.done}/{args.fanout_n} queued")
            meter = BrokerMeter(env.broker)
            res = await consume_groups(url, queue, groups, args.fanout_n, args, failures)
            res["broker"] = meter.figures(res["deliveries"])
            log(f"{groups} group(s): {res['deliveries']} deliveries in {res['elapsed_s']:.2f}s = "
                f"{fmt_rate(res['deliveries_per_s'])}/s; {fmt_broker(res['broker'])}")
            results.append(res)
    one = next((r["broker"]["broker_cpu_ms_per_1000"] for r in results if r["groups"] == 1), None)
    for r in results:
        r["cpu_per_delivery_vs_1_group"] = ratio(r["broker"]["broker_cpu_ms_per_1000"], one)
    print()
    print(table(["fanout", "workers/group", "deliveries", "deliveries/s",
                 "broker CPU ms/1k deliveries", "÷ 1 group", "broker peak RSS MB"],
                [[f"{r['groups']} group(s)", r["workers_per_group"], r["deliveries"],
                  fmt_rate(r["deliveries_per_s"]), fmt_ms(r["broker"]["broker_cpu_ms_per_1000"]),
                  fmt_ratio(r["cpu_per_delivery_vs_1_group"]),
                  f"{r['broker']['broker_peak_rss_mb']:.0f}"] for r in results]))
    print(f"  {args.fanout_n} messages over {args.partitions} partitions, pop batch "
          f"{args.fanout_batch}; target: CPU per delivery with 10 groups <= 1.2 x one group")
    return {"results": results,
            "broker": max((r["broker"] for r in results),
                          key=lambda f: f["broker_peak_rss_mb"], default=None)}


def summary_rows(res: dict) -> list[list[str]]:
    return [[f"fanout: {r['groups']} group(s), deliveries/s",
             f"{fmt_rate(r['deliveries_per_s'])}/s, {fmt_ms(r['broker']['broker_cpu_ms_per_1000'])} "
             f"ms CPU/1k", "1 group, same run",
             f"{fmt_ratio(r['cpu_per_delivery_vs_1_group'])} CPU/delivery of 1 group"]
            for r in res["results"]]
