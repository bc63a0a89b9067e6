"""``consume``: the official client's ``consume()`` loop end to end, checked for order, loss and
duplicates.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench consume``).

The official client (``queen-mq``) ``consume()`` (``--consume-concurrency`` workers, batch
``--consume-batch``, partitions 1, long poll 1 s, auto-ack) processes ``--consume-n`` messages
pushed while it runs by ``--consume-producers`` concurrent producers into ``--partitions``
partitions (each producer owns some partitions and pushes them in order; every message carries
its partition's sequence number).  Reported: the time until the last message was handled and
msg/s.  Invariant: per-partition order kept, none lost, none delivered twice, nothing
unexpected.
"""
from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from _harness import BrokerMeter, fmt_broker
from _loadgen import PAD, Env, fmt_rate, table

NAME = "consume"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--consume-n", type=int, default=10000, help="messages through consume()")
    ap.add_argument("--consume-producers", type=int, default=4, help="concurrent producers")
    ap.add_argument("--consume-concurrency", type=int, default=8, help="consume() workers")
    ap.add_argument("--consume-batch", type=int, default=50, help="consume() batch size")


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    from queen import Queen

    n, parts, producers = args.consume_n, args.partitions, args.consume_producers
    per_part = [len(range(p, n, parts)) for p in range(parts)]
    chunk = 25
    queue = f"bench-consume-{uuid.uuid4().hex[:8]}"
    seen: dict[str, int] = {}
    order: dict[int, list[int]] = {p: [] for p in range(parts)}
    unique = 0
    all_in = asyncio.Event()
    t_last = 0.0
    stop = asyncio.Event()

    async def handler(msgs: Any) -> None:
        nonlocal unique, t_last
        for m in msgs if isinstance(msgs, list) else [msgs]:
            tx = m["transactionId"]
            count = seen.get(tx, 0)
            seen[tx] = count + 1
            data = m["data"]
            order[data["p"]].append(data["seq"])
            if count == 0:
                unique += 1
                t_last = time.perf_counter()
        if unique >= n:
            all_in.set()

    with Env() as env:
        async with Queen(url=env.broker.url) as client:
            async def produce(k: int) -> None:
                mine = [p for p in range(parts) if p % producers == k]
                for start in range(0, max(per_part), chunk):
                    for p in mine:
                        seqs = range(start, min(start + chunk, per_part[p]))
                        if not seqs:
                            continue
                        await client.queue(queue).partition(f"p{p}").push([
                            {"transactionId": f"{queue}-{p}-{s}",
                             "data": {"p": p, "seq": s, "pad": PAD}} for s in seqs])

            consumer = (client.queue(queue).concurrency(args.consume_concurrency)
                        .batch(args.consume_batch).partitions(1).wait(True)
                        .timeout_millis(1000).idle_millis(int(args.max_seconds * 1000))
                        .consume(handler, signal=stop))
            t0 = time.perf_counter()
            meter = BrokerMeter(env.broker)

            async def run_consumer() -> None:
                await consumer

            consume_task = asyncio.create_task(run_consumer())
            await asyncio.gather(*(produce(k) for k in range(producers)))
            t_produced = time.perf_counter()
            try:
                await asyncio.wait_for(all_in.wait(), timeout=args.max_seconds)
            except TimeoutError:
                pass
            # keep consuming a little: a duplicate delivered late still counts
            await asyncio.sleep(1.0)
            stop.set()
            try:
                await asyncio.wait_for(consume_task, timeout=15)
            except TimeoutError:
                consume_task.cancel()
                failures.append("consume: consumer did not stop within 15 s of the stop signal")
            meter.stop()

    elapsed = (t_last - t0) if unique else 0.0
    expected = {f"{queue}-{p}-{s}" for p in range(parts) for s in range(per_part[p])}
    lost = len(expected - seen.keys())
    duplicates = sum(1 for c in seen.values() if c > 1)
    unexpected = len(seen.keys() - expected)
    reordered = [p for p, seqs in order.items() if seqs != sorted(seqs)]
    ok = lost == 0 and duplicates == 0 and unexpected == 0 and not reordered
    if not ok:
        failures.append(f"consume: lost={lost} duplicated={duplicates} unexpected={unexpected} "
                        f"partitions out of order={reordered}")
    result = {"messages": n, "partitions": parts, "producers": producers,
              "consumer_concurrency": args.consume_concurrency,
              "consumer_batch": args.consume_batch, "elapsed_s": elapsed,
              "produce_elapsed_s": t_produced - t0,
              "msgs_per_s": n / elapsed if elapsed and unique == n else None,
              "delivered_unique": unique, "lost": lost, "duplicated": duplicates,
              "unexpected": unexpected, "partitions_out_of_order": reordered,
              "invariant_ok": ok, "broker": meter.figures(n)}
    print()
    print(table(["consume (official client)", "value"], [
        ["messages / partitions / producers", f"{n} / {parts} / {producers}"],
        ["consumer concurrency / batch", f"{args.consume_concurrency} / {args.consume_batch}"],
        ["producers done after (s)", f"{t_produced - t0:.2f}"],
        ["last message handled after (s)", f"{elapsed:.2f}"],
        ["end-to-end msg/s", fmt_rate(result["msgs_per_s"])],
        ["broker (pushes and deliveries of the run)", fmt_broker(result["broker"])],
        ["lost / duplicated / reordered partitions", f"{lost} / {duplicates} / {len(reordered)}"],
        ["invariant", "OK" if ok else "FAILED"],
    ]))
    return result


def summary_rows(res: dict) -> list[list[str]]:
    return [["consume: official client end-to-end",
             f"{fmt_rate(res['msgs_per_s'])} msg/s ({res['elapsed_s']:.2f} s)",
             f"{res['messages']} msgs, {res['partitions']} partitions",
             "order/loss/dup OK" if res["invariant_ok"] else "INVARIANT FAILED"]]
