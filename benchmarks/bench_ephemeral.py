"""``ephemeral``: ephemeral queues (RAM) against durable queues (PostgreSQL) on one broker, side
by side in one run (docs/ephemeral.md).

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench ephemeral``).

**Push, 1 message per request**: ``--ephemeral-push-n`` messages through ``POST
/api/v1/ephemeral/push`` (``{queue, partition, messages: [{payload}]}``) and the same messages
through ``POST /api/v1/push``, ``--concurrency`` client tasks, ``--partitions`` partitions (one
per request), the two in turn (order swapped every other round).  **Pop + ack, batch 100**:
``--ephemeral-pop-n`` messages pre-filled off the clock (batch-100 pushes), then
``--concurrency`` workers each ``GET /api/v1/ephemeral/pop?queue=q&batch=100`` + ``POST
/api/v1/ephemeral/ack`` with every id, against the durable ``GET /api/v1/pop/queue/{q}
?batch=100&wait=false`` + ``POST /api/v1/ack/batch`` (``_loadgen.http_pop_ack``).  Reported:
msg/s of both, ephemeral / durable, broker CPU per 1,000 messages (``BrokerMeter``) and RSS.
Then the **HTTP floor**: as many ``POST /api/v1/ephemeral/reset`` of a queue that does not exist
(a request that changes nothing, through the same server and middleware), whose CPU per request
bounds what any batch-1 push can cost.  Target: ephemeral push at batch 1 >= 5 x durable push
at batch 1.  ``--rounds`` repeats each pair (medians).  An HTTP error, a message not pushed or
an ack not ``acked`` fails the run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import httpx

import _loadgen as loadgen
from _harness import BrokerMeter, fmt_broker
from _loadgen import (
    JSON_HEADERS,
    Env,
    Phase,
    Rows,
    broker_summary,
    check_phases,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    http_client,
    http_pop_ack,
    http_push,
    latency_summary,
    log,
    median,
    ratio,
    run_workers,
    table,
    warm_up,
)

NAME = "ephemeral"
TARGET = 5.0  # ephemeral push at batch 1 / durable push at batch 1


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ephemeral-push-n", type=int, default=5000,
                    help="messages pushed at batch 1, per family")
    ap.add_argument("--ephemeral-pop-n", type=int, default=30000,
                    help="messages popped and acked at batch 100, per family")


def _push_body(queue: str, rows: Rows, chunk: range, batch: int) -> bytes:
    part = f"p{(chunk.start // batch) % rows.partitions}"
    messages = ",".join(f'{{"payload":{rows.payloads[i]}}}' for i in chunk)
    return f'{{"queue":"{queue}","partition":"{part}","messages":[{messages}]}}'.encode()


async def ephemeral_push(url: str, queue: str, rows: Rows, batch: int, concurrency: int,
                         cap_s: float, label: str) -> Phase:
    chunks = rows.chunks(batch)
    bodies = [_push_body(queue, rows, c, batch) for c in chunks]  # before the clock starts
    phase = Phase(label, rows.n)
    it = iter(zip(chunks, bodies))
    async with http_client(url, concurrency) as client:
        deadline = time.perf_counter() + cap_s

        async def worker(_: int) -> None:
            for chunk, body in it:
                if time.perf_counter() > deadline:
                    return
                try:
                    t = time.perf_counter()
                    r = await client.post("/api/v1/ephemeral/push", content=body,
                                          headers=JSON_HEADERS)
                    phase.latencies_ms.append((time.perf_counter() - t) * 1000)
                    phase.requests += 1
                    if r.status_code != 200 or r.json().get("pushed") != len(chunk):
                        phase.error(f"HTTP {r.status_code}: {r.text}")
                        continue
                    phase.done += len(chunk)
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    phase.error(repr(exc))

        phase.elapsed = await run_workers(concurrency, worker)
    return phase


async def ephemeral_pop_ack(url: str, queue: str, n: int, batch: int, concurrency: int,
                            cap_s: float, label: str) -> Phase:
    phase = Phase(label, n)
    path = f"/api/v1/ephemeral/pop?queue={queue}&batch={batch}"
    async with http_client(url, concurrency) as client:
        deadline = time.perf_counter() + cap_s

        async def worker(_: int) -> None:
            while phase.done < n and time.perf_counter() < deadline:
                try:
                    r = await client.get(path)
                    phase.requests += 1
                    if r.status_code != 200:
                        phase.error(f"pop HTTP {r.status_code}: {r.text}")
                        continue
                    messages = r.json()["messages"]
                    if not messages:
                        phase.empty += 1
                        await asyncio.sleep(0.002)
                        continue
                    body = {"queue": queue, "acks": [{"id": m["id"]} for m in messages]}
                    r = await client.post("/api/v1/ephemeral/ack", headers=JSON_HEADERS,
                                          content=json.dumps(body))
                    phase.requests += 1
                    if r.status_code != 200:
                        phase.error(f"ack HTTP {r.status_code}: {r.text}")
                        continue
                    ok = sum(1 for x in r.json()["results"] if x["outcome"] == "acked")
                    phase.done += ok
                    if ok != len(messages):
                        phase.error(f"{len(messages) - ok} acks not acked: {r.text}")
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    phase.error(repr(exc))

        phase.elapsed = await run_workers(concurrency, worker)
    return phase


async def http_floor(url: str, n: int, concurrency: int, cap_s: float, label: str) -> Phase:
    """``n`` requests that change nothing: ``POST /api/v1/ephemeral/reset`` of a queue that does
    not exist (a JSON body read, a dictionary lookup, ``{"queue", "dropped": 0}``), through the
    same HTTP server and middleware as a push: the floor under the push figures."""
    phase = Phase(label, n)
    body = json.dumps({"queue": f"bench-floor-{uuid.uuid4().hex[:8]}"})
    left = iter(range(n))
    async with http_client(url, concurrency) as client:
        deadline = time.perf_counter() + cap_s

        async def worker(_: int) -> None:
            for _i in left:
                if time.perf_counter() > deadline:
                    return
                try:
                    r = await client.post("/api/v1/ephemeral/reset", content=body,
                                          headers=JSON_HEADERS)
                    phase.requests += 1
                    if r.status_code != 200:
                        phase.error(f"HTTP {r.status_code}: {r.text}")
                        continue
                    phase.done += 1
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    phase.error(repr(exc))

        phase.elapsed = await run_workers(concurrency, worker)
    return phase


async def _delete(url: str, queue: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await client.delete(f"/api/v1/ephemeral/queue/{queue}")


def _measured(phase: Phase, meter: BrokerMeter) -> Phase:
    phase.broker = meter.figures(phase.done)
    log(f"{phase.label}: {phase.done} msgs in {phase.elapsed:.2f}s = {fmt_rate(phase.rate)} "
        f"msg/s; {fmt_broker(phase.broker)}")
    return phase


async def _push_pair(env: Env, args: argparse.Namespace, rnd: int) -> tuple[Phase, Phase]:
    n, url, c = args.ephemeral_push_n, env.broker.url, args.concurrency
    out: dict[str, Phase] = {}
    for family in (("ephemeral", "durable") if rnd % 2 == 0 else ("durable", "ephemeral")):
        rows = Rows(n, args.partitions)
        queue = f"bench-{family[:3]}-push-{uuid.uuid4().hex[:8]}"
        meter = BrokerMeter(env.broker)
        if family == "ephemeral":
            p = await ephemeral_push(url, queue, rows, 1, c, args.max_seconds,
                                     f"ephemeral push b=1 r={rnd}")
            out[family] = _measured(p, meter)
            await _delete(url, queue)  # off the clock: its RAM back
        else:
            p = await http_push(url, queue, rows, 1, c, args.max_seconds,
                                f"durable push b=1 r={rnd}")
            out[family] = _measured(p, meter)
    return out["ephemeral"], out["durable"]


async def _pop_pair(env: Env, args: argparse.Namespace, rnd: int,
                    failures: list[str]) -> tuple[Phase, Phase]:
    n, url, c, batch = args.ephemeral_pop_n, env.broker.url, args.concurrency, 100
    out: dict[str, Phase] = {}
    for family in (("ephemeral", "durable") if rnd % 2 == 0 else ("durable", "ephemeral")):
        rows = Rows(n, args.partitions)
        queue = f"bench-{family[:3]}-pop-{uuid.uuid4().hex[:8]}"
        if family == "ephemeral":
            fill = await ephemeral_push(url, queue, rows, 100, c, 120, "ephemeral prefill")
        else:
            fill = await http_push(url, queue, rows, 100, c, 120, "durable prefill")
        if fill.done != n:
            failures.append(f"{family} prefill: {fill.done}/{n} ({fill.first_error})")
        meter = BrokerMeter(env.broker)
        if family == "ephemeral":
            p = await ephemeral_pop_ack(url, queue, n, batch, c, args.max_seconds,
                                        f"ephemeral pop+ack b=100 r={rnd}")
            out[family] = _measured(p, meter)
            await _delete(url, queue)
        else:
            p = await http_pop_ack(url, queue, n, batch, c, args.max_seconds,
                                   f"durable pop+ack b=100 r={rnd}")
            out[family] = _measured(p, meter)
    return out["ephemeral"], out["durable"]


def _result(what: str, batch: int, n: int, pairs: list[tuple[Phase, Phase]]) -> dict:
    eph = median([p.rate or 0.0 for p, _ in pairs])
    dur = median([q.rate or 0.0 for _, q in pairs])
    return {"measurement": what, "batch": batch, "messages": n,
            "ephemeral_msgs_per_s": eph, "durable_msgs_per_s": dur, "ratio": ratio(eph, dur),
            "ephemeral": broker_summary([p for p, _ in pairs]),
            "durable": broker_summary([q for _, q in pairs]),
            "ephemeral_request_ms": latency_summary([p for p, _ in pairs]),
            "phases": [x.as_dict() for pair in pairs for x in pair]}


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    with Env() as env:
        ceiling = await warm_up(env, args)
        warm = Rows(min(500, args.partitions * 20), args.partitions)
        queue = f"bench-eph-warmup-{uuid.uuid4().hex[:8]}"
        await ephemeral_push(env.broker.url, queue, warm, 1, args.concurrency, 30, "warm-up")
        await _delete(env.broker.url, queue)
        pushes = [await _push_pair(env, args, rnd) for rnd in range(args.rounds)]
        pops = [await _pop_pair(env, args, rnd, failures) for rnd in range(args.rounds)]
        floors = []
        for rnd in range(args.rounds):
            meter = BrokerMeter(env.broker)
            floors.append(_measured(await http_floor(
                env.broker.url, args.ephemeral_push_n, args.concurrency, args.max_seconds,
                f"HTTP floor r={rnd}"), meter))
    check_phases([x for pair in pushes + pops for x in pair] + floors, failures)
    push = _result("push", 1, args.ephemeral_push_n, pushes)
    pop = _result("pop+ack", 100, args.ephemeral_pop_n, pops)
    floor = {"requests_per_s": median([p.rate or 0.0 for p in floors]),
             "broker": broker_summary(floors)}
    met = push["ratio"] is not None and push["ratio"] >= TARGET
    print()
    print(table(HEADERS, [_row(push), _row(pop)]))
    lat = push["ephemeral_request_ms"]
    print(f"  ephemeral push b=1: request p50 / p99 {fmt_ms(lat['p50'])} / {fmt_ms(lat['p99'])} "
          f"ms; target ephemeral push >= {TARGET:g} x durable push at batch 1: "
          f"{fmt_ratio(push['ratio'])} x, {'met' if met else 'NOT met'}")
    cpu = floor["broker"]["broker_cpu_ms_per_1000"]
    print(f"  HTTP floor (a POST that changes nothing, same server and middleware): "
          f"{fmt_rate(floor['requests_per_s'])} req/s, broker CPU {fmt_ms(cpu)} ms per 1,000 "
          f"requests; at batch 1 no push can cost less, so the push ratio is bounded by "
          f"durable CPU / floor CPU = "
          f"{fmt_ratio(ratio(push['durable']['broker_cpu_ms_per_1000'], cpu))}")
    print(f"  load generator: {loadgen.CLIENT} client; ceiling at C={args.concurrency} "
          f"(GET /health, which pings PostgreSQL): {fmt_rate(ceiling[loadgen.CLIENT])} req/s")
    return {"client": loadgen.CLIENT, "client_ceiling_req_per_s": ceiling, "push": push,
            "pop_ack": pop, "http_floor": floor,
            "target": {"ratio": push["ratio"], "floor": TARGET, "met": met}}


HEADERS = ["ephemeral vs durable", "messages", "ephemeral msg/s", "durable msg/s",
           "ephemeral/durable", "eph CPU ms/1k", "dur CPU ms/1k", "peak RSS MB"]


def _row(r: dict) -> list[str]:
    return [f"{r['measurement']} batch {r['batch']}", f"{r['messages']:,}",
            fmt_rate(r["ephemeral_msgs_per_s"]), fmt_rate(r["durable_msgs_per_s"]),
            fmt_ratio(r["ratio"]), fmt_ms(r["ephemeral"]["broker_cpu_ms_per_1000"]),
            fmt_ms(r["durable"]["broker_cpu_ms_per_1000"]),
            f"{max(r['ephemeral']['broker_peak_rss_mb'], r['durable']['broker_peak_rss_mb']):.0f}"]


def summary_rows(res: dict) -> list[list[str]]:
    rows = []
    for r in (res["push"], res["pop_ack"]):
        rows.append([f"{NAME}: {r['measurement']} batch {r['batch']}",
                     f"{fmt_rate(r['ephemeral_msgs_per_s'])} msg/s, "
                     f"{fmt_ms(r['ephemeral']['broker_cpu_ms_per_1000'])} ms CPU/1k",
                     f"durable {fmt_rate(r['durable_msgs_per_s'])} msg/s, "
                     f"{fmt_ms(r['durable']['broker_cpu_ms_per_1000'])} ms CPU/1k",
                     fmt_ratio(r["ratio"])])
    return rows
