"""Regenerate docs/dashboard.png, the screenshot of the overview on docs/operations/dashboard.md.

    .venv/bin/python docs/screenshot.py

Starts a broker on loopback (embedded PostgreSQL in a temporary directory, or PG_* as the
benchmarks do), runs a small producer and consumer against it for about a minute so the
throughput chart has a shape, then photographs the overview in headless Chromium.

That page's other pictures (docs/dashboard-overview.png, -streams.png, -state.png) are taken
by the browser tests: ``QUEEN_SCREENSHOTS=docs python3 dev.py test tests/browser``.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))
sys.path.insert(0, str(HERE.parent))

import httpx  # noqa: E402

from _harness import Broker, start_database  # noqa: E402
from tests.browser.chromium import launch  # noqa: E402

SECONDS = 60


def produce(url: str, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        i = 0
        while not stop.is_set():
            n = 20 + 15 * ((i // 10) % 3)
            http.post("/api/v1/push", json={"items": [
                {"queue": q, "partition": f"p{k % 4}", "payload": {"order": i, "k": k}}
                for q in ("orders", "payments", "emails") for k in range(n // 3)]})
            i += 1
            time.sleep(0.5)


def consume(url: str, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            for q in ("orders", "payments"):
                r = http.get(f"/api/v1/pop/queue/{q}", params={"batch": 20, "wait": "false",
                                                                "consumerGroup": "billing"})
                for m in (r.json() if r.content else {}).get("messages", []):
                    status = "dlq" if m["data"].get("k") == 7 and q == "payments" else "completed"
                    http.post("/api/v1/ack", json={
                        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                        "leaseId": m["leaseId"], "status": status, "consumerGroup": "billing",
                        "error": "card declined" if status == "dlq" else None})
            time.sleep(0.3)


def main() -> None:
    from playwright.sync_api import sync_playwright
    db = start_database()
    broker = Broker(db, STATS_INTERVAL_MS="2000")
    stop = threading.Event()
    workers = [threading.Thread(target=f, args=(broker.url, stop)) for f in (produce, consume)]
    try:
        for w in workers:
            w.start()
        time.sleep(SECONDS)
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(broker.url + "/")
            page.wait_for_selector("#throughput-chart canvas")
            page.wait_for_timeout(2500)
            page.screenshot(path=str(HERE / "dashboard.png"), full_page=True)
            browser.close()
    finally:
        stop.set()
        for w in workers:
            w.join()
        broker.stop()
        db.stop()


if __name__ == "__main__":
    main()
