"""``wake``: long-poll wake latency on one broker (target: p99 < 5 ms).

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench wake``).

``--wake-tries`` times (after 5 warm-up tries): a pop parked with ``wait=true&timeout=5000`` on
a fresh queue; ``--wake-delay-ms`` later one message is pushed; latency = pop response time -
push response time (also from the push being sent, and the push round trip itself).
``wake_series`` is also what ``wake_ha`` (bench_wake_ha.py) runs across two brokers.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

from _harness import BrokerMeter, fmt_broker
from _loadgen import JSON_HEADERS, Env, fmt_ms, http_client, percentile, table

NAME = "wake"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--wake-tries", type=int, default=200, help="measured wake-up tries")
    ap.add_argument("--wake-delay-ms", type=int, default=500,
                    help="time a pop stays parked before the push")


async def wake_series(pop_url: str, push_url: str, tries: int, warmup: int,
                      delay_ms: int | tuple[int, int], failures: list[str], label: str,
                      lanes: int = 1) -> dict:
    """``warmup + tries`` times: park a pop (``wait=true&timeout=5000``, fresh queue) on
    ``pop_url``, push one message through ``push_url`` ``delay_ms`` later (or a delay drawn
    uniformly from a ``(lo, hi)`` range), and time the pop's answer.  The warm-up tries run one
    after the other, the measured ones in ``lanes`` concurrent sequences (1: strictly one at a
    time).  Returns the latency samples (ms) of the measured tries and their statistics."""
    import random
    rng = random.Random(7)
    from_resp: list[float] = []
    from_send: list[float] = []
    push_rtt: list[float] = []
    empty = 0
    broken: list[str] = []
    async with http_client(pop_url, 2 * lanes) as pops, \
            http_client(push_url, 2 * lanes) as pushes:
        async def one_try(i: int, measured: bool) -> None:
            nonlocal empty
            queue = f"bench-wake-{uuid.uuid4().hex[:12]}"
            delay = (delay_ms if isinstance(delay_ms, int) else rng.uniform(*delay_ms)) / 1000

            async def pop() -> tuple[float, dict]:
                r = await pops.get(f"/api/v1/pop/queue/{queue}?wait=true&timeout=5000")
                return time.perf_counter(), (r.json() if r.content else {})

            task = asyncio.create_task(asyncio.wait_for(pop(), 15))
            await asyncio.sleep(delay)
            body = json.dumps({"items": [{"queue": queue, "payload": {"try": i}}]})
            t_send = time.perf_counter()
            r = await asyncio.wait_for(
                pushes.post("/api/v1/push", content=body, headers=JSON_HEADERS), 15)
            t_resp = time.perf_counter()
            t_pop, popped = await task
            if r.status_code not in (200, 201):
                broken.append(f"{label}: push HTTP {r.status_code}: {r.text[:200]}")
                return
            if not popped.get("messages"):
                empty += 1
                return
            if measured:
                from_resp.append((t_pop - t_resp) * 1000)
                from_send.append((t_pop - t_send) * 1000)
                push_rtt.append((t_resp - t_send) * 1000)

        for i in range(warmup):
            await one_try(i, False)
            if broken:
                break

        async def lane(k: int) -> None:
            for i in range(warmup + k, warmup + tries, lanes):
                if broken:
                    return
                await one_try(i, True)

        if not broken:
            await asyncio.gather(*(lane(k) for k in range(lanes)))
    failures += broken[:1]
    if empty:
        failures.append(f"{label}: {empty} parked pops returned empty (not woken within 5 s)")

    def stats(v: list[float]) -> dict:
        return {"p50": percentile(v, 50), "p95": percentile(v, 95), "p99": percentile(v, 99),
                "max": max(v) if v else None, "mean": statistics.fmean(v) if v else None}

    return {"tries": tries, "warmup": warmup, "delay_ms": delay_ms, "lanes": lanes,
            "not_woken": empty,
            "measured": len(from_resp),
            "latency_from_push_response_ms": stats(from_resp),
            "latency_from_push_send_ms": stats(from_send),
            "push_round_trip_ms": stats(push_rtt),
            "samples_from_push_response_ms": [round(x, 3) for x in from_resp]}


WAKE_TARGET_MS = 5      # target: wake p99 on one broker
WAKE_HA_TARGET_MS = 10  # target: wake p99 across the mesh
WAKE_ROWS = (("wake after push response", "latency_from_push_response_ms"),
             ("wake after push send", "latency_from_push_send_ms"),
             ("push round trip", "push_round_trip_ms"))


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    with Env() as env:
        meter = BrokerMeter(env.broker)
        result = await wake_series(env.broker.url, env.broker.url, args.wake_tries, 5,
                                   args.wake_delay_ms, failures, "wake")
        result["broker"] = meter.figures(result["measured"] + result["warmup"])
    result["target_p99_ms"] = WAKE_TARGET_MS
    s = result["latency_from_push_response_ms"]
    result["target_met"] = s["p99"] is not None and s["p99"] < WAKE_TARGET_MS
    print()
    rows = []
    for label, key in WAKE_ROWS:
        st = result[key]
        rows.append([label, fmt_ms(st["p50"]), fmt_ms(st["p95"]), fmt_ms(st["p99"]),
                     fmt_ms(st["max"])])
    print(table([f"wake ({result['measured']} tries), ms", "p50", "p95", "p99", "max"], rows))
    print(f"  target p99 < {WAKE_TARGET_MS} ms after the push response: "
          f"{'met' if result['target_met'] else 'NOT met'}; broker {fmt_broker(result['broker'])}")
    return result


def summary_rows(res: dict) -> list[list[str]]:
    s = res["latency_from_push_response_ms"]
    t = res["latency_from_push_send_ms"]
    return [["wake: after push response p50/p95/p99/max",
             f"{fmt_ms(s['p50'])}/{fmt_ms(s['p95'])}/{fmt_ms(s['p99'])}/{fmt_ms(s['max'])} ms",
             f"target p99 < {WAKE_TARGET_MS} ms", "met" if res["target_met"] else "NOT met"],
            ["wake: after push send p50/p99",
             f"{fmt_ms(t['p50'])}/{fmt_ms(t['p99'])} ms", "", ""]]
