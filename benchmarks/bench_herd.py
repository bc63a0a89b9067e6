"""``herd``: the thundering herd, 2,000 long polls parked on one queue.

One PostgreSQL and one broker.  Registered in run.py (``python3 dev.py bench herd``);
profile_broker.py runs ``run`` against a broker of its own by replacing ``Env``.

``--herd-parked`` long polls parked on one queue (queue mode, ``wait=true&timeout=``
``--herd-poll-timeout-ms``; each client acks what it gets and polls again), parked in steps of
100 (the broker's listen backlog); then ``--herd-idle-s`` with nothing pushed; then
``--herd-pushes`` single-message pushes one after the other, ``--herd-gap-ms`` apart.
Reported: push round trip p50/p99/max, the push answers, claim statements per push and per idle
second (``/health`` ``shared_state.longPolls``), broker CPU per push and RSS, messages delivered
/ missing / twice.  Targets: push p99 < 20 ms, every push ``queued``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid

import httpx

from _harness import BrokerMeter, RawHTTPClient, fmt_broker, proc_figures
from _loadgen import JSON_HEADERS, Env, ack_completed, fmt_ms, fmt_rate, log, percentile, table

NAME = "herd"


def add_arguments(ap: argparse.ArgumentParser) -> None:
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


async def long_poll_figures(client: RawHTTPClient | httpx.AsyncClient) -> dict:
    """/health's long-poll figures (empty on a broker that does not report them)."""
    state = (await client.get("/health")).json()["shared_state"]
    return {"parked": state["parkedPops"], **(state.get("longPolls") or {})}


def delta(after: dict, before: dict, key: str) -> int | None:
    return after[key] - before[key] if key in after and key in before else None


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
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


def summary_rows(res: dict) -> list[list[str]]:
    rt = res["push_rtt_ms"]
    cpp = res["claims_per_push"]
    return [[f"herd: {res['parked']} parked pops, push p50/p99/max",
             f"{fmt_ms(rt['p50'])}/{fmt_ms(rt['p99'])}/{fmt_ms(rt['max'])} ms",
             "target p99 < 20 ms, all queued",
             f"{'-' if cpp is None else f'{cpp:.1f}'} claims/push, "
             + ("met" if rt["p99"] is not None and rt["p99"] < 20
                and set(res["statuses"]) == {"queued"} else "NOT met")]]
