#!/usr/bin/env python3
"""What a durable `buffered` costs: spooled pushes under FILE_BUFFER_FSYNC settings, side by
side in one run, and the drain that follows.

    .venv/bin/python benchmarks/spool_fsync.py
    .venv/bin/python benchmarks/spool_fsync.py --rounds 3 --base 8e2a1b4

One PostgreSQL (embedded, or PG_HOST...), one broker per setting on it: ``always`` (the
default: fdatasync before the answer, group commit) and ``interval:1000`` (answered on write,
synced within a second: the cost of the write alone), and with ``--base REV`` a third broker
run from a temporary ``git worktree`` of that revision, as it was. Each broker's push
maintenance is on, so every push goes to its spool and answers ``buffered``. Workloads, each on
a fresh queue, in alternating broker order per round:

- ``b1x16``: batch 1, 16 concurrent clients;
- ``b1x64``: batch 1, 64 concurrent clients;
- ``b100x16``: batch 100, 16 concurrent clients.

Printed per workload (medians over ``--rounds``): msg/s of each setting and its ratio to the
first non-``always`` one, syncs per second and per push (the spool's own ``syncs`` counter in
``/health``; the base revision has none), the push p50/p99 and the broker's CPU per 1,000
messages. Then the drain: maintenance off, and the time until every spooled push is merged
into its queue (the spool empty and nothing staged), as events per second.
Exit 1 when a push was not answered ``buffered``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _harness import Broker, BrokerMeter, drop_worktree, start_database, worktree  # noqa: E402
from _loadgen import (  # noqa: E402
    Rows,
    fmt_rate,
    http_push,
    log,
    median,
    percentile,
    ratio,
    table,
)

WORKLOADS = {"b1x16": (1, 16), "b1x64": (1, 64), "b100x16": (100, 16)}


async def spool_figures(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return (await client.get("/health")).json().get("spool") or {}


async def maintenance(url: str, on: bool) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        r = await client.post("/api/v1/system/maintenance", json={"enabled": on})
        r.raise_for_status()


async def drain(url: str, events: int, cap_s: float) -> float | None:
    """Maintenance off; seconds until every spooled push is merged (None past ``cap_s``)."""
    start = time.perf_counter()
    await maintenance(url, False)
    while time.perf_counter() - start < cap_s:
        spool = await spool_figures(url)
        staged = (spool.get("staging") or {}).get("stagedEvents", 0)
        if spool.get("pendingCount", 1) == 0 and staged == 0:
            return time.perf_counter() - start
        await asyncio.sleep(0.05)
    log(f"drain of {events} events not done after {cap_s} s")
    return None


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--messages", type=int, default=6000, help="per batch-1 workload")
    parser.add_argument("--messages-100", type=int, default=60000, help="per batch-100 workload")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--base", help="also run this git revision's broker, as it was")
    parser.add_argument("--max-seconds", type=float, default=60)
    args = parser.parse_args()

    settings: list[tuple[str, dict, Path | None]] = [
        ("always", {"FILE_BUFFER_FSYNC": "always"}, None),
        (f"interval:{args.interval_ms}", {"FILE_BUFFER_FSYNC": f"interval:{args.interval_ms}"},
         None)]
    base = worktree(args.base) if args.base else None
    if base is not None:
        settings.append((f"base {args.base}", {}, base))
    db = start_database()
    brokers: dict[str, Broker] = {}
    failures: list[str] = []
    results: dict[str, dict[str, list]] = {}
    try:
        # The base revision first: a broker refuses to start on a schema newer than it
        # knows, but one already running keeps working when a newer one migrates.
        for name, env, root in sorted(settings, key=lambda s: s[2] is None):
            brokers[name] = Broker(db, root=root, **env)
        brokers = {name: brokers[name] for name, _, _ in settings}
        for rnd in range(args.rounds):
            order = list(brokers) if rnd % 2 == 0 else list(reversed(brokers))
            for workload, (batch, clients) in WORKLOADS.items():
                n = args.messages_100 if batch == 100 else args.messages
                for name in order:
                    b = brokers[name]
                    await maintenance(b.url, True)
                    queue = f"fsync-{workload}-{uuid.uuid4().hex[:8]}"
                    before = await spool_figures(b.url)
                    meter = BrokerMeter(b)
                    phase = await http_push(b.url, queue, Rows(n, args.partitions), batch,
                                            clients, args.max_seconds, f"{name} {workload}",
                                            accepted="buffered")
                    phase.broker = meter.figures(phase.done)
                    after = await spool_figures(b.url)
                    syncs = after.get("syncs", 0) - before.get("syncs", 0) \
                        if "syncs" in after else None
                    took = await drain(b.url, phase.done, 300)
                    if phase.errors:
                        failures.append(f"{name} {workload}: {phase.first_error}")
                    rec = results.setdefault(workload, {}).setdefault(name, [])
                    rec.append({"rate": phase.rate, "syncs": syncs, "done": phase.done,
                                "elapsed": phase.elapsed, "requests": phase.requests,
                                "p50": percentile(phase.latencies_ms, 50),
                                "p99": percentile(phase.latencies_ms, 99),
                                "cpu": (phase.broker or {}).get("broker_cpu_ms_per_1000"),
                                "drain_rate": phase.done / took if took else None})
                    log(f"round {rnd + 1} {workload} {name}: {fmt_rate(phase.rate)} msg/s, "
                        f"syncs {syncs}, drain {took and round(took, 2)} s")
    finally:
        for b in brokers.values():
            b.stop()
        db.stop()
        if base is not None:
            drop_worktree(base)

    names = [s[0] for s in settings]
    reference = names[1]
    rows = []
    for workload, per in results.items():
        for name in names:
            recs = per.get(name, [])
            rate = median([r["rate"] for r in recs if r["rate"]])
            ref = median([r["rate"] for r in per.get(reference, []) if r["rate"]])
            syncs = [r["syncs"] / r["elapsed"] for r in recs if r["syncs"] is not None]
            per_push = [r["syncs"] / r["requests"] for r in recs
                        if r["syncs"] is not None and r["requests"]]
            rows.append([workload, name, fmt_rate(rate), f"{ratio(rate, ref) or 0:.2f}",
                         f"{median(syncs):.0f}" if syncs else "-",
                         f"{median(per_push):.3f}" if per_push else "-",
                         f"{median([r['p50'] for r in recs]):.1f}",
                         f"{median([r['p99'] for r in recs]):.1f}",
                         f"{median([r['cpu'] for r in recs if r['cpu']]):.1f}",
                         fmt_rate(median([r["drain_rate"] for r in recs if r["drain_rate"]]))])
    print(table(["workload", "setting", "msg/s", f"÷ {reference}", "syncs/s", "syncs/push",
                 "p50 ms", "p99 ms", "CPU ms/1k", "drain ev/s"], rows))
    out = Path("/tmp/queen-bench-results")
    out.mkdir(exist_ok=True)
    path = out / f"spool_fsync-{int(time.time())}.json"
    path.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"results: {path}")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
