"""``partitions``: push and wildcard pops over 1,000 and 10,000 partitions.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench partitions``).

1. **Push.**  For 16 partitions (the baseline, as in ``push``) and for each count of
   ``--partition-counts`` (1,000 and 10,000): a fresh queue whose partitions are created first,
   off the clock (one message each, 100 partitions per request), then the same measurement as
   ``push``: ``--push-n1`` messages at 1 item per request and ``--push-n100`` at 100, the same
   client and concurrency, request *k* to partition *k % P*.  Reported: msg/s, the ratio to
   the 16-partition figure of this run (target at 10,000: >= 0.8), request p50/p99, broker CPU
   per 1,000 messages and RSS.
2. **Wildcard pops finding work.**  For each count: a fresh queue where every partition holds
   ``--wildcard-per-partition`` messages, then ``--wildcard-consumers`` consumers doing
   ``GET /api/v1/pop/queue/{q}?batch=..&wait=true&timeout=1000`` (no partition) and acking what
   they get, until every partition has been served once or ``--wildcard-cap-s`` passed.
   Reported: partitions served (of those with pending messages), the time until the last one
   was first served, pops that came back empty, broker CPU per 1,000 messages and RSS.  A
   partition with pending messages never served within the cap is an invariant failure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from _harness import BrokerMeter, fmt_broker
from _loadgen import (
    JSON_HEADERS,
    Env,
    Rows,
    ack_completed,
    check_phases,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    http_client,
    http_push,
    latency_summary,
    log,
    percentile,
    ratio,
    table,
)

NAME = "partitions"
BASELINE_PARTITIONS = 16


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--partition-counts", type=lambda v: [int(x) for x in v.split(",")],
                    default=[1000, 10000], metavar="N,N",
                    help="partitions: partition counts compared with 16")
    ap.add_argument("--wildcard-per-partition", type=int, default=2,
                    help="partitions: messages pending in every partition before the pops")
    ap.add_argument("--wildcard-consumers", type=int, default=8,
                    help="partitions: concurrent wildcard consumers")
    ap.add_argument("--wildcard-batch", type=int, default=10,
                    help="partitions: batch of one wildcard pop")
    ap.add_argument("--wildcard-cap-s", type=float, default=300.0,
                    help="partitions: longest wait for every pending partition to be served")


async def create_partitions(url: str, queue: str, partitions: int, per_partition: int,
                            concurrency: int) -> int:
    """Push ``per_partition`` messages into each of partitions p0..p<n-1> of ``queue``, 100 items
    (of several partitions) per request; answers how many were queued."""
    items = [{"queue": queue, "partition": f"p{i}", "transactionId": f"{queue}-{i}-{k}",
              "payload": {"p": i, "k": k}}
             for k in range(per_partition) for i in range(partitions)]
    bodies = [json.dumps({"items": items[s:s + 100]}) for s in range(0, len(items), 100)]
    queued = 0
    it = iter(bodies)
    async with http_client(url, concurrency) as client:
        async def worker() -> None:
            nonlocal queued
            for body in it:
                r = await client.post("/api/v1/push", content=body, headers=JSON_HEADERS)
                if r.status_code in (200, 201):
                    queued += sum(1 for x in r.json() if x.get("status") == "queued")
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return queued


async def wildcard_serve(url: str, queue: str, partitions: int, args: argparse.Namespace,
                         failures: list[str]) -> dict:
    """Wildcard consumers until every partition was served once (or the cap)."""
    first_served: dict[str, float] = {}
    delivered = pops = empty = errors = 0
    t0 = time.perf_counter()
    deadline = t0 + args.wildcard_cap_s
    path = (f"/api/v1/pop/queue/{queue}?batch={args.wildcard_batch}&wait=true&timeout=1000")
    async with http_client(url, args.wildcard_consumers) as client:
        async def consumer() -> None:
            nonlocal delivered, pops, empty, errors
            while len(first_served) < partitions and time.perf_counter() < deadline:
                r = await client.get(path)
                pops += 1
                if r.status_code not in (200, 204):
                    errors += 1
                    await asyncio.sleep(0.05)
                    continue
                msgs = (r.json() if r.content else {}).get("messages") or []
                if not msgs:
                    empty += 1
                    continue
                now = time.perf_counter() - t0
                for m in msgs:
                    first_served.setdefault(m["partition"], now)
                a = await ack_completed(client, msgs)
                if a.status_code != 200:
                    errors += 1
                delivered += len(msgs)
        await asyncio.gather(*(consumer() for _ in range(args.wildcard_consumers)))
    elapsed = time.perf_counter() - t0
    times = sorted(first_served.values())
    never = partitions - len(first_served)
    if never:
        failures.append(f"partitions: {never} of {partitions} partitions with pending messages "
                        f"never served by wildcard pops within {args.wildcard_cap_s:g} s")
    if errors:
        failures.append(f"partitions: {errors} pop/ack requests failed serving {partitions} "
                        f"partitions")
    return {"partitions_pending": partitions, "partitions_served": len(first_served),
            "never_served": never, "last_served_after_s": times[-1] if times else None,
            "half_served_after_s": percentile(times, 50), "elapsed_s": elapsed,
            "pops": pops, "empty_pops": empty, "delivered": delivered, "errors": errors}


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    counts = [BASELINE_PARTITIONS, *args.partition_counts]
    sizes = [(1, args.push_n1), (100, args.push_n100)]
    push: list[dict] = []
    serve: list[dict] = []
    with Env() as env:
        url = env.broker.url
        await http_push(url, f"bench-warmup-{uuid.uuid4().hex[:8]}", Rows(500, 16), 1,
                        args.concurrency, 30, "warm-up")
        for p_count in counts:
            for batch, n in sizes:
                queue = f"bench-parts-{p_count}-{batch}-{uuid.uuid4().hex[:6]}"
                t = time.perf_counter()
                made = await create_partitions(url, queue, p_count, 1, args.concurrency)
                if made != p_count:
                    failures.append(f"partitions: creating {p_count} partitions queued {made}")
                log(f"{p_count} partitions created in {time.perf_counter() - t:.1f}s (not timed)")
                rows = Rows(n, p_count)
                meter = BrokerMeter(env.broker)
                phase = await http_push(url, queue, rows, batch, args.concurrency,
                                        args.max_seconds, f"push {p_count} partitions b={batch}")
                phase.broker = meter.figures(phase.done)
                check_phases([phase], failures)
                log(f"push batch {batch} over {p_count} partitions: {fmt_rate(phase.rate)} msg/s; "
                    f"{fmt_broker(phase.broker)}")
                push.append({"partitions": p_count, "batch": batch, "messages": n,
                             "msgs_per_s": phase.rate, "request_ms": latency_summary([phase]),
                             "broker": phase.broker, "phase": phase.as_dict()})
        base = {r["batch"]: r["msgs_per_s"] for r in push if r["partitions"] == BASELINE_PARTITIONS}
        for r in push:
            r["ratio_to_16"] = ratio(r["msgs_per_s"], base.get(r["batch"]))
        for p_count in args.partition_counts:
            queue = f"bench-wild-{p_count}-{uuid.uuid4().hex[:6]}"
            t = time.perf_counter()
            made = await create_partitions(url, queue, p_count, args.wildcard_per_partition,
                                           args.concurrency)
            log(f"{p_count} partitions x {args.wildcard_per_partition} messages pushed in "
                f"{time.perf_counter() - t:.1f}s (not timed)")
            meter = BrokerMeter(env.broker)
            res = await wildcard_serve(url, queue, p_count, args, failures)
            res["pushed"] = made
            res["broker"] = meter.figures(res["delivered"])
            log(f"wildcard pops over {p_count} partitions: {res['partitions_served']} served, "
                f"last after {fmt_ms(res['last_served_after_s'])} s; {fmt_broker(res['broker'])}")
            serve.append(res)
    print()
    print(table(["push", "partitions", "msg/s", "÷ 16 partitions", "request p50 / p99 ms",
                 "broker CPU ms/1k msgs", "broker peak RSS MB"],
                [[f"batch {r['batch']}", r["partitions"], fmt_rate(r["msgs_per_s"]),
                  fmt_ratio(r["ratio_to_16"]),
                  f"{fmt_ms(r['request_ms']['p50'])} / {fmt_ms(r['request_ms']['p99'])}",
                  fmt_ms(r["broker"]["broker_cpu_ms_per_1000"]),
                  f"{r['broker']['broker_peak_rss_mb']:.0f}"] for r in push]))
    print(table(["wildcard pops", "served / pending partitions", "last served after s",
                 "half served after s", "pops (empty)", "broker CPU ms/1k msgs",
                 "broker peak RSS MB"],
                [[f"{r['partitions_pending']} partitions",
                  f"{r['partitions_served']} / {r['partitions_pending']}",
                  fmt_ms(r["last_served_after_s"]), fmt_ms(r["half_served_after_s"]),
                  f"{r['pops']} ({r['empty_pops']})",
                  fmt_ms(r["broker"]["broker_cpu_ms_per_1000"]),
                  f"{r['broker']['broker_peak_rss_mb']:.0f}"] for r in serve]))
    print(f"  target: push over 10,000 partitions >= 0.8 of 16; every pending partition served "
          f"({args.wildcard_consumers} consumers, batch {args.wildcard_batch}, "
          f"cap {args.wildcard_cap_s:g} s)")
    return {"push": push, "wildcard": serve,
            "broker": max((r["broker"] for r in push + serve),
                          key=lambda f: f["broker_peak_rss_mb"], default=None)}


def summary_rows(res: dict) -> list[list[str]]:
    rows = [[f"partitions: push batch {r['batch']}, {r['partitions']} partitions",
             f"{fmt_rate(r['msgs_per_s'])} msg/s", "16 partitions, same run",
             f"{fmt_ratio(r['ratio_to_16'])} of 16"]
            for r in res["push"] if r["partitions"] != BASELINE_PARTITIONS]
    rows += [[f"partitions: wildcard pops, {r['partitions_pending']} partitions",
              f"{r['partitions_served']}/{r['partitions_pending']} served, last after "
              f"{fmt_ms(r['last_served_after_s'])} s", "every pending partition served",
              "OK" if not r["never_served"] else "INVARIANT FAILED"] for r in res["wildcard"]]
    return rows
