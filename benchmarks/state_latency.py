"""Round trips of the state surfaces, through the official client.

    .venv/bin/python benchmarks/state_latency.py [--tries 200] [--brokers 3]

Starts its own PostgreSQL and ``--brokers`` broker processes (one PostgreSQL, no mesh),
then measures, one call at a time:

* lock acquire and renew round trips (``client.locks.acquire`` / ``renew``), and a
  guarded transaction (``client.transaction().guard(lock)...commit()``);
* timer delivery lateness: timers scheduled through the brokers in turn with delays of
  50-450 ms; lateness = the delivered message's stored time minus the timer's deliverAt
  (both PostgreSQL's clock), never negative ("not before").

Prints p50 / p95 / p99 / max in ms. A report, not a gate: exit status 0 unless an
invariant fails (a timer delivered before its time, twice, or not at all)."""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import start_brokers, start_database


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _line(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"{name:<28} n={len(ms):<5} p50 {_pct(ms, 50):7.2f}  p95 {_pct(ms, 95):7.2f}  "
            f"p99 {_pct(ms, 99):7.2f}  max {max(ms):7.2f}  mean {statistics.mean(ms):7.2f} ms")


async def measure(urls: list[str], dsn: str, tries: int) -> int:
    from queen import Queen

    clients = [Queen(u) for u in urls]
    q = clients[0]
    acquire, renew, guarded = [], [], []
    for n in range(tries):
        name = f"bench-lock-{n}"
        t0 = time.perf_counter()
        got = await q.locks.acquire(name, ttl_seconds=30, owner="bench")
        acquire.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await q.locks.renew(name, token=got["token"], ttl_seconds=30, owner="bench")
        renew.append(time.perf_counter() - t0)
    lock = q.lock("bench-guard", ttl_seconds=30)
    await lock.acquire()
    for n in range(tries):
        t0 = time.perf_counter()
        res = await q.transaction().guard(lock).queue("bench-guarded").push(
            [{"data": n}]).commit()
        guarded.append(time.perf_counter() - t0)
        assert res["success"], res
    await lock.release()

    queue = f"bench-timers-{int(time.time())}"
    answers = []
    for n in range(tries):
        c = clients[n % len(clients)]
        answers.append(await c.timers.schedule(queue, f"t{n}", n, delay_ms=50 + (n % 9) * 50))
        await asyncio.sleep(0.005)
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 30
        while True:
            rows = await conn.fetch(
                "SELECT m.transaction_id, m.created_at FROM queen.messages m "
                "JOIN queen.partitions p ON p.id = m.partition_id JOIN queen.queues qq "
                "ON qq.id = p.queue_id WHERE qq.name = $1", queue)
            if len(rows) >= tries or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
    at = {r["transaction_id"]: r["created_at"] for r in rows}
    bad = 0
    lateness = []
    for a in answers:
        due = dt.datetime.fromisoformat(a["deliverAt"].replace("Z", "+00:00"))
        stored = at.get(a["txn"])
        if stored is None or stored < due:
            bad += 1
            continue
        lateness.append((stored - due).total_seconds())
    if len(rows) != len(at):
        bad += 1
    print(_line("lock acquire", acquire))
    print(_line("lock renew", renew))
    print(_line("guarded transaction", guarded))
    print(_line(f"timer lateness ({len(urls)} brokers)", lateness))
    for c in clients:
        await c.close()
    if bad:
        print(f"INVARIANT FAILED: {bad} timer(s) missing, early or duplicated")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=200)
    parser.add_argument("--brokers", type=int, default=3)
    args = parser.parse_args()
    database = start_database()
    brokers = []
    try:
        brokers = start_brokers(database, args.brokers, mesh=False)
        return asyncio.run(measure([b.url for b in brokers], database.dsn, args.tries))
    finally:
        for b in brokers:
            b.stop()
        database.stop()


if __name__ == "__main__":
    sys.exit(main())
