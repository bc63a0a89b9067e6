"""The dashboard at scale: 1,000 queues with 10 partitions each (10,000 partitions).

    .venv/bin/python benchmarks/dashboard_scale.py [--queues 1000] [--partitions 10] [--runs 5]

Starts an embedded PostgreSQL (or uses PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB, in a
scratch database it drops at the end) and one broker on loopback, creates the queues and
partitions through the broker's own push route (one message per partition, pushes of
1,000 items), pops and acknowledges in a consumer group on a tenth of the queues, and waits
for the stats job to have counted everything. Then it times:

1. the JSON routes each view reads (median and max of ``--runs`` calls, with the size of
   the answer: every one is a page, never the whole table);
2. in headless Chromium (Debian's, by path, as the browser tests), the overview's load:
   from navigation start until the totals show the expected queue and partition counts
   and the throughput chart is drawn (``--runs`` fresh pages; median and max), and the
   same for the queue list and one queue's page.

Exit status 1 when a figure on the page or in the API is wrong. Bounded: at most
``--queues`` x ``--partitions`` rows, everything on 127.0.0.1, everything stopped after.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
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
from tests.browser.chromium import launch  # noqa: E402


def admin(server: Database, statement: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(server.dsn)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()
    asyncio.run(run())


def scratch(server: Database) -> tuple[Database, str]:
    name = f"dash_bench_{uuid.uuid4().hex[:8]}"
    admin(server, f'CREATE DATABASE "{name}"')
    return Database(server.host, server.port, server.user, server.password, name), name


def load(url: str, queues: int, partitions: int) -> list[str]:
    names = [f"bench-q{i:04d}" for i in range(queues)]
    items = [{"queue": q, "partition": f"p{j:02d}", "payload": {"j": j}}
             for q in names for j in range(partitions)]
    with httpx.Client(base_url=url, timeout=120) as http:
        for start in range(0, len(items), 1000):
            r = http.post("/api/v1/push", json={"items": items[start:start + 1000]})
            r.raise_for_status()
        for q in names[::10]:  # a consumer group on a tenth of the queues
            r = http.get(f"/api/v1/pop/queue/{q}", params={"batch": 5, "wait": "false",
                                                            "consumerGroup": "bench"})
            for m in r.json().get("messages", []):
                http.post("/api/v1/ack", json={
                    "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"], "status": "completed", "consumerGroup": "bench"})
    return names


def wait_counted(url: str, queues: int, partitions: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    want = (queues, queues * partitions)
    while time.monotonic() < deadline:
        o = httpx.get(url + "/api/v1/resources/overview", timeout=30).json()
        total = o["messages"]["total"]
        if (o["queues"], o["partitions"]) == want and total == queues * partitions:
            return o
        time.sleep(0.5)
    raise RuntimeError(f"the stats job did not count {want} in {timeout} s (last: {o})")


def time_routes(url: str, queue: str, runs: int) -> list[tuple[str, float, float, int]]:
    routes = ["/api/v1/resources/overview", "/api/v1/live/throughput", "/api/v1/live/cluster",
              "/api/v1/browse/queues?limit=50", "/api/v1/browse/queues?search=q09&limit=50",
              f"/api/v1/browse/queues/{queue}", f"/api/v1/browse/queues/{queue}/partitions",
              f"/api/v1/live/queues/{queue}/depth", "/api/v1/browse/consumer-groups",
              f"/api/v1/browse/consumer-groups/bench/queues/{queue}",
              f"/api/v1/browse/queues/{queue}/partitions/p00/messages"]
    out = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for route in routes:
            times, size = [], 0
            for _ in range(runs):
                t0 = time.perf_counter()
                r = http.get(route)
                times.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise RuntimeError(f"{route}: {r.status_code} {r.text[:200]}")
                size = len(r.content)
            out.append((route, statistics.median(times), max(times), size))
    return out


def time_pages(url: str, queues: int, partitions: int, queue: str, runs: int) -> list:
    from playwright.sync_api import sync_playwright

    def text_is(selector: str, value: str) -> str:
        return f"document.querySelector({selector!r})?.textContent === {value!r}"

    checks = {
        "overview (#/)": ("/", " && ".join([
            text_is("#total-queues", f"{queues:,}"),
            text_is("#total-partitions", f"{queues * partitions:,}"),
            "!!document.querySelector('#throughput-chart canvas')"])),
        "queue list (#/queues)": ("/#/queues",
                                  "document.querySelectorAll('#queue-list tbody tr').length === 50"),
        f"queue page (#/queues/{queue})": (f"/#/queues/{queue}",
                                           f"document.querySelectorAll('#partition-list tbody tr')"
                                           f".length === {min(partitions, 100)}"),
    }
    results = []
    with sync_playwright() as p:
        browser = launch(p)
        try:
            for label, (path, condition) in checks.items():
                times = []
                for _ in range(runs):
                    context = browser.new_context(viewport={"width": 1280, "height": 900})
                    page = context.new_page()
                    errors: list[str] = []
                    page.on("console", lambda m, e=errors: e.append(m.text)
                            if m.type == "error" else None)
                    t0 = time.perf_counter()
                    page.goto(url + path)
                    page.wait_for_function(condition, timeout=60_000, polling=10)
                    times.append((time.perf_counter() - t0) * 1000)
                    context.close()
                    if errors:
                        raise RuntimeError(f"{label}: console errors {errors}")
                results.append((label, statistics.median(times), max(times)))
        finally:
            browser.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if not 1 <= args.queues <= 5000 or not 1 <= args.partitions <= 100:
        ap.error("bounded: --queues 1..5000, --partitions 1..100")
    server = start_database()
    db, name = scratch(server)
    broker = None
    try:
        broker = Broker(db, STATS_INTERVAL_MS="2000", LOG_LEVEL="WARNING")
        t0 = time.perf_counter()
        names = load(broker.url, args.queues, args.partitions)
        print(f"created {args.queues} queues x {args.partitions} partitions "
              f"({args.queues * args.partitions} messages) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        wait_counted(broker.url, args.queues, args.partitions)
        print(f"stats job counted them {time.perf_counter() - t0:.1f} s later")
        queue = names[0]
        print(f"\nJSON routes ({args.runs} calls each)")
        print(f"{'route':64} {'median ms':>10} {'max ms':>8} {'bytes':>8}")
        for route, med, worst, size in time_routes(broker.url, queue, args.runs):
            print(f"{route:64} {med:10.1f} {worst:8.1f} {size:8d}")
        print(f"\nPages in headless Chromium ({args.runs} fresh pages each; until the figures show)")
        print(f"{'page':40} {'median ms':>10} {'max ms':>8}")
        for label, med, worst in time_pages(broker.url, args.queues, args.partitions, queue,
                                            args.runs):
            print(f"{label:40} {med:10.1f} {worst:8.1f}")
        return 0
    finally:
        if broker is not None:
            broker.stop()
        admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
