#!/usr/bin/env python3
"""Load benchmarks for the broker, reported as ratios measured in the same run.

    python3 dev.py bench                 # all (push pop wake wake_ha consume outage outage_ha herd
                                         #      partitions fanout backlog)
    python3 dev.py bench --quick         # the same, smaller (backlog 1 M messages, ...)
    python3 dev.py bench push wake       # only some
    python3 dev.py bench --help          # sizes, concurrency, rounds, output dir

Each benchmark starts its own PostgreSQL (embedded, in a temp dir; or the server named by
PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB) and its own broker process (LOG_LEVEL=WARNING) on
loopback, runs bounded loops (bounded counts and a time cap per phase), prints a table and writes
its results as JSON to <results-dir>/<name>-<timestamp>.json.  A summary table and the issue-14
targets table (_targets.py: target, measured, ratio, met / NOT met) close the run.  Every
benchmark reports the broker's CPU per 1,000 messages and its RSS (_harness.BrokerMeter).
Throughput is compared with a raw-asyncpg baseline doing the equivalent minimal SQL on the same
database in the same run, so the ratio (broker / raw) is what to read on a noisy
machine; absolute msg/s numbers are only comparable within one run.

Exit status: 0 on success, 1 when an invariant failed (lost, duplicated or reordered messages,
failed requests, a pending partition never served), 2 on bad arguments; missed targets do not
change it.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402
import httpx  # noqa: E402

import _loadgen as loadgen  # noqa: E402
import scale_backlog  # noqa: E402
import scale_fanout  # noqa: E402
import scale_partitions  # noqa: E402
from _harness import (  # noqa: E402
    STORED_IN_SEQ_ORDER,
    Broker,
    BrokerMeter,
    RawHTTPClient,
    fmt_broker,
    proc_figures,
    start_brokers,
    start_database,
)
from _loadgen import (  # noqa: E402
    JSON_HEADERS,
    PAD,
    RAW_INSERT_MANY,
    RAW_TABLE,
    THROUGHPUT_HEADERS,
    Env,
    Rows,
    ack_completed,
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
    percentile,
    ratio,
    raw_pop_ack,
    raw_push,
    table,
    throughput_rows,
    warm_up,
)
from _targets import HEADERS as TARGET_HEADERS  # noqa: E402
from _targets import target_rows  # noqa: E402

# The scale benchmarks of issue 14 live in their own modules (scale_*.py); each has NAME,
# add_arguments(parser), run(args, failures) and summary_rows(result).
SCALE = {m.NAME: m for m in (scale_partitions, scale_fanout, scale_backlog)}
BENCHMARKS = ("push", "pop", "wake", "wake_ha", "consume", "outage", "outage_ha", "herd",
              *SCALE)
# --quick: smaller sizes for a shorter run (options given explicitly are kept)
QUICK = {"backlog_messages": 1_000_000, "fanout_n": 10_000, "wake_tries": 100,
         "wake_ha_tries": 100, "wake_ha_cut_tries": 10, "push_n100": 20_000, "pop_n100": 20_000,
         "consume_n": 5_000}



async def bench_push(args: argparse.Namespace, failures: list[str]) -> dict:
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


async def bench_pop(args: argparse.Namespace, failures: list[str]) -> dict:
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


WAKE_TARGET_MS = 5      # issue 14: wake p99 on one broker
WAKE_HA_TARGET_MS = 10  # issue 14: wake p99 across the mesh
WAKE_ROWS = (("wake after push response", "latency_from_push_response_ms"),
             ("wake after push send", "latency_from_push_send_ms"),
             ("push round trip", "push_round_trip_ms"))


async def bench_wake(args: argparse.Namespace, failures: list[str]) -> dict:
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


async def wait_mesh_up(urls: list[str], timeout: float = 20.0) -> bool:
    """True once every broker reports all its peers connected and alive (bounded)."""
    deadline = time.perf_counter() + timeout
    async with httpx.AsyncClient(timeout=5) as client:
        while time.perf_counter() < deadline:
            ok = True
            for url in urls:
                try:
                    t = (await client.get(url + "/health")).json()["shared_state"]["transport"]
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    t = None
                want = len(urls) - 1
                if not t or sum(bool(p.get("connected")) for p in t.get("peers", [])) < want \
                        or t.get("servers_alive", 0) < want:
                    ok = False
                    break
            if ok:
                return True
            await asyncio.sleep(0.2)
    return False


async def mesh_counters(a_url: str, b_url: str) -> dict[str, int]:
    """Mesh frames A sent and B received so far (heartbeats excluded): evidence that the
    wakes crossed the mesh."""
    async with httpx.AsyncClient(timeout=5) as client:
        ta = (await client.get(a_url + "/health")).json()["shared_state"]["transport"] or {}
        tb = (await client.get(b_url + "/health")).json()["shared_state"]["transport"] or {}
    return {"a_sent": ta.get("messages_sent", 0), "b_received": tb.get("messages_received", 0),
            "a_dropped": ta.get("messages_dropped", 0)}


async def bench_wake_ha(args: argparse.Namespace, failures: list[str]) -> dict:
    """A pop parked on broker B, the push on broker A (same PostgreSQL): woken through the
    mesh, then, with two brokers that have no peers, only by B's own re-check timer."""
    cut_delay = tuple(args.wake_ha_cut_delay_ms)
    db = start_database()
    result: dict[str, Any] = {"delay_ms": args.wake_ha_delay_ms, "cut_delay_ms": cut_delay,
                              "target_p99_ms": WAKE_HA_TARGET_MS, "pop_wait_max_interval_ms": 1000}
    try:
        for mode, tries in (("mesh", args.wake_ha_tries), ("cut", args.wake_ha_cut_tries)):
            t = time.perf_counter()
            brokers = start_brokers(db, 2, mesh=(mode == "mesh"))
            try:
                a, b = brokers
                log(f"{mode}: {db.kind} PostgreSQL on {db.host}:{db.port}, broker A {a.url}, "
                    f"broker B {b.url} (started in {time.perf_counter() - t:.1f}s)")
                if mode == "mesh":
                    up = await wait_mesh_up([a.url, b.url])
                    if not up:
                        failures.append("wake_ha: the mesh did not come up within 20 s")
                        break
                    log("mesh up: both brokers see their peer connected and alive")
                meter = BrokerMeter(brokers)
                if mode == "mesh":
                    before = await mesh_counters(a.url, b.url)
                    res = await wake_series(b.url, a.url, tries, 5, args.wake_ha_delay_ms,
                                            failures, "wake_ha mesh")
                    after = await mesh_counters(a.url, b.url)
                    res["mesh_frames"] = {k: after[k] - before[k] for k in before}
                else:
                    res = await wake_series(b.url, a.url, tries, 2, cut_delay, failures,
                                            "wake_ha cut", lanes=args.wake_ha_cut_lanes)
                res["broker"] = meter.figures(res["measured"] + res["warmup"])
                result[mode] = res
                s = res["latency_from_push_response_ms"]
                log(f"{mode}: {res['measured']} tries, after push response p50/p99/max "
                    f"{fmt_ms(s['p50'])}/{fmt_ms(s['p99'])}/{fmt_ms(s['max'])} ms")
            finally:
                for x in brokers:
                    x.stop()
    finally:
        db.stop()
    if "mesh" not in result:
        return result
    s = result["mesh"]["latency_from_push_response_ms"]
    result["target_met"] = s["p99"] is not None and s["p99"] < WAKE_HA_TARGET_MS
    cut = result.get("cut")
    if cut:
        c = cut["latency_from_push_response_ms"]
        # bounded by the largest re-check interval plus one pop query (allow 250 ms for it)
        result["cut_bound_ms"] = 1000 + 250
        result["cut_within_bound"] = c["max"] is not None and c["max"] < result["cut_bound_ms"]
    print()
    headers = ["wake A->B, ms", "mesh p50", "p95", "p99", "max",
               "no mesh p50", "p95", "p99", "max"]
    rows = []
    for label, key in WAKE_ROWS:
        row = [label]
        for mode in ("mesh", "cut"):
            st = result[mode][key] if mode in result else {}
            row += [fmt_ms(st.get(x)) for x in ("p50", "p95", "p99", "max")]
        rows.append(row)
    print(table(headers, rows))
    print(f"  mesh: {result['mesh']['measured']} tries one at a time, pop parked on B "
          f"{args.wake_ha_delay_ms} ms before the push on A")
    print(f"  no mesh: {cut['measured'] if cut else 0} tries in {args.wake_ha_cut_lanes} "
          f"concurrent lanes, pop parked on B {cut_delay[0]}-{cut_delay[1]} ms (uniform) before "
          f"the push on A")
    fr = result["mesh"].get("mesh_frames", {})
    print(f"  mesh frames during the meshed tries: A sent {fr.get('a_sent')}, B received "
          f"{fr.get('b_received')}, A dropped {fr.get('a_dropped')}")
    print(f"  mesh: target p99 < {WAKE_HA_TARGET_MS} ms after the push response: "
          f"{'met' if result['target_met'] else 'NOT met'}; brokers A+B "
          f"{fmt_broker(result['mesh']['broker'])}")
    if cut:
        print(f"  no mesh: B finds the message on its next re-check (every 100, 100, 100, 200, "
              f"400, 800, then 1000 ms after parking); max {fmt_ms(c['max'])} ms "
              f"{'within' if result['cut_within_bound'] else 'OVER'} "
              f"POP_WAIT_MAX_INTERVAL_MS + one query (~{result['cut_bound_ms']} ms). "
              f"Reference Queen, single broker: ~650 ms")
    return result


OUTAGE_ACKED = ("queued", "duplicate", "buffered")
OUTAGE_STATUSES = ("queued", "duplicate", "buffered", "failed", "http_error", "conn_error",
                   "timeout")


async def push_statuses(client: RawHTTPClient, body: str, n: int, timeout: float,
                        first_error: dict[str, str]) -> list[str]:
    """POST one push of ``n`` items; what the broker answered for each item, one of
    OUTAGE_STATUSES (the first error of each kind is kept in ``first_error``)."""
    try:
        r = await asyncio.wait_for(
            client.post("/api/v1/push", content=body, headers=JSON_HEADERS), timeout)
    except TimeoutError:
        # (the connection that timed out is dropped; the next push opens one)
        return ["timeout"] * n
    except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
        first_error.setdefault("conn_error", repr(exc)[:200])
        return ["conn_error"] * n
    got = ["http_error"] * n
    try:
        items = r.json() if r.content else None
    except ValueError:
        items = None
    if isinstance(items, list) and len(items) == n:
        got = [x.get("status") if x.get("status") in OUTAGE_STATUSES else "http_error"
               for x in items]
    if r.status_code not in (200, 201) or "http_error" in got:
        first_error.setdefault(f"HTTP {r.status_code}", r.text[:200])
    return got


async def bench_outage(args: argparse.Namespace, failures: list[str]) -> dict:
    """16 producers push steadily; PostgreSQL is crash-stopped for a while and started again;
    afterwards every id the broker acknowledged must be in PostgreSQL exactly once."""
    db = start_database()
    if not db.can_restart:
        db.stop()
        log("outage: skipped, it stops PostgreSQL and needs the embedded one (PG_HOST is set)")
        return {"skipped": "needs the embedded PostgreSQL (PG_HOST is set)"}
    queue = f"bench-outage-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:8]
    producers = args.outage_producers
    status: dict[str, str] = {}      # transactionId -> what the broker answered
    period: dict[str, str] = {}      # transactionId -> before / outage / after (by send time)
    order: dict[int, list[str]] = {k: [] for k in range(producers)}  # acked, in send order
    requests = {"before": 0, "outage": 0, "after": 0}
    req_ms: dict[str, list[float]] = {"before": [], "outage": [], "after": []}
    first_error: dict[str, str] = {}
    stop = asyncio.Event()
    marks: dict[str, float] = {}
    spool_samples: list[tuple[float, int]] = []

    def now_period(t: float) -> str:
        if "pg_stop" not in marks or t < marks["pg_stop"]:
            return "before"
        if "pg_started" not in marks or t < marks["pg_started"]:
            return "outage"
        return "after"

    t = time.perf_counter()
    broker = Broker(db, DB_CONNECTION_TIMEOUT=str(args.outage_db_timeout_ms))
    log(f"{db.kind} PostgreSQL on {db.host}:{db.port}, broker on {broker.url} "
        f"(DB_CONNECTION_TIMEOUT={args.outage_db_timeout_ms}; started in "
        f"{time.perf_counter() - t:.1f}s)")
    meter = BrokerMeter(broker)
    try:
        async def producer(k: int) -> None:
            import random
            rng = random.Random(k)
            seq = 0
            async with RawHTTPClient(broker.url, 2) as client:
                while not stop.is_set():
                    n = rng.randint(1, 10)
                    txids = [f"{tag}-{k}-{seq + i}" for i in range(n)]
                    seq += n
                    body = json.dumps({"items": [
                        {"queue": queue, "partition": f"p{k}", "transactionId": tx,
                         "payload": {"k": k, "tx": tx, "pad": PAD}} for tx in txids]})
                    t_send = time.perf_counter()
                    per = now_period(t_send)
                    got = await push_statuses(client, body, n, args.outage_request_timeout,
                                              first_error)
                    requests[per] += 1
                    req_ms[per].append((time.perf_counter() - t_send) * 1000)
                    for tx, st in zip(txids, got):
                        status[tx], period[tx] = st, per
                        if st in OUTAGE_ACKED:
                            order[k].append(tx)
                    if args.outage_pause_ms:
                        await asyncio.sleep(args.outage_pause_ms / 1000)

        async def spool_pending(client: httpx.AsyncClient) -> int | None:
            try:
                r = await client.get(broker.url + "/api/v1/system/maintenance")
                return int(r.json()["bufferedMessages"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return None

        async def monitor() -> None:
            async with httpx.AsyncClient(timeout=5) as client:
                while not stop.is_set():
                    n = await spool_pending(client)
                    if n is not None:
                        spool_samples.append((time.perf_counter(), n))
                    await asyncio.sleep(0.25)

        marks["start"] = time.perf_counter()
        tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
        mon = asyncio.create_task(monitor())
        await asyncio.sleep(args.outage_before_s)
        log(f"stopping PostgreSQL (immediate) for {args.outage_down_s:g} s "
            f"({sum(1 for _ in status)} items pushed so far)")
        marks["pg_stop"] = time.perf_counter()
        await db.stop_server()
        marks["pg_stopped"] = time.perf_counter()
        await asyncio.sleep(max(0.0, args.outage_down_s - (marks["pg_stopped"] - marks["pg_stop"])))
        log("starting PostgreSQL again")
        await db.start_server()
        marks["pg_started"] = time.perf_counter()
        await asyncio.sleep(args.outage_after_s)
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=args.outage_request_timeout + 5)
        for x in pending:
            x.cancel()
        if pending:
            failures.append(f"outage: {len(pending)} producers did not stop")
        marks["producers_stopped"] = time.perf_counter()
        await asyncio.wait([mon], timeout=10)
        log(f"producers stopped ({len(status)} items); waiting for the spool to drain")

        drained = False
        last = None
        async with httpx.AsyncClient(timeout=5) as client:
            deadline = time.perf_counter() + args.outage_drain_max_s
            while time.perf_counter() < deadline:
                last = await spool_pending(client)
                if last is not None:
                    spool_samples.append((time.perf_counter(), last))
                if last == 0:
                    drained = True
                    break
                await asyncio.sleep(0.1)
            marks["drained"] = time.perf_counter()
            health = (await client.get(broker.url + "/health")).json()
        if not drained:
            failures.append(f"outage: spool not drained within {args.outage_drain_max_s:g} s "
                            f"({last} messages still buffered)")
        # the first moment after the restart at which the spool was seen empty
        empty_after = next((ts for ts, n in spool_samples
                            if ts >= marks["pg_started"] and n == 0), None)

        conn = await asyncpg.connect(db.dsn, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT m.transaction_id, count(*) AS n, p.name AS partition, "
                "array_agg(m.seq ORDER BY m.seq) AS seqs "
                "FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 "
                "GROUP BY m.transaction_id, p.name", queue)
        finally:
            await conn.close()
    finally:
        meter.stop()
        broker.stop()
        db.stop()

    present: dict[str, int] = {}
    first_seq: dict[str, int] = {}
    for r in rows:
        present[r["transaction_id"]] = present.get(r["transaction_id"], 0) + r["n"]
        first_seq[r["transaction_id"]] = r["seqs"][0]
    acked = {tx for tx, st in status.items() if st in OUTAGE_ACKED}
    unacked = set(status) - acked
    missing = sorted(acked - present.keys())
    duplicated = sorted(tx for tx, n in present.items() if n > 1)
    unexpected = sorted(present.keys() - status.keys())
    unacked_present = sorted(unacked & present.keys())
    # informational: does each partition hold its acknowledged ids in send order?
    # An id "overtook" when it is stored ahead of an id the same producer sent before it.
    out_of_order: list[int] = []
    overtaking = 0
    overtaking_by_period = {"before": 0, "outage": 0, "after": 0}
    for k, txs in order.items():
        top = -1
        bad = 0
        for tx in txs:
            sq = first_seq.get(tx)
            if sq is None:
                continue
            if sq < top:
                bad += 1
                overtaking_by_period[period[tx]] += 1
            top = max(top, sq)
        if bad:
            out_of_order.append(k)
            overtaking += bad

    counts = {per: {st: 0 for st in OUTAGE_STATUSES} for per in ("before", "outage", "after")}
    for tx, st in status.items():
        counts[period[tx]][st] += 1
    total = {st: sum(counts[p][st] for p in counts) for st in OUTAGE_STATUSES}
    ok = not missing and not duplicated and not unexpected
    if missing or duplicated:
        failures.append(f"outage: {len(missing)} acknowledged ids missing, {len(duplicated)} "
                        f"duplicated in PostgreSQL (e.g. {(missing + duplicated)[:5]})")
    if unexpected:
        failures.append(f"outage: {len(unexpected)} ids in PostgreSQL nobody pushed")
    peak = max((n for _, n in spool_samples), default=0)
    result = {
        "queue": queue, "producers": producers, "pause_ms": args.outage_pause_ms,
        "db_connection_timeout_ms": args.outage_db_timeout_ms,
        "phases_s": {"before": marks["pg_stop"] - marks["start"],
                     "stop_call": marks["pg_stopped"] - marks["pg_stop"],
                     "down": marks["pg_started"] - marks["pg_stop"],
                     "after": marks["producers_stopped"] - marks["pg_started"]},
        "requests": requests,
        "request_ms": {p: {"p50": percentile(v, 50), "p99": percentile(v, 99),
                           "max": max(v) if v else None} for p, v in req_ms.items()},
        "items_pushed": len(status), "by_period": counts, "totals": total,
        "acknowledged": len(acked), "present": len(present),
        "acknowledged_present_once": len(acked) - len(missing)
        - len(set(duplicated) & acked),
        "missing": len(missing), "duplicated": len(duplicated), "unexpected": len(unexpected),
        "unacknowledged": len(unacked), "unacknowledged_present": len(unacked_present),
        "unacknowledged_absent": len(unacked) - len(unacked_present),
        "missing_ids": missing[:100], "duplicated_ids": duplicated[:100],
        "unacknowledged_present_ids": unacked_present[:100],
        "partitions_out_of_send_order": out_of_order,
        "acked_ids_stored_ahead_of_earlier_sent": overtaking,
        "acked_ids_stored_ahead_by_period": overtaking_by_period,
        "spool_peak": peak, "drained": drained,
        "drain_after_producers_stopped_s": marks["drained"] - marks["producers_stopped"]
        if drained else None,
        "spool_empty_after_pg_start_s": (empty_after - marks["pg_started"])
        if empty_after is not None else None,
        "spool_failed_count": (health.get("spool") or {}).get("failedCount"),
        "first_errors": first_error, "invariant_ok": ok,
        "broker": meter.figures(len(acked)),
    }
    print()
    rows_out = [[st] + [counts[p][st] for p in ("before", "outage", "after")] + [total[st]]
                for st in OUTAGE_STATUSES]
    rows_out.append(["requests"] + [requests[p] for p in ("before", "outage", "after")]
                    + [sum(requests.values())])
    rows_out.append(["request ms p50 / max"] + [
        f"{fmt_ms(result['request_ms'][p]['p50'])} / {fmt_ms(result['request_ms'][p]['max'])}"
        for p in ("before", "outage", "after")] + [""])
    ph = result["phases_s"]
    print(table(["items answered", f"before ({ph['before']:.1f}s)",
                 f"PG down ({ph['down']:.1f}s)", f"after ({ph['after']:.1f}s)", "total"],
                rows_out))
    drain = result["drain_after_producers_stopped_s"]
    empty = result["spool_empty_after_pg_start_s"]
    print(table(["outage: in PostgreSQL afterwards", "value"], [
        ["items pushed / acknowledged (queued+duplicate+buffered)",
         f"{len(status)} / {len(acked)}"],
        ["acknowledged present exactly once", result["acknowledged_present_once"]],
        ["acknowledged missing", len(missing)],
        ["duplicated (any id)", len(duplicated)],
        ["present but nobody pushed them", len(unexpected)],
        ["not acknowledged (failed/HTTP/conn error/timeout): present / absent",
         f"{len(unacked_present)} / {len(unacked) - len(unacked_present)}"],
        ["spool peak (buffered messages)", peak],
        ["broker (whole run, per 1,000 acknowledged)", fmt_broker(result["broker"])],
        ["spool empty after PostgreSQL start (s)", "-" if empty is None else f"{empty:.2f}"],
        ["drain after producers stopped (s)", "-" if drain is None else f"{drain:.2f}"],
        ["info: partitions not in send order / ids stored ahead of earlier-sent ids",
         f"{len(out_of_order)} / {overtaking} (sent: " + ", ".join(
             f"{p} {n}" for p, n in overtaking_by_period.items()) + ")"],
        ["invariant", "OK" if ok else "FAILED"],
    ]))
    for k, v in first_error.items():
        print(f"  first {k}: {v}")
    return result


def ha_period_names(timeline: list[float]) -> list[str]:
    """before, down 1, after 1, down 2, after 2, ... for a normal/down/normal/... timeline."""
    names = ["before"]
    for i in range(1, len(timeline), 2):
        names += [f"down {i // 2 + 1}", f"after {i // 2 + 1}"]
    return names


async def spool_pending_all(client: httpx.AsyncClient, urls: list[str]) -> list[dict | None]:
    """Each broker's ``spool`` section of ``GET /health`` (None when it did not answer); the
    body comes with 503 while PostgreSQL is down, and is read all the same."""
    async def one(url: str) -> dict | None:
        try:
            spool = (await client.get(url + "/health")).json().get("spool")
            return spool if isinstance(spool, dict) else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
    return list(await asyncio.gather(*(one(u) for u in urls)))


def order_breaks(stored: list[str], index: dict[str, int]) -> list[tuple[str, str]]:
    """Adjacent pairs of ``stored`` whose send indexes go backwards."""
    return [(a, b) for a, b in zip(stored, stored[1:]) if index[b] < index[a]]


async def consume_group(url: str, queue: str, partition: str, group: str,
                        deadline: float) -> tuple[list[str], int]:
    """Every transactionId one consumer group gets from one partition over HTTP (pop batch 500,
    then ack the batch), in delivery order; and the number of failed answers.  A pop answered
    503 (the broker's "database unavailable, retry later": with DB_CONNECTION_TIMEOUT=500 a
    pool acquire under load can time out after PostgreSQL is back) is retried after 0.5 s, as
    a client honouring Retry-After would, until the deadline, and so is an ack answered 503;
    any other non-200 answer stops the partition."""
    seen: list[str] = []
    errors = 0
    async with RawHTTPClient(url, 1) as client:
        while time.perf_counter() < deadline:
            r = await client.get(f"/api/v1/pop/queue/{queue}/partition/{partition}"
                                 f"?consumerGroup={group}&batch=500&wait=false")
            if r.status_code == 503:
                log(f"consume {group} {partition}: pop HTTP 503 ({r.text[:120]}), retrying")
                await asyncio.sleep(0.5)
                continue
            if r.status_code not in (200, 204):
                errors += 1
                log(f"consume {group} {partition}: pop HTTP {r.status_code}: {r.text[:200]}")
                break
            messages = (r.json().get("messages") or []) if r.content else []
            if not messages:
                break
            seen += [m["transactionId"] for m in messages]
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"} for m in messages]
            body = json.dumps({"acknowledgments": acks, "consumerGroup": group})
            a = await client.post("/api/v1/ack/batch", headers=JSON_HEADERS, content=body)
            while a.status_code == 503 and time.perf_counter() < deadline:
                await asyncio.sleep(0.5)  # the same ack again (the lease is still ours)
                a = await client.post("/api/v1/ack/batch", headers=JSON_HEADERS, content=body)
            if a.status_code != 200:
                errors += 1
                log(f"consume {group} {partition}: ack HTTP {a.status_code}: {a.text[:200]}")
                break
    return seen, errors


async def bench_outage_ha(args: argparse.Namespace, failures: list[str]) -> dict:
    """Three brokers (no mesh) on one PostgreSQL, sequential producers spreading each
    partition's pushes round-robin over them, PostgreSQL crash-stopped twice: afterwards every
    acknowledged id is in PostgreSQL once and each partition is stored in send order."""
    db = start_database()
    if not db.can_restart:
        db.stop()
        log("outage_ha: skipped, it stops PostgreSQL and needs the embedded one (PG_HOST is set)")
        return {"skipped": "needs the embedded PostgreSQL (PG_HOST is set)"}
    timeline = args.outage_ha_timeline
    periods = ha_period_names(timeline)
    nb, producers = args.outage_ha_brokers, args.outage_ha_producers
    queue = f"bench-outage-ha-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:8]
    index: dict[str, int] = {}       # transactionId -> its producer's send index
    status: dict[str, str] = {}      # transactionId -> what the broker answered
    period: dict[str, str] = {}      # transactionId -> period it was sent in
    via: dict[str, int] = {}         # transactionId -> broker it was sent to
    req_ms: dict[str, list[float]] = {p: [] for p in periods}
    first_error: dict[str, str] = {}
    starts: list[float] = []         # perf_counter of each phase start (len(timeline) + 1)
    # (round start, pendingCount per broker, replayedEvents per broker) from GET /health
    samples: list[tuple[float, list[int | None], list[int | None]]] = []
    stop, stop_monitor = asyncio.Event(), asyncio.Event()

    def now_period(t: float) -> str:
        i = 0
        while i + 1 < len(starts) and t >= starts[i + 1]:
            i += 1
        return periods[min(i, len(periods) - 1)]

    t = time.perf_counter()
    # No mesh: the brokers are told how long the database settles after its restart.
    brokers = start_brokers(db, nb, mesh=False,
                            DB_CONNECTION_TIMEOUT=str(args.outage_db_timeout_ms),
                            FILE_BUFFER_SETTLE_MS=str(args.outage_db_timeout_ms + 300))
    urls = [b.url for b in brokers]
    log(f"{db.kind} PostgreSQL on {db.host}:{db.port}, {nb} brokers (no mesh, "
        f"DB_CONNECTION_TIMEOUT={args.outage_db_timeout_ms}) on {', '.join(urls)} "
        f"(started in {time.perf_counter() - t:.1f}s)")
    meter = BrokerMeter(brokers)
    try:
        async def producer(k: int) -> None:
            clients = [RawHTTPClient(u, 1) for u in urls]
            try:
                n = 0
                while not stop.is_set():
                    tx = f"{tag}-k{k}-{n:06d}"
                    b = (k + n) % nb
                    body = json.dumps({"items": [
                        {"queue": queue, "partition": f"k{k}", "transactionId": tx,
                         "payload": {"k": k, "n": n, "pad": PAD}}]})
                    t_send = time.perf_counter()
                    per = now_period(t_send)
                    got = await push_statuses(clients[b], body, 1, args.outage_request_timeout,
                                              first_error)
                    req_ms[per].append((time.perf_counter() - t_send) * 1000)
                    index[tx], status[tx], period[tx], via[tx] = n, got[0], per, b
                    n += 1
            finally:
                for c in clients:
                    await c.aclose()

        async def monitor() -> None:
            async with httpx.AsyncClient(timeout=5) as client:
                while not stop_monitor.is_set():
                    t0 = time.perf_counter()
                    spools = await spool_pending_all(client, urls)
                    samples.append((t0, [s.get("pendingCount") if s else None for s in spools],
                                    [s.get("replayedEvents") if s else None for s in spools]))
                    await asyncio.sleep(0.1)

        starts.append(time.perf_counter())
        tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
        mon = asyncio.create_task(monitor())
        for i, seconds in enumerate(timeline):
            if i:
                starts.append(time.perf_counter())
                if i % 2:
                    log(f"stopping PostgreSQL (immediate) for {seconds:g} s "
                        f"({len(status)} pushes answered so far)")
                    await db.stop_server()
                else:
                    log("starting PostgreSQL again")
                    await db.start_server()
            await asyncio.sleep(max(0.0, starts[-1] + seconds - time.perf_counter()))
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=args.outage_request_timeout + 5)
        for x in pending:
            x.cancel()
        if pending:
            failures.append(f"outage_ha: {len(pending)} producers did not stop")
        t_stopped = time.perf_counter()
        log(f"producers stopped ({len(status)} pushes); waiting for the {nb} spools to drain")
        drained = False
        deadline = t_stopped + args.outage_drain_max_s
        while time.perf_counter() < deadline:
            if samples and samples[-1][0] >= t_stopped and samples[-1][1] == [0] * nb:
                drained = True
                break
            await asyncio.sleep(0.05)
        t_drained = time.perf_counter()
        stop_monitor.set()
        await asyncio.wait([mon], timeout=10)
        async with httpx.AsyncClient(timeout=5) as client:
            final = await spool_pending_all(client, urls)
        if not drained:
            failures.append(f"outage_ha: spools not drained within {args.outage_drain_max_s:g} s "
                            f"(pendingCount {samples[-1][1] if samples else '?'})")

        conn = await asyncpg.connect(db.dsn, timeout=10)
        try:
            rows = await conn.fetch(STORED_IN_SEQ_ORDER, queue)
            backlog_rows = None
            if await conn.fetchval("SELECT to_regclass('queen.spool_backlog') IS NOT NULL"):
                backlog_rows = await conn.fetchval("SELECT count(*) FROM queen.spool_backlog")
        finally:
            await conn.close()

        consumed: dict[str, dict] = {}
        if args.outage_ha_groups and drained:
            t_c = time.perf_counter()
            cdeadline = t_c + 30  # (a group cut short reports its missing ids)
            for g in range(args.outage_ha_groups):
                group = f"g{g + 1}"
                got = await asyncio.gather(*(
                    consume_group(urls[(g + k) % nb], queue, f"k{k}", group, cdeadline)
                    for k in range(producers)))
                consumed[group] = {"seen": {k: s for k, (s, _) in enumerate(got)},
                                   "errors": sum(e for _, e in got)}
            log(f"consumed with {args.outage_ha_groups} groups in "
                f"{time.perf_counter() - t_c:.1f}s")
    finally:
        meter.stop()
        for b in brokers:
            b.stop()
        db.stop()

    # -- what PostgreSQL holds, against what each producer was told --------------------------
    stored: dict[int, list[str]] = {k: [] for k in range(producers)}
    count: dict[str, int] = {}
    wrong_partition = []
    for r in rows:
        tx = r["transaction_id"]
        count[tx] = count.get(tx, 0) + 1
        k = int(r["partition"][1:]) if r["partition"][1:].isdigit() else -1
        if tx not in index or k not in stored or not tx.startswith(f"{tag}-k{k}-"):
            if tx in index:
                wrong_partition.append(tx)
            continue
        stored[k].append(tx)
    acked = {tx for tx, st in status.items() if st in OUTAGE_ACKED}
    unacked = set(status) - acked
    missing = sorted(acked - count.keys())
    duplicated = sorted(tx for tx, n in count.items() if n > 1)
    unexpected = sorted(count.keys() - status.keys())
    unacked_present = sorted(unacked & count.keys())
    # missing ids that are each partition's last acknowledged ones (a replay not finished yet),
    # as opposed to holes (lost)
    missing_set, tail = set(missing), 0
    for k in range(producers):
        mine = sorted((tx for tx in acked if tx.startswith(f"{tag}-k{k}-")), key=index.get)
        while mine and mine[-1] in missing_set:
            mine.pop()
            tail += 1
    breaks: dict[int, list[tuple[str, str]]] = {}       # acknowledged ids only
    breaks_all: dict[int, list[tuple[str, str]]] = {}   # every stored id
    for k in range(producers):
        b = order_breaks([tx for tx in stored[k] if tx in acked], index)
        if b:
            breaks[k] = b
        b = order_breaks(stored[k], index)
        if b:
            breaks_all[k] = b
    violations = sum(len(v) for v in breaks.values())
    violations_all = sum(len(v) for v in breaks_all.values())

    def describe(pair: tuple[str, str]) -> str:
        return " before ".join(f"{tx} ({status[tx]} via broker {via[tx]}, {period[tx]})"
                               for tx in pair)

    examples = [describe(p) for k in sorted(breaks) for p in breaks[k][:3]][:20]

    # -- consumer groups ----------------------------------------------------------------------
    group_res: dict[str, dict] = {}
    for group, c in consumed.items():
        deliveries = sum(len(s) for s in c["seen"].values())
        seen_ids = [tx for s in c["seen"].values() for tx in s]
        dup = len(seen_ids) - len(set(seen_ids))
        g_missing = len(acked - set(seen_ids))
        g_breaks = sum(len(order_breaks([tx for tx in s if tx in index], index))
                       for s in c["seen"].values())
        group_res[group] = {"deliveries": deliveries, "missing_acked": g_missing,
                            "duplicate_deliveries": dup, "order_violations": g_breaks,
                            "errors": c["errors"]}
        if g_missing or dup or g_breaks or c["errors"]:
            failures.append(f"outage_ha: group {group} missed {g_missing} acknowledged ids, got "
                            f"{dup} twice, {g_breaks} out of send order, {c['errors']} errors")

    # -- drain times: first poll round after each PostgreSQL start with every spool empty -----
    drains: list[float | None] = []
    for i in range(2, len(starts), 2):
        until = starts[i + 1] if i + 1 < len(starts) else math.inf
        hit = next((ts for ts, pend, _ in samples
                    if starts[i] <= ts < until and pend == [0] * nb), None)
        drains.append(None if hit is None else hit - starts[i])
    # every ~0.5 s: (seconds since the start, pendingCount per broker), for the JSON
    # and replayedEvents summed (pendingCount only drops when a whole spool file is replayed;
    # replayedEvents counts every committed chunk, so it shows the replay rate)
    timeline_pts, last_t = [], -math.inf
    for ts, pend, rep in samples:
        if ts - last_t >= 0.5:
            timeline_pts.append([round(ts - starts[0], 2), pend, sum(x or 0 for x in rep)])
            last_t = ts
    peaks = [max((p[j] for _, p, _ in samples if p[j] is not None), default=0)
             for j in range(nb)]

    def replayed_at(t: float) -> int:
        """replayedEvents summed over the brokers, at the last poll round before ``t`` (a
        broker that missed a round counts with its previous answer)."""
        last = [0] * nb
        for ts, _, rep in samples:
            if ts > t:
                break
            last = [x if x is not None else y for x, y in zip(rep, last)]
        return sum(last)

    bounds = starts + [t_stopped, math.inf]
    replayed = {p: replayed_at(bounds[i + 1]) - replayed_at(bounds[i])
                for i, p in enumerate(periods)}
    replayed["final drain"] = replayed_at(math.inf) - replayed_at(t_stopped)
    exc = [s.get("orderExceptions") if s else None for s in final]
    order_exceptions = None if any(x is None for x in exc) else sum(exc)

    counts = {per: {st: 0 for st in OUTAGE_STATUSES} for per in periods}
    for tx, st in status.items():
        counts[period[tx]][st] += 1
    total = {st: sum(counts[p][st] for p in periods) for st in OUTAGE_STATUSES}
    ok = not missing and not duplicated and not unexpected and not violations \
        and not wrong_partition
    if missing or duplicated:
        failures.append(f"outage_ha: {len(missing)} acknowledged ids missing, {len(duplicated)} "
                        f"duplicated in PostgreSQL (e.g. {(missing + duplicated)[:5]})")
    if unexpected or wrong_partition:
        failures.append(f"outage_ha: {len(unexpected)} ids in PostgreSQL nobody pushed, "
                        f"{len(wrong_partition)} in the wrong partition")
    if violations:
        failures.append(f"outage_ha: {violations} adjacent pairs out of send order in "
                        f"{len(breaks)} partitions (e.g. {examples[:3]})")
    durations = [b - a for a, b in zip(starts, starts[1:] + [t_stopped])]
    result = {
        "queue": queue, "brokers": nb, "producers": producers, "mesh": False,
        "db_connection_timeout_ms": args.outage_db_timeout_ms,
        "timeline_s": timeline, "periods": periods,
        "period_s": dict(zip(periods, durations)),
        "request_ms": {p: {"p50": percentile(v, 50), "p99": percentile(v, 99),
                           "max": max(v) if v else None} for p, v in req_ms.items()},
        "pushes": len(status), "by_period": counts, "totals": total,
        "acknowledged": len(acked), "present": len(count),
        "acknowledged_present_once": len(acked) - len(missing) - len(set(duplicated) & acked),
        "missing": len(missing), "missing_at_partition_tails": tail,
        "duplicated": len(duplicated), "unexpected": len(unexpected),
        "wrong_partition": len(wrong_partition),
        "unacknowledged": len(unacked), "unacknowledged_present": len(unacked_present),
        "order_violations": violations, "order_violation_partitions": sorted(breaks),
        "order_violations_incl_unacknowledged": violations_all,
        "order_violation_examples": examples,
        "missing_ids": missing[:100], "duplicated_ids": duplicated[:100],
        "unexpected_ids": unexpected[:100], "wrong_partition_ids": wrong_partition[:100],
        "drain_after_pg_start_s": drains, "drained": drained,
        "drain_after_producers_stopped_s": (t_drained - t_stopped) if drained else None,
        "spool_peak_per_broker": peaks, "spool_timeline": timeline_pts,
        "spool_replayed_by_period": replayed,
        "order_exceptions": order_exceptions,
        "order_exceptions_per_broker": exc,
        "spool_failed_count": [s.get("failedCount") if s else None for s in final],
        "spool_backlog_rows_after": backlog_rows,
        "groups": group_res, "first_errors": first_error, "invariant_ok": ok and not any(
            g["missing_acked"] or g["duplicate_deliveries"] or g["order_violations"]
            or g["errors"] for g in group_res.values()),
        "broker": meter.figures(len(acked)),
    }
    print()
    rows_out = [[st] + [counts[p][st] for p in periods] + [total[st]] for st in OUTAGE_STATUSES]
    rows_out.append(["request ms p50 / max"] + [
        f"{fmt_ms(result['request_ms'][p]['p50'])} / {fmt_ms(result['request_ms'][p]['max'])}"
        for p in periods] + [""])
    print(table(["pushes answered"] + [f"{p} ({d:.1f}s)" for p, d in
                                       zip(periods, durations)] + ["total"], rows_out))
    fmt_s = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    out = [
        ["pushes / acknowledged (queued+duplicate+buffered)", f"{len(status)} / {len(acked)}"],
        ["acknowledged present exactly once", result["acknowledged_present_once"]],
        ["acknowledged missing (of which each partition's last ones / holes)",
         f"{len(missing)} ({tail} / {len(missing) - tail})"],
        ["duplicated (any id)", len(duplicated)],
        ["present but nobody pushed them / in the wrong partition",
         f"{len(unexpected)} / {len(wrong_partition)}"],
        ["not acknowledged: present / absent",
         f"{len(unacked_present)} / {len(unacked) - len(unacked_present)}"],
        ["order violations (adjacent stored pairs not in send order) / partitions",
         f"{violations} / {len(breaks)}"],
        ["  the same, counting unacknowledged ids too", violations_all],
        ["spool peak per broker (pendingCount)", " / ".join(map(str, peaks))],
        ["spool events replayed (replayedEvents): " + " / ".join(
            p for p in replayed if p.startswith("after") or p == "final drain"),
         " / ".join(str(n) for p, n in replayed.items()
                    if p.startswith("after") or p == "final drain")],
    ]
    for i, d in enumerate(drains):
        out.append([f"all spools empty after PostgreSQL start {i + 1} (s)",
                    fmt_s(d) if d is not None else "not empty before the next stop"
                    if i + 1 < len(drains) else "not within the drain cap"])
    out += [["drain after producers stopped (s)", fmt_s(result["drain_after_producers_stopped_s"])],
            ["spool.orderExceptions (sum over brokers)",
             "n/a" if order_exceptions is None else order_exceptions],
            ["queen.spool_backlog rows afterwards",
             "n/a" if backlog_rows is None else backlog_rows],
            [f"{nb} brokers (whole run, per 1,000 acknowledged)", fmt_broker(result["broker"])]]
    for group, g in group_res.items():
        out.append([f"group {group}: deliveries / missing / twice / out of order / errors",
                    f"{g['deliveries']} / {g['missing_acked']} / {g['duplicate_deliveries']} / "
                    f"{g['order_violations']} / {g['errors']}"])
    out.append(["invariant (0 missing, 0 duplicated, 0 order violations)",
                "OK" if result["invariant_ok"] else "FAILED"])
    print(table([f"outage_ha: {nb} brokers, in PostgreSQL afterwards", "value"], out))
    if not drained and missing:
        print(f"  the spools did not drain: the missing ids may still have been waiting in them "
              f"when the brokers were stopped (pendingCount {samples[-1][1] if samples else '?'})")
    for e in examples[:5]:
        print(f"  out of order: {e}")
    for k, v in first_error.items():
        print(f"  first {k}: {v}")
    return result


async def bench_consume(args: argparse.Namespace, failures: list[str]) -> dict:
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


async def long_poll_figures(client: RawHTTPClient | httpx.AsyncClient) -> dict:
    """/health's long-poll figures (empty on a broker that does not report them)."""
    state = (await client.get("/health")).json()["shared_state"]
    return {"parked": state["parkedPops"], **(state.get("longPolls") or {})}


def delta(after: dict, before: dict, key: str) -> int | None:
    return after[key] - before[key] if key in after and key in before else None


async def bench_herd(args: argparse.Namespace, failures: list[str]) -> dict:
    """2,000 long polls parked on one queue (one consumer group), then single-message pushes
    one after the other: push round trip, claim statements per push, broker CPU and RSS."""
    n_parked, n_push = args.herd_parked, args.herd_pushes
    queue = f"bench-herd-{uuid.uuid4().hex[:8]}"
    delivered: dict[str, int] = {}
    stop, arrived = asyncio.Event(), asyncio.Event()
    with Env() as env:
        pid = env.broker.proc.pid
        async with RawHTTPClient(env.broker.url, max_connections=n_parked + 8) as pops, \
                RawHTTPClient(env.broker.url, max_connections=4) as ctl:
            async def lane(_: int) -> None:
                path = f"/api/v1/pop/queue/{queue}?wait=true&timeout={args.herd_poll_timeout_ms}"
                while not stop.is_set():
                    r = await pops.get(path)
                    msgs = (r.json() if r.content else {}).get("messages") or []
                    for m in msgs:
                        delivered[m["transactionId"]] = delivered.get(m["transactionId"], 0) + 1
                        arrived.set()
                    if msgs:
                        await ack_completed(pops, msgs)

            lanes: list[asyncio.Task] = []
            try:
                # Parked in steps of 100: the broker's listen backlog is 100.
                t0 = time.perf_counter()
                for i in range(0, n_parked, 100):
                    lanes += [asyncio.create_task(lane(k)) for k in range(i, min(n_parked, i + 100))]
                    while time.perf_counter() - t0 < args.herd_park_max_s:
                        if (await long_poll_figures(ctl))["parked"] >= len(lanes):
                            break
                        await asyncio.sleep(0.05)  # polling the broker's /health
                parked = (await long_poll_figures(ctl))["parked"]
                log(f"{parked}/{n_parked} long polls parked in {time.perf_counter() - t0:.1f}s")
                if parked < n_parked:
                    log(f"note: not all parked within {args.herd_park_max_s:g}s (a herd re-checks "
                        f"instead of parking); measuring with {parked}")
                # Idle: what parked pops cost with nothing pushed (timer re-checks).
                idle_s = args.herd_idle_s
                f0, p0, t_idle = await long_poll_figures(ctl), proc_figures(pid), time.perf_counter()
                await asyncio.sleep(idle_s)
                f1, p1 = await long_poll_figures(ctl), proc_figures(pid)
                meter = BrokerMeter(env.broker)
                idle_s = time.perf_counter() - t_idle
                rtts: list[float] = []
                statuses: dict[str, int] = {}
                answers: dict[str, str] = {}
                sent: list[str] = []
                deadline = time.perf_counter() + args.max_seconds
                for i in range(n_push):
                    if time.perf_counter() > deadline:
                        log(f"note: herd pushes hit the time cap after {i}/{n_push}")
                        break
                    tid = f"herd-{i}"
                    body = json.dumps({"items": [{"queue": queue, "partition": f"p{i % 16}",
                                                  "transactionId": tid, "payload": {"i": i}}]})
                    t = time.perf_counter()
                    r = await ctl.post("/api/v1/push", content=body, headers=JSON_HEADERS)
                    rtts.append((time.perf_counter() - t) * 1000)
                    status = r.json()[0].get("status") if r.status_code in (200, 201) \
                        else f"HTTP {r.status_code}"
                    statuses[status] = statuses.get(status, 0) + 1
                    answers[tid] = status
                    sent.append(tid)
                    await asyncio.sleep(args.herd_gap_ms / 1000)
                t_end = time.perf_counter() + 30
                while len(delivered) < len(sent) and time.perf_counter() < t_end:
                    arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived.wait(), t_end - time.perf_counter())
                f2, p2 = await long_poll_figures(ctl), proc_figures(pid)
                meter.stop()
            finally:
                stop.set()
                for t in lanes:
                    t.cancel()
                await asyncio.gather(*lanes, return_exceptions=True)
    missing = [t for t in sent if t not in delivered]
    twice = [t for t, c in delivered.items() if c > 1]
    if missing or twice:
        failures.append(f"herd: {len(missing)} pushed messages never delivered, "
                        f"{len(twice)} delivered twice")
    if any(s != "queued" for s in statuses):
        failures.append(f"herd: push answers {statuses} (not all queued: pool timeouts spill "
                        f"into the spool)")
    pushes = len(sent)
    claims = delta(f2, f1, "claimQueries")
    res = {"parked": n_parked, "parked_seen": parked, "pushes": pushes,
           "missing_ids": missing[:20], "missing_statuses": [answers.get(t) for t in missing[:20]], "statuses": statuses,
           "push_rtt_ms": {"p50": percentile(rtts, 50), "p99": percentile(rtts, 99),
                           "max": max(rtts) if rtts else None},
           "claims_per_push": claims / pushes if claims is not None and pushes else None,
           "idle_s": round(idle_s, 2),
           "idle_claims_per_s": (delta(f1, f0, "claimQueries") or 0) / idle_s
           if "claimQueries" in f1 else None,
           "idle_broker_cpu_pct": (p1["cpu_s"] - p0["cpu_s"]) / idle_s * 100,
           "broker_cpu_ms_per_push": (p2["cpu_s"] - p1["cpu_s"]) * 1000 / pushes if pushes else None,
           "broker_rss_mb": p2["rss_mb"], "broker": meter.figures(pushes),
           "delivered": len(delivered), "missing": len(missing),
           "duplicated": len(twice), "figures": {"idle_start": f0, "push_start": f1, "end": f2},
           "load": os.getloadavg()}
    print()
    rt = res["push_rtt_ms"]
    print(table([f"herd: {n_parked} parked pops, one queue", "value"], [
        ["push round trip p50 / p99 / max (ms)",
         f"{fmt_ms(rt['p50'])} / {fmt_ms(rt['p99'])} / {fmt_ms(rt['max'])}"],
        ["push answers", ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))],
        ["claim statements per push", "-" if res["claims_per_push"] is None
         else f"{res['claims_per_push']:.1f}"],
        [f"idle ({idle_s:.0f}s): claim statements/s, broker CPU %",
         f"{fmt_rate(res['idle_claims_per_s'])}, {res['idle_broker_cpu_pct']:.0f}%"],
        ["broker CPU per push (ms), RSS (MB)",
         f"{fmt_ms(res['broker_cpu_ms_per_push'])}, {res['broker_rss_mb']:.0f}"],
        ["broker during the pushes", fmt_broker(res["broker"])],
        ["delivered / missing / twice", f"{len(delivered)} / {len(missing)} / {len(twice)}"],
    ]))
    print(f"  target: push p99 < 20 ms, all queued (no pool timeouts); load "
          f"{' '.join(f'{x:.1f}' for x in res['load'])}")
    return res


RUNNERS = {"push": bench_push, "pop": bench_pop, "wake": bench_wake, "wake_ha": bench_wake_ha,
           "consume": bench_consume, "outage": bench_outage,
           "outage_ha": bench_outage_ha, "herd": bench_herd,
           **{name: m.run for name, m in SCALE.items()}}


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def environment() -> dict:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        rev = ""
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "git_rev": rev or None,
            "database": "external" if os.environ.get("PG_HOST") else "embedded"}


def summary_rows(name: str, res: dict) -> list[list[str]]:
    if name in SCALE:
        return SCALE[name].summary_rows(res)
    if name in ("push", "pop"):
        what = "push" if name == "push" else "pop+ack"
        c = res["client_ceiling_req_per_s"]
        ceiling = [[f"{name}: load generator ceiling, GET /health",
                    f"{fmt_rate(c[res['client']])} req/s ({res['client']})",
                    f"httpx: {fmt_rate(c['httpx'])} req/s", ""]]
        return ceiling + [[f"{name}: {what} batch {r['batch']}",
                           f"{fmt_rate(r['broker_msgs_per_s'])} msg/s, "
                           f"{fmt_ms(r['broker']['broker_cpu_ms_per_1000'])} ms CPU/1k",
                 f"{fmt_rate(r['raw_msgs_per_s'])} msg/s", fmt_ratio(r["ratio"])]
                for r in res["results"]]
    if name == "wake":
        s = res["latency_from_push_response_ms"]
        t = res["latency_from_push_send_ms"]
        return [["wake: after push response p50/p95/p99/max",
                 f"{fmt_ms(s['p50'])}/{fmt_ms(s['p95'])}/{fmt_ms(s['p99'])}/{fmt_ms(s['max'])} ms",
                 f"target p99 < {WAKE_TARGET_MS} ms", "met" if res["target_met"] else "NOT met"],
                ["wake: after push send p50/p99",
                 f"{fmt_ms(t['p50'])}/{fmt_ms(t['p99'])} ms", "", ""]]
    if name == "wake_ha":
        rows = []
        for mode, label, verdict in (
                ("mesh", "wake_ha: push on A, pop on B, mesh", f"target p99 < {WAKE_HA_TARGET_MS} ms"),
                ("cut", "wake_ha: push on A, pop on B, no mesh", "re-check timer (<= 1 s + query)")):
            if mode not in res:
                continue
            s = res[mode]["latency_from_push_response_ms"]
            ok = res.get("target_met") if mode == "mesh" else res.get("cut_within_bound")
            rows.append([f"{label} p50/p95/p99/max",
                         f"{fmt_ms(s['p50'])}/{fmt_ms(s['p95'])}/{fmt_ms(s['p99'])}/"
                         f"{fmt_ms(s['max'])} ms", verdict, "met" if ok else "NOT met"])
        return rows
    if name == "outage":
        if res.get("skipped"):
            return [["outage: skipped", res["skipped"], "", ""]]
        drain = res["drain_after_producers_stopped_s"]
        return [["outage: PG down {:.0f}s, acked ids in PG once".format(res["phases_s"]["down"]),
                 f"{res['acknowledged_present_once']}/{res['acknowledged']} "
                 f"({res['totals']['buffered']} buffered)",
                 f"missing {res['missing']}, dup {res['duplicated']}, "
                 f"drain {'-' if drain is None else f'{drain:.1f}'} s",
                 "OK" if res["invariant_ok"] else "INVARIANT FAILED"]]
    if name == "outage_ha":
        if res.get("skipped"):
            return [["outage_ha: skipped", res["skipped"], "", ""]]
        drains = "/".join("-" if d is None else f"{d:.1f}" for d in res["drain_after_pg_start_s"])
        exc = res["order_exceptions"]
        return [[f"outage_ha: {res['brokers']} brokers, PG down "
                 + "+".join(f"{s:g}" for s in res["timeline_s"][1::2]) + " s, acked in PG once",
                 f"{res['acknowledged_present_once']}/{res['acknowledged']} "
                 f"({res['totals']['buffered']} buffered)",
                 f"missing {res['missing']}, dup {res['duplicated']}, order violations "
                 f"{res['order_violations']}, order exceptions {'n/a' if exc is None else exc}, "
                 f"drains {drains} s",
                 "OK" if res["invariant_ok"] else "INVARIANT FAILED"]]
    if name == "herd":
        rt = res["push_rtt_ms"]
        cpp = res["claims_per_push"]
        return [[f"herd: {res['parked']} parked pops, push p50/p99/max",
                 f"{fmt_ms(rt['p50'])}/{fmt_ms(rt['p99'])}/{fmt_ms(rt['max'])} ms",
                 "target p99 < 20 ms, all queued",
                 f"{'-' if cpp is None else f'{cpp:.1f}'} claims/push, "
                 + ("met" if rt["p99"] is not None and rt["p99"] < 20
                    and set(res["statuses"]) == {"queued"} else "NOT met")]]
    if name == "consume":
        return [["consume: official client end-to-end",
                 f"{fmt_rate(res['msgs_per_s'])} msg/s ({res['elapsed_s']:.2f} s)",
                 f"{res['messages']} msgs, {res['partitions']} partitions",
                 "order/loss/dup OK" if res["invariant_ok"] else "INVARIANT FAILED"]]
    return []


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)")
    ap.add_argument("-c", "--concurrency", type=int, default=16,
                    help="concurrent client tasks (push/pop) and raw pool size")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="HTTP load generator for push/pop/wake: a minimal asyncio HTTP/1.1 "
                         "keep-alive client, or httpx.AsyncClient (~10x more client CPU per "
                         "request: on 2 cores it caps near 450 req/s and hides the broker)")
    ap.add_argument("--no-uvloop", action="store_true",
                    help="run the load generator on the default asyncio loop, not uvloop")
    ap.add_argument("--partitions", type=int, default=16, help="partitions per queue")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each push/pop measurement (broker then raw) and report medians")
    ap.add_argument("--push-n1", type=int, default=5000, help="messages pushed at batch 1")
    ap.add_argument("--push-n100", type=int, default=50000, help="messages pushed at batch 100")
    ap.add_argument("--pop-n1", type=int, default=3000, help="messages popped at batch 1")
    ap.add_argument("--pop-n100", type=int, default=30000, help="messages popped at batch 100")
    ap.add_argument("--wake-tries", type=int, default=200, help="measured wake-up tries")
    ap.add_argument("--wake-delay-ms", type=int, default=500,
                    help="time a pop stays parked before the push")
    ap.add_argument("--wake-ha-tries", type=int, default=200,
                    help="wake_ha: measured tries with the two brokers meshed")
    ap.add_argument("--wake-ha-cut-tries", type=int, default=30,
                    help="wake_ha: measured tries with the two brokers not meshed")
    ap.add_argument("--wake-ha-delay-ms", type=int, default=300,
                    help="wake_ha: time a pop stays parked on B before the push on A")
    ap.add_argument("--wake-ha-cut-delay-ms", type=lambda v: [int(x) for x in v.split("-", 1)],
                    default=[1700, 2700], metavar="LO-HI",
                    help="wake_ha without mesh: the push on A comes this long (uniform) after "
                         "the pop parked on B; 1700-2700 is one full 1000 ms re-check period of "
                         "a pop parked long enough for its interval to reach the cap")
    ap.add_argument("--wake-ha-cut-lanes", type=int, default=10,
                    help="wake_ha without mesh: tries running concurrently (on distinct queues)")
    ap.add_argument("--outage-producers", type=int, default=16, help="outage: producers")
    ap.add_argument("--outage-pause-ms", type=int, default=10,
                    help="outage: pause of each producer between two pushes")
    ap.add_argument("--outage-before-s", type=float, default=5.0,
                    help="outage: pushing before PostgreSQL is stopped")
    ap.add_argument("--outage-down-s", type=float, default=10.0,
                    help="outage: PostgreSQL down for this long")
    ap.add_argument("--outage-after-s", type=float, default=5.0,
                    help="outage: pushing after PostgreSQL is started again")
    ap.add_argument("--outage-db-timeout-ms", type=int, default=500,
                    help="outage: the broker's DB_CONNECTION_TIMEOUT")
    ap.add_argument("--outage-request-timeout", type=float, default=30.0,
                    help="outage: client timeout of one push (then counted as 'timeout')")
    ap.add_argument("--outage-drain-max-s", type=float, default=120.0,
                    help="outage: longest wait for the spool to drain")
    ap.add_argument("--outage-ha-timeline", default=[5.0, 8.0, 5.0, 5.0, 5.0],
                    type=lambda v: [float(x) for x in v.split(",")], metavar="S,S,...",
                    help="outage_ha: seconds PostgreSQL is up, down, up, down, up, ...")
    ap.add_argument("--outage-ha-brokers", type=int, default=3, help="outage_ha: brokers")
    ap.add_argument("--outage-ha-producers", type=int, default=16,
                    help="outage_ha: sequential producers, one partition each")
    ap.add_argument("--outage-ha-groups", type=int, default=2,
                    help="outage_ha: consumer groups reading everything afterwards (0: none)")
    ap.add_argument("--consume-n", type=int, default=10000, help="messages through consume()")
    ap.add_argument("--consume-producers", type=int, default=4, help="concurrent producers")
    ap.add_argument("--consume-concurrency", type=int, default=8, help="consume() workers")
    ap.add_argument("--consume-batch", type=int, default=50, help="consume() batch size")
    ap.add_argument("--herd-parked", type=int, default=2000,
                    help="herd: long polls parked on one queue")
    ap.add_argument("--herd-pushes", type=int, default=200,
                    help="herd: single-message pushes, one after the other")
    ap.add_argument("--herd-poll-timeout-ms", type=int, default=300_000,
                    help="herd: the long polls' timeout; longer than the run, so they do not "
                         "all time out and poll again at once inside the measured phase")
    ap.add_argument("--herd-gap-ms", type=int, default=20, help="herd: pause between pushes")
    ap.add_argument("--herd-park-max-s", type=float, default=180.0,
                    help="herd: longest wait for the pops to park")
    ap.add_argument("--herd-idle-s", type=float, default=5.0,
                    help="herd: seconds measured with the pops parked and nothing pushed")
    for module in SCALE.values():
        module.add_arguments(ap)
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes for a shorter run: " + ", ".join(
                        f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="time cap of each measured phase")
    ap.add_argument("--results-dir", default=os.environ.get("BENCH_RESULTS_DIR",
                                                            "/tmp/queen-bench-results"),
                    help="where the JSON results go")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if min(args.concurrency, args.partitions, args.rounds, args.consume_producers,
           args.consume_concurrency, args.consume_batch, args.wake_tries, args.wake_ha_tries,
           args.wake_ha_cut_tries, args.wake_ha_cut_lanes, args.outage_producers) < 1:
        ap.error("counts must be >= 1")
    if len(args.outage_ha_timeline) % 2 == 0 or min(args.outage_ha_timeline) < 0 \
            or min(args.outage_ha_brokers, args.outage_ha_producers) < 1 \
            or args.outage_ha_groups < 0:
        ap.error("--outage-ha-timeline must be an odd number of seconds >= 0 (up, down, ..., "
                 "up); outage_ha brokers and producers >= 1, groups >= 0")
    cut = args.wake_ha_cut_delay_ms
    if len(cut) != 2 or not 0 <= cut[0] <= cut[1] <= 3500:
        ap.error("--wake-ha-cut-delay-ms must be LO-HI with 0 <= LO <= HI <= 3500 (the parked "
                 "pop times out after 5 s)")
    if not 0 <= args.wake_ha_delay_ms <= 3500 or not 0 <= args.wake_delay_ms <= 3500:
        ap.error("wake delays must be between 0 and 3500 ms (the parked pop times out after 5 s)")
    args.names = args.names or list(BENCHMARKS)
    return args


async def main_async(args: argparse.Namespace) -> int:
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    env = environment()
    summary: list[list[str]] = []
    by_name: dict[str, dict | None] = {}
    written: list[Path] = []
    all_failures: list[str] = []
    t_all = time.perf_counter()
    print(f"benchmarks: {', '.join(args.names)} (python {env['python']}, {env['cpus']} cpus, "
          f"{env['database']} PostgreSQL, client {args.client} on {args.loop})")
    for name in args.names:
        print(f"\n== {name} " + "=" * (70 - len(name)), flush=True)
        failures: list[str] = []
        t = time.perf_counter()
        try:
            res = await RUNNERS[name](args, failures)
        except Exception as exc:  # one broken benchmark does not hide the others
            failures.append(f"{name}: crashed: {exc!r}")
            res = None
        for f in failures:
            print(f"  FAILED: {f}")
        all_failures += failures
        doc = {"benchmark": name, "timestamp": stamp, "duration_s": time.perf_counter() - t,
               "environment": env, "parameters": {k: v for k, v in vars(args).items()
                                                   if k != "names"},
               "failures": failures, "result": res}
        path = results_dir / f"{name}-{stamp}.json"
        path.write_text(json.dumps(doc, indent=2, default=str))
        written.append(path)
        by_name[name] = res
        if res is not None:
            summary += summary_rows(name, res)
        else:
            summary.append([f"{name}: crashed", "-", "-", "-"])

    print("\n== summary " + "=" * 63)
    print(table(["benchmark", "broker", "baseline: raw asyncpg / target", "broker/raw, verdict"],
                summary))
    print("\n== issue-14 targets " + "=" * 54)
    print(table(TARGET_HEADERS, target_rows(by_name)))
    print(f"  load {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {env['cpus']} cpus; a "
          f"missed target does not change the exit status (invariant failures do)")
    print(f"total time {time.perf_counter() - t_all:.0f}s; results:")
    for p in written:
        print(f"  {p}")
    if all_failures:
        print(f"{len(all_failures)} failure(s):")
        for f in all_failures:
            print(f"  - {f}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    loadgen.set_client(args.client)
    if not args.no_uvloop:
        try:
            import uvloop
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            args.loop = "uvloop"
        except ImportError:
            args.loop = "asyncio"
    else:
        args.loop = "asyncio"
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
