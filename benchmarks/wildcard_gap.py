"""Wildcard pops over many partitions: the worst time a pending message waits.

    .venv/bin/python benchmarks/wildcard_gap.py [--partitions 200] [--seconds 40]
    BENCH_BROKER_ROOT=/path/to/other/checkout .venv/bin/python benchmarks/wildcard_gap.py

One broker on its own PostgreSQL (embedded, or PG_HOST...), with the hot-list's
reseed floor lowered (QUEEN_HOTLIST_RESEED_MS, default here 2000 ms) so that
reseeds fall due many times during the run: the path where a pop's take is
due for a reseed is the one that used to strand candidates INFLIGHT (their
partitions then went unserved to wildcard pops for a minute or more).

``--producers`` tasks push one message at a time each to a random one of
``--partitions`` partitions, steadily (``--rate`` per second in all), fast
enough that consumers seldom park (a parked pop is woken with the pushed
partition as a hint, which hides a stranded candidate); ``--consumers`` tasks run
wildcard long polls on the queue (``GET /api/v1/pop/queue/{q}?wait=true``,
batch 10) and ack what they get. For every message: delivered time - pushed
time. Reported: p50 / p99 / max of that wait, messages never delivered, and how
many waited longer than POP_WAIT_MAX_INTERVAL_MS (1 s) plus a second for the
query and this noisy machine.

Exit status 1 when a message was never delivered or the worst wait is over 5 s.
Timings here are for comparing revisions in one run, never for the test suite.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import httpx  # noqa: E402

from _harness import Broker, start_database  # noqa: E402

SLOW_S = 2.0  # one re-check interval (1 s) plus a query and this machine's noise


async def run(args: argparse.Namespace) -> int:
    db = start_database()
    broker = None
    try:
        broker = Broker(db, QUEEN_HOTLIST_RESEED_MS=str(args.reseed_ms))
        queue = f"gap-{uuid.uuid4().hex[:8]}"
        pushed: dict[str, float] = {}
        delivered: dict[str, float] = {}
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=broker.url, timeout=30,
                                     limits=httpx.Limits(max_connections=64)) as http:
            async def producer(me: int) -> None:
                period = args.producers / args.rate
                n = 0
                next_at = time.monotonic()
                end = next_at + args.seconds
                while time.monotonic() < end:
                    txid = f"m{me}-{n:07d}"
                    partition = f"p{random.randrange(args.partitions):03d}"
                    pushed[txid] = time.monotonic()
                    r = await http.post("/api/v1/push", json={"items": [
                        {"queue": queue, "partition": partition, "transactionId": txid,
                         "payload": {"n": n}}]})
                    r.raise_for_status()
                    n += 1
                    next_at += period
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))

            async def consumer() -> None:
                while not stop.is_set():
                    r = await http.get(f"/api/v1/pop/queue/{queue}",
                                       params={"wait": "true", "timeout": 1000, "batch": 20,
                                               "partitions": 10})
                    messages = r.json().get("messages") or []
                    now = time.monotonic()
                    for m in messages:
                        delivered.setdefault(m["transactionId"], now)
                    if messages:
                        await http.post("/api/v1/ack/batch", json={"acknowledgments": [
                            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "status": "completed"} for m in messages]})

            consumers = [asyncio.create_task(consumer()) for _ in range(args.consumers)]
            await asyncio.gather(*(producer(i) for i in range(args.producers)))
            deadline = time.monotonic() + 90  # a stranded candidate comes back within ~60 s
            while len(delivered) < len(pushed) and time.monotonic() < deadline:  # noqa: ASYNC110 - a poll of two dicts, bounded
                await asyncio.sleep(0.2)
            stop.set()
            await asyncio.gather(*consumers, return_exceptions=True)
        waits = sorted(delivered[t] - pushed[t] for t in delivered if t in pushed)
        missing = len(pushed) - len(waits)

        def pct(p: float) -> float:
            return waits[min(len(waits) - 1, int(p * len(waits)))] * 1000 if waits else 0.0

        result = {
            "broker_root": os.environ.get("BENCH_BROKER_ROOT") or str(HERE.parent),
            "partitions": args.partitions, "rate": args.rate, "seconds": args.seconds,
            "reseed_ms": args.reseed_ms, "consumers": args.consumers,
            "producers": args.producers,
            "pushed": len(pushed), "delivered": len(waits), "never_delivered": missing,
            "wait_ms_p50": round(pct(0.50), 1), "wait_ms_p99": round(pct(0.99), 1),
            "wait_ms_max": round(waits[-1] * 1000, 1) if waits else None,
            f"waited_over_{SLOW_S:g}s": sum(1 for w in waits if w > SLOW_S),
        }
        print(json.dumps(result, indent=2))
        ok = missing == 0 and bool(waits) and waits[-1] <= 5.0
        print("verdict:", "OK" if ok else "FAILED (a message never delivered or waited > 5 s)")
        return 0 if ok else 1
    finally:
        if broker is not None:
            broker.stop()
        db.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=100.0, help="pushes per second")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--reseed-ms", type=int, default=2000)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
