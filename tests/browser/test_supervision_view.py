"""The dashboard's Supervision view in a real browser against a real broker: a consumer of
the official client started with ``.supervision({"group": ...})`` shows with its host, pid,
queue, workers and completed handler calls as /api/v1/status/supervision reports them,
turns to stopped when it stops (the page refreshes itself), and a forged publication beside
it shows as invalid with its problem instead of breaking the page."""
from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import httpx
import pytest

from tests.browser.conftest import screenshot
from tests.conftest import ROOT
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


CONSUMER = """
import asyncio, sys
from queen import Queen

async def main(url, queue, group):
    client = Queen(url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_reader(sys.stdin, stop.set)  # a line or EOF: stop

    async def handler(message):
        pass

    await (client.queue(queue).batch(1).timeout_millis(500)
           .supervision({"group": group}).consume(handler, signal=stop))
    await client.close()

asyncio.run(main(*sys.argv[1:]))
"""
"""A supervised consume() of the official client in a process of its own (the browser
tests are synchronous, and the client wants the main thread), stopped by closing its
stdin."""


def test_supervision_view_shows_a_supervised_consumer(dash, page):
    queue = f"sv-view-{uuid.uuid4().hex[:8]}"
    group = f"billing-{uuid.uuid4().hex[:6]}"
    forged = f"forged-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=dash.url, timeout=30) as http:
        http.post("/api/v1/push", json={"items": [
            {"queue": queue, "payload": {"n": n}} for n in range(2)]}).raise_for_status()
        bad_instance = uuid.uuid4().hex
        http.post("/api/v1/kv", json={"operations": [
            {"op": "put", "ns": "queen-supervisor", "key": f"{forged}/{bad_instance}/head",
             "ttlSeconds": 60, "value": {"format": "queen.supervisor.remote-status/v1",
                                         "write": "0" * 32, "chunks": 1, "bytes": 5}},
            {"op": "put", "ns": "queen-supervisor", "key": f"{forged}/{bad_instance}/chunk/0000",
             "ttlSeconds": 60, "value": {"write": "0" * 32, "index": 0, "data": "%%%"}},
        ]}).raise_for_status()

        def instance():
            body = http.get("/api/v1/status/supervision", params={"group": group}).json()
            found = [i for g in body["groups"] for i in g["instances"]]
            return found[0] if found and found[0]["pools"] else None

        consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, dash.url, queue, group],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    cwd=ROOT)
        try:
            # the first status is published at start; the handled calls ride the next one
            status = wait_until(lambda: (i := instance()) and i["pools"][0]["completed"] == 2
                                and i, 40, "a status with two completed calls", interval=0.3)
            key = status["key"]

            page.goto(dash.url + "/#/supervision")
            page.wait_for_function(
                "() => document.documentElement.dataset.rendered === '/supervision'")
            cell = lambda field: page.locator(f'[data-fig="sv:{key}:{field}"]')  # noqa: E731
            wait_until(lambda: cell("state").count() == 1, 15, "the consumer's row")
            assert cell("state").inner_text() == "running"
            assert cell("host").inner_text() == socket.gethostname()
            assert cell("pid").inner_text() == str(consumer.pid)
            assert cell("queue").inner_text() == queue
            assert cell("workers").inner_text() == "1 / 1"
            assert cell("completed").inner_text() == "2"
            assert cell("failed").inner_text() == "0"
            section = page.locator(f'section[data-group="{group}"]')
            assert "queue mode" in section.inner_text()
            bad = page.locator(f'[data-fig="sv:{forged}/{bad_instance}/head:state"]')
            assert bad.inner_text() == "invalid"
            assert bad.get_attribute("title") == "chunk 0's data is not base64"
            assert page.locator(f'[data-fig="sv:{forged}/{bad_instance}/head:problem"]') \
                .inner_text() == "chunk 0's data is not base64"
            screenshot(page, "supervision")
        finally:
            assert consumer.stdin is not None
            consumer.stdin.close()
            assert consumer.wait(30) == 0

    # the view refreshes itself every 5 s: the stopped status shows without a reload
    wait_until(lambda: cell("state").inner_text() == "stopped", 20, "the consumer stopped",
               interval=0.2)
    assert cell("workers").inner_text() == "0 / 1"
    assert "stopped" in page.locator("#supervision-summary").inner_text()
