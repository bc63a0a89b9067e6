"""The dashboard in a real browser against a real broker: each test does something on the
page and checks its effect through the public JSON routes (or the reverse), so a page that
shows wrong numbers, or a button that does nothing, fails. Every page must stay free of
console errors (the ``page`` fixture checks)."""
from __future__ import annotations

import re
import time
import uuid

import httpx
import jwt
import pytest

from tests.browser.conftest import SECRET, screenshot
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def push(url: str, queue: str, partitions: list[str], per_partition: int = 1,
         headers: dict | None = None) -> list[dict]:
    items = [{"queue": queue, "partition": p, "payload": {"p": p, "i": i}}
             for p in partitions for i in range(per_partition)]
    r = httpx.post(url + "/api/v1/push", json={"items": items}, headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()


def pop(url: str, queue: str, batch: int, group: str | None = None) -> dict:
    params = {"batch": batch, "wait": "false"}
    if group:
        params["consumerGroup"] = group
    r = httpx.get(f"{url}/api/v1/pop/queue/{queue}", params=params, timeout=30)
    r.raise_for_status()
    return r.json() if r.content else {"messages": []}


def ack(url: str, message: dict, status: str, group: str | None = None, error: str = "") -> None:
    body = {"transactionId": message["transactionId"], "partitionId": message["partitionId"],
            "leaseId": message["leaseId"], "status": status, "error": error}
    if group:
        body["consumerGroup"] = group
    httpx.post(url + "/api/v1/ack", json=body, timeout=30).raise_for_status()


def number(pg, selector: str) -> int | None:
    text = pg.locator(selector).inner_text().replace(",", "").strip()
    return int(text) if text.isdigit() else None


def overview(url: str) -> dict:
    return httpx.get(url + "/api/v1/resources/overview", timeout=30).json()


def confirm(pg) -> None:
    pg.locator("#confirm-ok").click()


# -- overview ---------------------------------------------------------------------------------

def test_overview_shows_the_totals_of_what_was_pushed(dash, page):
    """Queues, partitions and pending on the page grow by exactly what was pushed, and
    the throughput panel counts the pushes (the figures are the API's)."""
    before = overview(dash.url)
    queues = [name("ov") for _ in range(3)]
    for i, q in enumerate(queues):  # 1, 2 and 3 partitions with 2 messages each
        push(dash.url, q, [f"p{j}" for j in range(i + 1)], per_partition=2)
    want = {"queues": before["queues"] + 3, "partitions": before["partitions"] + 6,
            "pending": before["messages"]["pending"] + 12}

    page.goto(dash.url + "/")
    wait_until(lambda: (number(page, "#total-queues"), number(page, "#total-partitions"),
                        number(page, "#total-pending"))
               == (want["queues"], want["partitions"], want["pending"]), 30,
               f"overview totals {want}")
    api = overview(dash.url)
    assert (api["queues"], api["partitions"], api["messages"]["pending"]) == \
        (want["queues"], want["partitions"], want["pending"])
    # the per-second series has the 12 pushes (through this broker, last 15 minutes)
    sums = page.locator("#throughput-sums")
    wait_until(lambda: int(re.search(r"([\d,]+) pushed", sums.inner_text()).group(1)
                           .replace(",", "")) >= 12, 10, "12 pushes in the throughput panel")
    assert page.locator("#throughput-chart canvas").count() == 1
    assert "push maintenance: off" in page.locator("#cluster").inner_text()
    screenshot(page, "overview", docs="dashboard-overview")


def test_overview_updates_without_a_reload(dash, page):
    page.goto(dash.url + "/")
    wait_until(lambda: number(page, "#total-queues") is not None, 15, "totals shown")
    shown = number(page, "#total-queues")
    push(dash.url, name("live"), ["Default"])
    wait_until(lambda: number(page, "#total-queues") == shown + 1, 10,
               "the new queue counted without a reload")


# -- queues -----------------------------------------------------------------------------------

def test_queue_page_lists_its_partitions(dash, page):
    q = name("parts")
    partitions = [f"part-{i}" for i in range(5)]
    push(dash.url, q, partitions, per_partition=2)
    pop(dash.url, q, 1)  # one partition's message in flight: a lease shows

    page.goto(dash.url + "/#/queues")
    page.locator("#queue-search").fill(q)
    wait_until(lambda: page.locator("#queue-list tbody tr").count() == 1
               and q in page.locator("#queue-list tbody").inner_text(), 15,
               "the search leaves only the queue")
    page.locator("#queue-list tbody tr").first.click()
    page.wait_for_selector("#partition-list tbody tr")
    rows = page.locator("#partition-list tbody tr")
    wait_until(lambda: rows.count() == 5, 10, "five partition rows")
    names = [rows.nth(i).locator("td").first.inner_text() for i in range(5)]
    assert names == partitions
    api = httpx.get(f"{dash.url}/api/v1/browse/queues/{q}/partitions").json()
    for i, p in enumerate(api["partitions"]):
        cells = rows.nth(i).locator("td")
        assert int(cells.nth(1).inner_text()) == p["messages"]["pending"]
        assert int(cells.nth(2).inner_text()) == p["messages"]["processing"]
    assert sum(p["messages"]["processing"] for p in api["partitions"]) == 1
    assert page.locator("#opt-retryLimit").input_value() == "3"
    # the depth history reaches the stats job's count of the queue: 9 pending (1 in flight)
    wait_until(lambda: httpx.get(f"{dash.url}/api/v1/live/queues/{q}/depth").json()
               ["pending"][-1:] == [9], 15, "a depth sample of 9")
    wait_until(lambda: page.locator("#depth-chart canvas").count() == 1
               and "now 9." in page.locator("main").inner_text(), 15, "the depth chart drawn")
    screenshot(page, "queue")


def test_queue_configuration_saved_from_the_page(dash, page):
    q = name("conf")
    push(dash.url, q, ["Default"])
    page.goto(f"{dash.url}/#/queues/{q}")
    page.locator("#opt-retryLimit").fill("7")
    page.locator("#config-save").click()
    wait_until(lambda: httpx.get(f"{dash.url}/api/v1/browse/queues/{q}").json()
               ["options"]["retryLimit"] == 7, 10, "retryLimit stored")
    options = {o["name"] for o in httpx.get(f"{dash.url}/api/v1/browse/queues/{q}").json()
               ["supportedOptions"]}
    assert {page.locator(f"#opt-{o}").count() for o in options} == {1}


# -- dead letters -----------------------------------------------------------------------------

def test_dead_letter_retried_from_the_page_reappears_in_its_queue(dash, page):
    q = name("dlq")
    push(dash.url, q, ["Default"])
    msg = pop(dash.url, q, 1)["messages"][0]
    ack(dash.url, msg, "dlq", error="boom from the test")
    wait_until(lambda: httpx.get(dash.url + "/api/v1/dlq", params={"queue": q}).json()
               ["messages"], 10, "the message dead-lettered")

    page.goto(f"{dash.url}/#/dlq?queue={q}")
    row = page.locator("#dlq-list tbody tr", has_text=msg["transactionId"])
    row.click()
    assert "boom from the test" in page.locator("#dlq-error").inner_text()
    assert '"p": "Default"' in page.locator("#dlq-payload").inner_text()
    row.locator(".dlq-select").check()
    page.locator("#dlq-retry-selected").click()
    confirm(page)
    wait_until(lambda: not httpx.get(dash.url + "/api/v1/dlq", params={"queue": q})
               .json()["messages"], 10, "the dead letter gone after the retry")
    again = pop(dash.url, q, 10)["messages"]
    assert [m["data"] for m in again] == [msg["data"]], "the retried message is back in its queue"
    wait_until(lambda: "No dead letters." in page.locator("#dlq-list").inner_text(), 10,
               "the list reloaded")


# -- consumer groups --------------------------------------------------------------------------

def test_seek_from_the_page_moves_the_groups_cursor(dash, page):
    q, group = name("seek"), name("grp")
    push(dash.url, q, ["Default"], per_partition=5)
    batch = pop(dash.url, q, 5, group)["messages"]
    assert len(batch) == 5
    for m in batch:
        ack(dash.url, m, "completed", group)

    def cursor() -> int:
        body = httpx.get(f"{dash.url}/api/v1/consumer-groups/{group}").json()
        return body[q]["partitions"][0]["cursor"]

    assert cursor() == 5
    page.goto(f"{dash.url}/#/groups?search={group}")
    page.locator("#group-list tbody tr", has_text=q).click()
    page.wait_for_selector("#group-lag tbody tr")
    page.locator("#seek-start").click()
    confirm(page)
    wait_until(lambda: cursor() == 0, 10, "the cursor back at the start")
    wait_until(lambda: page.locator("#group-lag tbody tr td").nth(3).inner_text() == "5", 10,
               "the page shows a lag of 5")
    page.locator("#seek-end").click()
    confirm(page)
    wait_until(lambda: cursor() == 5, 10, "the cursor at the end")


def test_group_deleted_from_the_page_only_after_confirmation(dash, page):
    q, group = name("del"), name("grp")
    push(dash.url, q, ["Default"])
    ack(dash.url, pop(dash.url, q, 1, group)["messages"][0], "completed", group)
    page.goto(f"{dash.url}/#/groups/{group}/{q}")
    page.wait_for_selector("#group-lag tbody tr")
    page.locator("#group-delete").click()
    page.locator("#confirm-cancel").click()
    assert q in httpx.get(f"{dash.url}/api/v1/consumer-groups/{group}").json()
    page.locator("#group-delete").click()
    confirm(page)
    wait_until(lambda: q not in httpx.get(f"{dash.url}/api/v1/consumer-groups/{group}").json(),
               10, "the group's cursors deleted")


# -- messages ---------------------------------------------------------------------------------

def test_browse_a_partition_from_a_position_and_open_a_message(dash, page):
    q = name("msgs")
    push(dash.url, q, ["Default"], per_partition=6)
    page.goto(f"{dash.url}/#/messages?queue={q}&partition=Default&fromPosition=4")
    rows = page.locator("#message-list tbody tr")
    wait_until(lambda: rows.count() == 3, 10, "positions 4, 5 and 6")
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(3)] == ["4", "5", "6"]
    fourth = httpx.get(f"{dash.url}/api/v1/browse/queues/{q}/partitions/Default/messages",
                       params={"fromPosition": 4, "limit": 1}).json()["messages"][0]
    r = httpx.post(dash.url + "/api/v1/traces", json={
        "transactionId": fourth["transactionId"], "partitionId": fourth["partitionId"],
        "eventType": "step", "data": {"text": "charged the card"}, "traceNames": ["order-77"]})
    assert r.status_code in (200, 201), r.text
    rows.first.locator("a").click()
    page.wait_for_selector("#message-payload")
    assert '"i": 3' in page.locator("#message-payload").inner_text()
    assert page.locator("#message-status").inner_text() == "pending"
    trace = page.locator("#message-trace")
    assert "charged the card" in trace.inner_text() and "order-77" in trace.inner_text()


# -- maintenance ------------------------------------------------------------------------------

def test_push_maintenance_switched_on_from_the_page_buffers_pushes(dash, page):
    q = name("maint")
    page.goto(f"{dash.url}/#/maintenance")
    try:
        page.locator("#mode-push-toggle").click()
        confirm(page)
        wait_until(lambda: page.locator("#mode-push-state").inner_text() == "ON", 10,
                   "the page shows push maintenance on")
        assert httpx.get(dash.url + "/api/v1/system/maintenance").json()["maintenanceMode"]
        assert [r["status"] for r in push(dash.url, q, ["Default"])] == ["buffered"]
        page.locator("#mode-push-toggle").click()
        confirm(page)
        wait_until(lambda: page.locator("#mode-push-state").inner_text() == "off", 10,
                   "the page shows push maintenance off")
        # The drain's own line: staged pushes, this broker's merge rate, time to empty.
        staging = page.locator("#staging").inner_text()
        assert staging.startswith("Staged in PostgreSQL (cluster-wide): "), staging
        assert "/s here" in staging, staging
    finally:
        httpx.post(dash.url + "/api/v1/system/maintenance", json={"enabled": False})
    wait_until(lambda: httpx.get(f"{dash.url}/api/v1/browse/queues/{q}/partitions").status_code
               == 200, 30, "the buffered push replayed into PostgreSQL")


def test_a_silent_spool_is_shown_and_released_from_the_maintenance_page(dash, dash_database,
                                                                        page):
    """A spool silent for ten minutes, registered through the store's own function: the page
    lists it with its partitions and the count of partitions silent spools hold; its Release
    button deletes its holds (the listing route no longer has it)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import asyncpg

    from broker.store.db import Store, now_us

    spool = name("dash-gone")

    async def fabricate() -> None:
        store = await Store.connect(dash_database.dsn, pool_size=1, connect_timeout_ms=5000,
                                    statement_timeout_ms=30000, lock_timeout_ms=10000,
                                    idle_timeout_ms=30000)
        try:
            store.server_id = spool
            await store.register_spool({(f"{spool}-q", "a"): now_us(),
                                        (f"{spool}-q", "b"): now_us()})
        finally:
            await store.close()
        conn = await asyncpg.connect(dash_database.dsn)
        try:
            await conn.execute("UPDATE queen.spool_servers SET seen_at = now() - interval "
                               "'10 minutes' WHERE server_id = $1", spool)
        finally:
            await conn.close()

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        pool.submit(asyncio.run, fabricate()).result()
    page.goto(f"{dash.url}/#/maintenance")
    row = page.locator("#spool-holds tbody tr", has_text=spool)
    wait_until(lambda: row.count() == 1, 10, "the silent spool listed")
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert cells[:3] == [spool, "silent", "2"], cells
    summary = page.locator("#spool-holds-summary").inner_text()
    assert re.search(r"\b2 partition\(s\) held by 1 silent spool", summary), summary
    screenshot(page, "maintenance-spool-holds")
    page.locator(f"#spool-holds button[data-spool='{spool}']").click()
    confirm(page)
    wait_until(lambda: spool not in [s["spool"] for s in httpx.get(
        dash.url + "/api/v1/system/spools", timeout=10).json()["spools"]], 10,
        "the spool released")
    wait_until(lambda: row.count() == 0, 10, "the released spool gone from the page")


# -- auth -------------------------------------------------------------------------------------

def token(role: str) -> str:
    now = int(time.time())
    return jwt.encode({"sub": f"dash-{role}", "role": role, "iat": now, "exp": now + 3600},
                      SECRET, algorithm="HS256")


WRITE_WORDS = re.compile(r"\b(Save|Seek|Retry|Discard|Delete|Switch)\b")


def login(pg, url: str, role: str) -> None:
    pg.goto(url + "/")
    pg.wait_for_selector("#token-dialog[open]")
    pg.locator("#token-input").fill(token(role))
    pg.locator("#token-submit").click()
    pg.wait_for_selector("#total-queues")


def visible_write_buttons(pg) -> list[str]:
    return [b.inner_text() for b in pg.locator("button:visible").all()
            if WRITE_WORDS.search(b.inner_text())]


def test_read_only_token_sees_no_write_buttons(jwt_broker, page):
    url = jwt_broker.url
    rw = {"Authorization": f"Bearer {token('admin')}"}
    q, group = name("ro"), name("grp")
    push(url, q, ["Default"], per_partition=2, headers=rw)
    r = httpx.get(f"{url}/api/v1/pop/queue/{q}", params={"batch": 1, "wait": "false",
                                                           "consumerGroup": group}, headers=rw)
    m = r.json()["messages"][0]
    httpx.post(url + "/api/v1/ack", headers=rw, json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "leaseId": m["leaseId"], "status": "dlq", "consumerGroup": group}).raise_for_status()

    login(page, url, "read-only")
    assert "READ_ONLY" in page.locator("#whoami").inner_text()
    assert not page.locator("a[data-nav=maintenance]").is_visible()
    for route, ready in ((f"#/queues/{q}", "#partition-list tbody tr"),
                         (f"#/groups/{group}/{q}", "#group-lag tbody tr"),
                         (f"#/dlq?queue={q}", "#dlq-list tbody tr"),
                         ("#/", "#total-queues")):
        page.goto(f"{url}/{route}")
        page.wait_for_selector(ready)
        assert page.locator("#token-dialog[open]").count() == 0, "the token was asked only once"
        assert visible_write_buttons(page) == [], route
        assert page.locator("[data-needs]:visible").count() == 0, route
    # the token lives in this tab's sessionStorage only
    assert page.evaluate("() => Object.keys(localStorage).length") == 0
    assert page.evaluate("() => sessionStorage.length") == 1


def test_admin_token_sees_the_write_buttons(jwt_broker, page):
    """The other side of the read-only test: the same pages with an admin token do show them."""
    url = jwt_broker.url
    login(page, url, "admin")
    page.goto(f"{url}/#/dlq")
    page.wait_for_selector("#dlq-retry-selected")
    assert {"Retry selected", "Discard selected"} <= set(visible_write_buttons(page))
    page.goto(f"{url}/#/maintenance")
    page.wait_for_selector("#mode-push-toggle")


def test_a_refused_token_is_asked_for_again(jwt_broker, page):
    page.goto(jwt_broker.url + "/")
    page.wait_for_selector("#token-dialog[open]")
    page.locator("#token-input").fill("not-a-token")
    page.locator("#token-submit").click()
    page.wait_for_selector("#token-dialog[open]")
    assert "Malformed token" in page.locator("#token-error").inner_text()


# -- every page -------------------------------------------------------------------------------

def test_every_page_loads_without_console_errors(dash, page):
    q, group = name("all"), name("grp")
    push(dash.url, q, ["a", "b"], per_partition=2)
    m = pop(dash.url, q, 1, group)["messages"][0]
    ack(dash.url, m, "dlq", group)
    routes = ["#/", "#/queues", f"#/queues/{q}", "#/groups", f"#/groups/{group}/{q}", "#/dlq",
              f"#/messages?queue={q}&partition=a", f"#/messages/{m['partitionId']}/{m['transactionId']}",
              "#/maintenance", "#/streams", "#/state", "#/no-such-page"]
    for route in routes:
        page.goto(f"{dash.url}/{route}")
        # the view has rendered once (its first data loaded); a hash change is no navigation
        page.wait_for_function("want => document.documentElement.dataset.rendered === want",
                               arg=route[1:])
        assert "Could not load" not in page.locator("main").inner_text(), route
    assert page.locator("h1").inner_text() == "Not found"
    assert page.problems == []
