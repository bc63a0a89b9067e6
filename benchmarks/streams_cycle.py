"""Streaming SDK throughput: cycles/s and events/s of a tumbling-window sum.

    .venv/bin/python benchmarks/streams_cycle.py [--partitions 8] [--events 20000]
        [--batch 200] [--runners 2]

One broker on its own PostgreSQL (embedded, or PG_HOST...). ``--events`` events spread over
``--partitions`` partitions are pushed first; then ``--runners`` official-client streams
(queen-mq's ``queen.streams``: event-time 1 s tumbling window, reduce, sink) of one query
consume them. Every popped batch of a partition is one cycle: a state read
(/streams/v1/state/get) and a commit (/streams/v1/cycle: state ops, sink pushes, source
ack in one transaction). Reported: cycles and events per second from the first cycle
until the source group's cursors reach the end, the sink's window count against the
expected one, and the server-side milliseconds per request of the cycle and state/get
routes (the broker's own latency histogram, ``queen_http_request_duration_seconds``:
sum / count over the run, from the request's arrival to its answer). Then ``--direct``
cycles from one client, one at a time (client-side p50/p90 on loopback, server-side mean).
``--paired ROOT`` compares this checkout with another (a revision): two brokers, each on
its own database of one PostgreSQL, run the SDK phase at the same time (``--events 0``:
skipped) and then take the direct cycles in turns, so both see the same machine load.
Timings are for
comparing revisions on one machine, never for the tests.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402
import httpx  # noqa: E402

from _harness import Broker, Database, start_database  # noqa: E402

T0 = 1_800_000_000_000


async def sdk_run(broker: Broker, db: Database, args: argparse.Namespace) -> dict:
    """Push the events, run the official client's streams until the source group's cursors
    reach the end; the figures (``ok``: every event counted, every window sunk)."""
    from queen import Queen
    from queen.streams import Stream

    source = f"bench-src-{uuid.uuid4().hex[:8]}"
    sink = source + "-sink"
    per = args.events // args.partitions
    async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
        for p in range(args.partitions):
            for n in range(0, per, 1000):
                r = await http.post("/api/v1/push", json={"items": [
                    {"queue": source, "partition": f"p{p}",
                     "payload": {"ts": T0 + 10 * i, "amount": 1}}
                    for i in range(n, min(per, n + 1000))]})
                r.raise_for_status()
    windows = args.partitions * ((10 * (per - 1)) // 1000)  # all but each last window
    q = Queen(broker.url)
    stream = (Stream.from_(q.queue(source))
              .window_tumbling(seconds=1, event_time=lambda m: m["data"]["ts"])
              .reduce(lambda acc, v: acc + v["amount"], 0)
              .to(q.queue(sink)))
    conn = await asyncpg.connect(db.dsn)
    group = "streams.bench"
    done_sql = """SELECT coalesce(bool_and(coalesce(l.cursor_seq, 0) = p.last_seq), false)
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        LEFT JOIN queen.log_consumers l ON l.partition_id = p.id AND l.consumer_group = $2
        WHERE q.name = $1"""
    started = time.monotonic()
    runners = [await stream.run(query_id="bench", url=broker.url, batch_size=args.batch,
                                max_partitions=1, max_wait_millis=200)
               for _ in range(args.runners)]
    while not await conn.fetchval(done_sql, source, group):
        if time.monotonic() - started > args.timeout:
            break
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - started
    cycles = sum(r.metrics()["cyclesTotal"] for r in runners)
    events = sum(r.metrics()["messagesTotal"] for r in runners)
    for r in runners:
        await r.stop()
    sunk = await conn.fetchval("""SELECT count(*) FROM queen.messages m
        JOIN queen.partitions p ON p.id = m.partition_id JOIN queen.queues q
        ON q.id = p.queue_id WHERE q.name = $1""", sink)
    await conn.close()
    async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
        server_ms = route_ms((await http.get("/metrics/prometheus")).text)
    with contextlib.redirect_stdout(io.StringIO()):
        await q.close()
    return {"partitions": args.partitions, "events": per * args.partitions,
            "batch": args.batch, "runners": args.runners,
            "seconds": round(elapsed, 2), "cycles": cycles,
            "cycles_per_s": round(cycles / elapsed, 1),
            "events_per_s": round(events / elapsed, 1),
            "sink_windows": sunk, "expected_windows": windows,
            "server_ms_per_request": server_ms,
            "ok": events == per * args.partitions and sunk == windows}


async def run(args: argparse.Namespace) -> int:
    db = start_database()
    broker = None
    try:
        broker = Broker(db)
        result = await sdk_run(broker, db, args)
        if args.direct:
            async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
                result["direct"] = await direct_cycles(http, args.direct)
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] else 1
    finally:
        if broker is not None:
            broker.stop()
        db.stop()


class DirectCycler:
    """Cycles from one client, one at a time, each on a freshly popped batch of 20 (5 state
    upserts, 2 sink pushes, the ack): the cycle request's time at the client (loopback) and
    on the server (the latency histogram's delta over these requests)."""

    def __init__(self, http: httpx.AsyncClient):
        self.http = http
        self.source = f"bench-direct-{uuid.uuid4().hex[:8]}"
        self.group = "streams." + self.source
        self.took: list[float] = []

    async def start(self) -> None:
        self.query = (await self.http.post("/streams/v1/queries", json={
            "name": self.source, "source_queue": self.source,
            "sink_queue": self.source + "-sink", "config_hash": "h"})).json()
        self.before = _cycle_totals((await self.http.get("/metrics/prometheus")).text)

    async def one(self, i: int) -> None:
        http, source = self.http, self.source
        (await http.post("/api/v1/push", json={"items": [
            {"queue": source, "partition": f"p{i % 4}", "payload": {"i": j}}
            for j in range(20)]})).raise_for_status()
        msgs = (await http.get(f"/api/v1/pop/queue/{source}", params={
            "consumerGroup": self.group, "batch": 20, "wait": "false"})).json()["messages"]
        last = msgs[-1]
        body = {"query_id": self.query["query_id"], "partition_id": last["partitionId"],
                "consumer_group": self.group,
                "state_ops": [{"type": "upsert", "key": f"k{k}", "value": {"acc": i}}
                              for k in range(5)],
                "push_items": [{"queue": source + "-sink", "partition": f"p{i % 4}",
                                "payload": {"sum": i, "part": k}} for k in range(2)],
                "ack": {"transactionId": last["transactionId"], "leaseId": last["leaseId"],
                        "status": "completed"}}
        t0 = time.perf_counter()
        r = await http.post("/streams/v1/cycle", json=body)
        self.took.append(1000 * (time.perf_counter() - t0))
        assert r.json()["success"] is True, r.text

    async def result(self) -> dict:
        after = _cycle_totals((await self.http.get("/metrics/prometheus")).text)
        took, n = sorted(self.took), len(self.took)
        return {"cycles": n, "client_ms_p50": round(took[n // 2], 2),
                "client_ms_p90": round(took[(9 * n) // 10], 2),
                "server_ms_mean": round(1000 * (after[0] - self.before[0])
                                        / (after[1] - self.before[1]), 2)}


async def direct_cycles(http: httpx.AsyncClient, n: int) -> dict:
    cycler = DirectCycler(http)
    await cycler.start()
    for i in range(n):
        await cycler.one(i)
    return await cycler.result()


async def paired(args: argparse.Namespace) -> int:
    """``--paired ROOT``: this checkout's broker and ROOT's, each on its own database of one
    PostgreSQL, run the SDK phase at the same time, then take ``--direct`` cycles in turns
    (which goes first alternates), so both see the same machine load; figures side by side."""
    db = start_database()
    other_db = Database(db.host, db.port, db.user, db.password, f"bench_{uuid.uuid4().hex[:8]}")
    admin = await asyncpg.connect(db.dsn)
    await admin.execute(f'CREATE DATABASE "{other_db.db}"')
    brokers: list[Broker] = []
    try:
        brokers.append(Broker(db))
        saved = os.environ.get("BENCH_BROKER_ROOT")
        os.environ["BENCH_BROKER_ROOT"] = args.paired
        try:
            brokers.append(Broker(other_db))
        finally:
            if saved is None:
                os.environ.pop("BENCH_BROKER_ROOT")
            else:
                os.environ["BENCH_BROKER_ROOT"] = saved
        out: dict = {}
        if args.events:
            sdk = await asyncio.gather(sdk_run(brokers[0], db, args),
                                       sdk_run(brokers[1], other_db, args))
            out["sdk"] = {"this": sdk[0], args.paired: sdk[1]}
        async with httpx.AsyncClient(base_url=brokers[0].url, timeout=60) as mine, \
                httpx.AsyncClient(base_url=brokers[1].url, timeout=60) as theirs:
            cyclers = [DirectCycler(mine), DirectCycler(theirs)]
            for c in cyclers:
                await c.start()
                await c.one(-1)  # warm-up: statements prepared, queues made
                c.took.clear()
            for i in range(args.direct):
                for c in (cyclers if i % 2 == 0 else cyclers[::-1]):
                    await c.one(i)
            out["direct"] = {"this": await cyclers[0].result(),
                             args.paired: await cyclers[1].result()}
        print(json.dumps(out, indent=2))
        return 0 if all(r["ok"] for r in out.get("sdk", {}).values()) else 1
    finally:
        for b in brokers:
            b.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{other_db.db}" WITH (FORCE)')
        await admin.close()
        db.stop()


def _cycle_totals(text: str) -> tuple[float, float]:
    """(sum of seconds, count) of the cycle route in the latency histogram."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("queen_http_request_duration_seconds_") and '.cycle"' in line:
            if line.startswith("queen_http_request_duration_seconds_sum{"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("queen_http_request_duration_seconds_count{"):
                count = float(line.rsplit(" ", 1)[1])
    return total, count


def route_ms(text: str) -> dict[str, float]:
    """Mean server-side ms per request of the streams and pop routes, from the broker's
    latency histogram (sum and count per route name)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum{", sums), ("_count{", counts)):
            head = "queen_http_request_duration_seconds" + suffix
            if line.startswith(head):
                route = line[len(head):].split('"')[1]
                into[route] = float(line.rsplit(" ", 1)[1])
    out = {}
    for route, total in sums.items():
        short = route.rsplit(".", 1)[-1]
        if counts.get(route) and ("streams" in route or short.startswith("pop")):
            out[short] = round(1000 * total / counts[route], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--runners", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--direct", type=int, default=200,
                    help="cycles sent one at a time from one client after the SDK run (0: none)")
    ap.add_argument("--paired", metavar="ROOT",
                    help="compare with the broker of checkout ROOT (another revision): the SDK "
                         "phase on both at once, then --direct cycles in turns")
    args = ap.parse_args()
    return asyncio.run(paired(args) if args.paired else run(args))


if __name__ == "__main__":
    sys.exit(main())
