"""The dashboard's State view (#/state) in a real browser: key/value namespaces and one
namespace's keys, held locks with their fencing tokens, pending timers and this broker's
deliveries, each figure made first through the HTTP API and read back off the
page; a change after the page loaded shows without a reload; a READ_ONLY token sees it."""
from __future__ import annotations

import time
import uuid

import httpx
import jwt
import pytest

from tests.browser.conftest import SECRET, screenshot
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def _ops(url: str, path: str, *operations: dict) -> list[dict]:
    """One batch of the state surfaces over HTTP (the official client installs signal
    handlers, which the sync Playwright tests' thread layout does not allow)."""
    r = httpx.post(url + path, json={"operations": list(operations)}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def _timer(queue: str, key: str, delay_ms: int) -> dict:
    return {"op": "schedule", "queue": queue, "timerKey": key, "payload": "MQ==",
            "delayMs": delay_ms}


def _fig(pg, section: str, row: str, field: str) -> str:
    return pg.locator(f'[data-fig="{section}:{row}:{field}"]').inner_text().replace(",", "")


def _open(pg, url: str) -> None:
    pg.goto(f"{url}/#/state")
    pg.wait_for_function("() => document.documentElement.dataset.rendered === '/state'")
    assert "Could not load" not in pg.locator("main").inner_text()


def test_state_view_shows_namespaces_locks_and_timers(dash, page):
    tag = uuid.uuid4().hex[:8]
    ns, lock, queue = f"view-{tag}", f"view-lock-{tag}", f"view-timers-{tag}"

    _ops(dash.url, "/api/v1/kv",
         *({"op": "put", "ns": ns, "key": f"k{n}", "value": {"n": n}, "forever": True}
           for n in range(3)),
         {"op": "put", "ns": ns, "key": "ttl", "value": "x", "ttlSeconds": 3600})
    got = _ops(dash.url, "/api/v1/locks", {"op": "acquire", "name": lock, "ttlSeconds": 300,
                                           "owner": "alice"})[0]
    renewed = _ops(dash.url, "/api/v1/locks", {"op": "renew", "name": lock,
                                               "token": got["token"], "ttlSeconds": 300})[0]
    _ops(dash.url, "/api/v1/timers", *(_timer(queue, f"t{n}", 3_600_000) for n in range(3)))
    _open(page, dash.url)
    assert _fig(page, "kv", ns, "keys") == "4"
    assert _fig(page, "kv", ns, "live") == "4"
    assert _fig(page, "kv", ns, "ttl") == "1"
    assert _fig(page, "kv", ns, "expired") == "0"
    assert _fig(page, "lock", lock, "holders") == "1"
    assert _fig(page, "lock", lock, "lastToken") == str(renewed["token"]) == "2"
    assert _fig(page, "lock", f"{lock}#0", "token") == "2"
    assert _fig(page, "timers", queue, "pending") == "3"
    assert _fig(page, "timers", queue, "overdue") == "0"

    # one namespace's keys, paged by key
    page.locator("#state-kv tr", has_text=ns).click()
    page.wait_for_selector(f'#kv-keys[data-ns="{ns}"]')
    keys = [c.inner_text() for c in page.locator('#kv-keys [data-fig$=":key"]').all()]
    assert keys == ["k0", "k1", "k2", "ttl"]
    assert _fig(page, "key", "k1", "version") == "1"
    screenshot(page, "state-view", docs="dashboard-state")

    # a timer and a second lock after the page loaded: the page follows by itself
    _ops(dash.url, "/api/v1/timers", _timer(queue, "t3", 3_600_000))
    _ops(dash.url, "/api/v1/locks", {"op": "acquire", "name": f"{lock}-b", "ttlSeconds": 300,
                                     "owner": "bob"})
    wait_until(lambda: page.locator(f'[data-fig="lock:{lock}-b:holders"]').count() == 1, 15,
               "the second lock to show")
    wait_until(lambda: _fig(page, "timers", queue, "pending") == "4", 15,
               "the fourth timer to show")
    # this broker's counters are figures too (which broker delivers is PostgreSQL's pick)
    assert _fig(page, "timers", "broker", "delivered").isdigit()


def test_read_only_token_sees_the_state_view(jwt_broker, page):
    now = int(time.time())
    ro = jwt.encode({"sub": "dash-ro", "role": "read-only", "iat": now, "exp": now + 3600},
                    SECRET, algorithm="HS256")
    page.goto(jwt_broker.url + "/#/state")
    page.wait_for_selector("#token-dialog[open]")
    page.locator("#token-input").fill(ro)
    page.locator("#token-submit").click()
    page.wait_for_function("() => document.documentElement.dataset.rendered === '/state'")
    assert "Could not load" not in page.locator("main").inner_text()
    assert page.locator("#state-kv table").count() == 1
    assert page.locator("#state-locks table").count() == 1
    assert page.locator("#state-timers table").count() == 1
