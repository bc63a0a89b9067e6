"""The dashboard's Streams view in a real browser against a real broker: a query made by
real cycles shows with its state size and cycles, as /api/v1/status/streams reports them,
and its page lists the partitions holding its state."""
from __future__ import annotations

import uuid

import httpx
import pytest

from tests.browser.conftest import screenshot
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def _cycle_on(http: httpx.Client, query: dict, source: str, partition: str, keys: list[str]):
    http.post("/api/v1/push", json={"items": [
        {"queue": source, "partition": partition, "payload": {"n": 1}}]}).raise_for_status()
    group = "streams." + query["name"]
    [m] = http.get(f"/api/v1/pop/queue/{source}",
                   params={"consumerGroup": group, "wait": "false"}).json()["messages"]
    body = {"query_id": query["query_id"], "partition_id": m["partitionId"],
            "consumer_group": group,
            "state_ops": [{"type": "upsert", "key": k, "value": {"acc": 1, "pad": "x" * 300}}
                          for k in keys],
            "push_items": [{"queue": source + "-sink", "partition": partition,
                            "payload": {"sum": 1}}],
            "ack": {"transactionId": m["transactionId"], "leaseId": m["leaseId"],
                    "status": "completed"}}
    assert http.post("/streams/v1/cycle", json=body).json()["success"] is True


def shown_bytes(n: int) -> str:
    """The page's rendering of a byte count (views/streams.js ``bytes``)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{n} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def test_streams_view_shows_a_query_with_its_state_size(dash, page):
    source = f"view-{uuid.uuid4().hex[:8]}"
    name = "stream-" + source
    with httpx.Client(base_url=dash.url, timeout=30) as http:
        query = http.post("/streams/v1/queries", json={
            "name": name, "source_queue": source, "sink_queue": source + "-sink",
            "config_hash": "h1"}).json()
        _cycle_on(http, query, source, "big", ["a", "b", "c"])
        _cycle_on(http, query, source, "small", ["z"])
        status = http.get(f"/api/v1/status/streams/{name}").json()

    page.goto(dash.url + "/#/streams")
    page.wait_for_function("() => document.documentElement.dataset.rendered === '/streams'")
    row = page.locator("#streams-list tbody tr", has_text=name)
    wait_until(lambda: row.count() == 1, 15, "the query's row")
    cells = row.locator("td")
    assert cells.nth(1).inner_text() == source
    assert cells.nth(3).inner_text() == "4"                       # state rows
    size = cells.nth(4).locator("span")
    assert size.get_attribute("title") == f"{status['query']['state']['bytes']} bytes"
    assert size.inner_text() == shown_bytes(status["query"]["state"]["bytes"])
    assert cells.nth(5).inner_text() == "2"                       # partitions
    assert cells.nth(6).inner_text() == "2"                       # committed cycles
    assert cells.nth(7).inner_text() != "–"                       # last cycle time
    screenshot(page, "streams", docs="dashboard-streams")

    row.click()
    page.wait_for_function("want => document.documentElement.dataset.rendered === want",
                           arg=f"/streams/{name}")
    assert page.locator("#stream-state-rows").inner_text() == "4"
    parts = page.locator("#stream-partitions tbody tr")
    wait_until(lambda: parts.count() == 2, 10, "two partition rows")
    assert [parts.nth(i).locator("td").nth(1).inner_text() for i in range(2)] == ["big", "small"]
    assert [parts.nth(i).locator("td").nth(2).inner_text() for i in range(2)] == ["3", "1"]
    for i, p in enumerate(status["partitions"]):
        assert parts.nth(i).locator("td").nth(3).locator("span").get_attribute("title") \
            == f"{p['state']['bytes']} bytes"
    screenshot(page, "stream")


def test_an_unknown_stream_shows_an_error_not_a_blank_page(dash, page):
    page.goto(dash.url + "/#/streams/no-such-query")
    page.wait_for_function("() => document.documentElement.dataset.rendered === "
                           "'/streams/no-such-query'")
    assert "no query named" in page.locator("#stream-partitions").inner_text()
    # the browser logs the 404 itself; that one line is expected, nothing else
    assert len(page.problems) == 1 and "404" in page.problems[0], page.problems
    page.problems.clear()
