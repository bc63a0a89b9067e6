"""Operator views of key/value, locks and timers: the routes
``/api/v1/resources/kv/namespaces``, ``kv/list``, ``/api/v1/resources/locks``,
``/api/v1/resources/timers``, and the state families of ``/metrics/prometheus``, with
exact figures from a scenario made through the official client on a broker of its own
database (so no other test's keys, locks or timers are counted, and its retention job,
set to run once an hour, does not sweep the expired rows the figures count)."""
from __future__ import annotations

import contextlib
import io
import json
import math

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import start_broker
from tests.waiting import wait_until_async

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def scene(fresh_database, tmp_path):
    """A broker alone on an empty database, an official client on it, and a
    connection to that database (for the stuck-sweeper stand-in)."""
    from queen import Queen
    broker = start_broker(fresh_database, tmp_path, RETENTION_INTERVAL="3600000")
    client = Queen(broker.url)
    conn = await asyncpg.connect(fresh_database.dsn)
    try:
        yield broker, client, conn
    finally:
        await conn.close()
        with contextlib.redirect_stdout(io.StringIO()):
            await client.close()
        broker.stop()


async def _kv_scene(client) -> None:
    """alpha: 3 keys forever; beta: 2 keys with an hour's TTL and one with 1 s (left to
    expire); gamma: 2 keys of which one deleted."""
    kv = client.kv
    for n in range(3):
        await kv.put("ops-alpha", f"k{n}", {"n": n}, forever=True)
    await kv.put("ops-beta", "b0", "x", ttl_seconds=3600)
    await kv.put("ops-beta", "b1", "yy", ttl_seconds=3600)
    await kv.put("ops-beta", "short", 1, ttl_seconds=1)
    await kv.put("ops-gamma", "g0", [1, 2], forever=True)
    await kv.put("ops-gamma", "g1", True, forever=True)
    assert (await kv.delete("ops-gamma", "g1"))["applied"]


async def _get(url: str, path: str, **params) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=30) as h:
        r = await h.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def _post(url: str, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as h:
        return await h.post(path, json=body)


async def test_kv_namespaces_and_listing_count_exactly(scene):
    """Each namespace's keys (live + expired), live keys, keys with a TTL, expired and
    deleted rows awaiting the sweep, and live bytes; the listing pages by key, hides
    expired rows unless asked, and says which are expired by the database's clock."""
    broker, client, _conn = scene
    await _kv_scene(client)

    async def short_expired():
        got = await _get(broker.url, "/api/v1/resources/kv/namespaces")
        beta = next(n for n in got["namespaces"] if n["namespace"] == "ops-beta")
        return got if beta["expired"] == 1 else None

    got = await wait_until_async(short_expired, 10, "the 1 s key to expire")
    by_ns = {n["namespace"]: n for n in got["namespaces"]}
    assert list(by_ns) == ["ops-alpha", "ops-beta", "ops-gamma"]  # byte order, nothing else
    assert by_ns["ops-alpha"] == {"namespace": "ops-alpha", "keys": 3, "liveKeys": 3,
                                  "withTtl": 0, "expired": 0, "deleted": 0,
                                  "bytes": 3 * len('{"n": 0}')}
    assert by_ns["ops-beta"] == {"namespace": "ops-beta", "keys": 3, "liveKeys": 2,
                                 "withTtl": 2, "expired": 1, "deleted": 0,
                                 "bytes": len('"x"') + len('"yy"')}
    assert by_ns["ops-gamma"] == {"namespace": "ops-gamma", "keys": 1, "liveKeys": 1,
                                  "withTtl": 0, "expired": 0, "deleted": 1,
                                  "bytes": len("[1, 2]")}

    live = (await _post(broker.url, "/api/v1/resources/kv/list",
                        {"namespace": "ops-beta"})).json()
    assert [r["key"] for r in live["rows"]] == ["b0", "b1"]
    assert live["truncated"] is False and live["nextAfter"] is None
    assert [r["value"] for r in live["rows"]] == ["x", "yy"]
    every = (await _post(broker.url, "/api/v1/resources/kv/list",
                         {"namespace": "ops-beta", "includeExpired": True,
                          "keysOnly": True})).json()
    assert [(r["key"], r["expired"]) for r in every["rows"]] == [
        ("b0", False), ("b1", False), ("short", True)]
    assert all("value" not in r for r in every["rows"])

    first = (await _post(broker.url, "/api/v1/resources/kv/list",
                         {"namespace": "ops-alpha", "limit": 2})).json()
    assert [r["key"] for r in first["rows"]] == ["k0", "k1"]
    assert first["truncated"] is True and first["nextAfter"] == "k1"
    rest = (await _post(broker.url, "/api/v1/resources/kv/list",
                        {"namespace": "ops-alpha", "after": first["nextAfter"],
                         "limit": 2})).json()
    assert [r["key"] for r in rest["rows"]] == ["k2"] and rest["truncated"] is False
    prefixed = (await _post(broker.url, "/api/v1/resources/kv/list",
                            {"namespace": "ops-alpha", "prefix": "k1"})).json()
    assert [(r["key"], r["version"], r["value"]) for r in prefixed["rows"]] == [
        ("k1", 1, {"n": 1})]


async def _lock_scene(client) -> dict:
    """A lock held with token 2 (acquired, renewed), a semaphore of 3 with 2 holders
    (tokens 1 and 2), a lock taken and released (not held), one refused acquire."""
    locks = client.locks
    held = await locks.acquire("ops-lock", ttl_seconds=300, owner="alice")
    assert held["token"] == 1
    renewed = await locks.renew("ops-lock", token=held["token"], ttl_seconds=300)
    assert renewed["renewed"] and renewed["token"] == 2
    refused = await locks.acquire("ops-lock", ttl_seconds=300, owner="bob")
    assert refused["acquired"] is False
    s1 = await locks.acquire("ops-sem", ttl_seconds=300, owner="w1", limit=3)
    s2 = await locks.acquire("ops-sem", ttl_seconds=300, owner="w2", limit=3)
    freed = await locks.acquire("ops-free", ttl_seconds=300, owner="carol")
    assert (await locks.release("ops-free", token=freed["token"]))["released"]
    return {"lock": renewed, "sem": [s1, s2]}


async def test_locks_view_shows_holders_tokens_and_expiry(scene):
    """Held locks only, in name order, each permit with its owner, token and expiry,
    and the fence's last token; the totals count the cluster."""
    broker, client, _conn = scene
    made = await _lock_scene(client)
    got = await _get(broker.url, "/api/v1/resources/locks")
    assert (got["locksHeld"], got["permitsHeld"], got["truncated"]) == (2, 3, False)
    assert [lk["name"] for lk in got["locks"]] == ["ops-lock", "ops-sem"]
    lock, sem = got["locks"]
    assert (lock["lastToken"], lock["holders"]) == (2, 1)
    assert [(p["slot"], p["owner"], p["token"]) for p in lock["permits"]] == [(0, "alice", 2)]
    assert lock["permits"][0]["expiresAt"] == made["lock"]["expiresAt"] == lock["expiresAt"]
    assert (sem["lastToken"], sem["holders"]) == (2, 2)
    assert [(p["slot"], p["owner"], p["token"]) for p in sem["permits"]] == [
        (0, "w1", 1), (1, "w2", 2)]
    assert [p["expiresAt"] for p in sem["permits"]] == [s["expiresAt"] for s in made["sem"]]

    page = await _get(broker.url, "/api/v1/resources/locks", limit="1")
    assert [lk["name"] for lk in page["locks"]] == ["ops-lock"]
    assert page["truncated"] is True and page["nextAfter"] == "ops-lock"
    after = await _get(broker.url, "/api/v1/resources/locks", after="ops-lock")
    assert [lk["name"] for lk in after["locks"]] == ["ops-sem"]
    only = await _get(broker.url, "/api/v1/resources/locks", prefix="ops-s")
    assert [lk["name"] for lk in only["locks"]] == ["ops-sem"]
    # the reference console reads permits as rows of the KV listing: the same tokens
    rows = (await _post(broker.url, "/api/v1/resources/kv/list",
                        {"namespace": "queen-locks"})).json()["rows"]
    assert [(r["key"], r["version"], r["value"]["owner"]) for r in rows] == [
        ("ops-lock#0", 2, "alice"), ("ops-sem#0", 1, "w1"), ("ops-sem#1", 2, "w2")]


async def _timer_scene(client, conn) -> asyncpg.transaction.Transaction:
    """ops-t1: 5 pending timers, 3 due in an hour and 2 due in 1.5 s that a stand-in for
    a sweeper stuck mid-delivery (this test's transaction) holds FOR UPDATE, as a real
    sweeper holds the rows it delivers: they stay due and undelivered, i.e. overdue.
    ops-t2: one timer delivered, one cancelled. Returns the open transaction."""
    t = client.timers
    for n in range(3):
        await t.schedule("ops-t1", f"later-{n}", {"n": n}, delay_ms=3_600_000)
    for n in range(2):
        await t.schedule("ops-t1", f"stuck-{n}", {"n": n}, delay_ms=1_500)
    tx = conn.transaction()
    await tx.start()
    held = await conn.fetch("SELECT timer_key FROM queen.timers WHERE queue_name = 'ops-t1' "
                            "AND timer_key LIKE 'stuck-%' FOR UPDATE NOWAIT")
    assert len(held) == 2
    await t.schedule("ops-t2", "now", "go", delay_ms=0)
    await t.schedule("ops-t2", "never", "no", delay_ms=3_600_000)
    assert (await t.cancel("ops-t2", "never"))["status"] == "cancelled"
    return tx


async def test_timers_view_counts_pending_overdue_and_deliveries(scene):
    """Per queue: pending, overdue (due, not delivered), the next due time; and this
    broker's deliveries and cancellations; overdue timers go once the sweeper can take
    them."""
    broker, client, conn = scene
    tx = await _timer_scene(client, conn)
    try:
        async def settled():
            got = await _get(broker.url, "/api/v1/resources/timers")
            t1 = next((q for q in got["queues"] if q["queue"] == "ops-t1"), None)
            ok = (t1 is not None and t1["overdue"] == 2
                  and got["thisBroker"]["delivered"] == 1)
            return got if ok else None

        got = await wait_until_async(settled, 15, "2 overdue timers and 1 delivery")
        assert [q["queue"] for q in got["queues"]] == ["ops-t1"]  # ops-t2: nothing pending
        t1 = got["queues"][0]
        assert (t1["pending"], t1["overdue"], t1["maxAttempts"]) == (5, 2, 0)
        assert t1["nextDueAt"] < got["asOf"]  # the stuck ones, due already
        assert got["totals"] == {"queues": 1, "pending": 5, "overdue": 2,
                                 "nextDueAt": t1["nextDueAt"]}
        mine = got["thisBroker"]
        assert (mine["scheduled"], mine["cancelled"], mine["delivered"]) == (7, 1, 1)
        assert mine["sweeper"]["delivered"] == 1
        # the reference console's count of a queue's timers under a key prefix
        for prefix, n in (("stuck-", 2), ("later-", 3), ("later-1", 1), ("none", 0)):
            counted = await _get(broker.url, "/api/v1/timers/ops-t1", mode="count",
                                 prefix=prefix)
            assert counted == {"queue": "ops-t1", "prefix": prefix, "count": n}
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as h:
            for params in ({"mode": "count"}, {"mode": "sum", "prefix": "x"}):
                r = await h.get("/api/v1/timers/ops-t1", params=params)
                assert r.status_code == 400 and r.json()["error"] == "timers_bad_request"
    finally:
        await tx.rollback()

    async def delivered():
        got = await _get(broker.url, "/api/v1/resources/timers")
        return got if got["totals"]["overdue"] == 0 else None

    after = await wait_until_async(delivered, 10, "the released timers to be delivered")
    assert after["totals"]["pending"] == 3 and after["thisBroker"]["delivered"] == 3


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, name: str, sample: str | None = None, **labels) -> float:
    fam = families[name]
    found = [s.value for s in fam.samples if s.name == (sample or name) and s.labels == labels]
    assert len(found) == 1, (name, labels, fam.samples)
    return found[0]


async def test_prometheus_state_families(scene):
    """KV keys per namespace, locks held, timers pending and overdue per queue, and this
    broker's timer and lock counters, as parsed by prometheus_client."""
    broker, client, conn = scene
    await _kv_scene(client)
    await _lock_scene(client)
    tx = await _timer_scene(client, conn)
    try:
        async def scraped():
            async with httpx.AsyncClient(timeout=30) as h:
                text = (await h.get(broker.url + "/metrics/prometheus")).text
            fams = _families(text)
            ready = (_value(fams, "queen_timers_overdue", queue="ops-t1") == 2
                     and _value(fams, "queen_kv_expired_keys", namespace="ops-beta") == 1
                     and _value(fams, "queen_timers_delivered",
                                "queen_timers_delivered_total") == 1)
            return fams if ready else None

        fams = await wait_until_async(scraped, 15, "the scenario's figures on the page")
        async with httpx.AsyncClient(timeout=30) as h:
            state = (await h.get(broker.url + "/metrics")).json()["state"]
    finally:
        await tx.rollback()
    kv = {s.labels["namespace"]: s.value for s in fams["queen_kv_keys"].samples}
    assert kv == {"ops-alpha": 3, "ops-beta": 2, "ops-gamma": 1, "queen-locks": 3}
    assert _value(fams, "queen_kv_bytes", namespace="ops-beta") == len('"x"') + len('"yy"')
    assert _value(fams, "queen_locks_held") == 2
    assert _value(fams, "queen_lock_permits_held") == 3
    assert _value(fams, "queen_lock_acquires", "queen_lock_acquires_total") == 4
    assert _value(fams, "queen_lock_renewals", "queen_lock_renewals_total") == 1
    assert _value(fams, "queen_lock_refusals", "queen_lock_refusals_total", op="acquire") == 1
    assert _value(fams, "queen_lock_refusals", "queen_lock_refusals_total", op="renew") == 0
    assert _value(fams, "queen_timers_pending", queue="ops-t1") == 5
    assert _value(fams, "queen_timers_cancelled", "queen_timers_cancelled_total") == 1
    assert fams["queen_timers_delivered"].type == "counter"
    assert fams["queen_kv_keys"].type == "gauge"
    # the JSON page carries the same figures
    assert (state["locks"]["held"], state["locks"]["permits"]) == (2, 3)
    assert (state["timers"]["pending"], state["timers"]["overdue"]) == (5, 2)
    assert [(n["namespace"], n["liveKeys"]) for n in state["kv"]] == [
        ("ops-alpha", 3), ("ops-beta", 2), ("ops-gamma", 1), ("queen-locks", 3)]


_LISTING = st.fixed_dictionaries({}, optional={
    "namespace": st.sampled_from(["ops-alpha", "queen-locks", "", "bad ns"]) | st.integers(),
    "prefix": st.text(max_size=4) | st.integers() | st.none(),
    "after": st.text(max_size=4) | st.none() | st.booleans(),
    "limit": st.integers(-5, 5000) | st.text(max_size=3) | st.floats() | st.none(),
    "includeExpired": st.booleans() | st.integers() | st.none(),
    "keysOnly": st.booleans() | st.text(max_size=2),
})


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_LISTING | st.integers() | st.lists(st.integers(), max_size=2))
@example(body={"namespace": "ops-alpha", "limit": math.inf})
@example(body={"namespace": "ops-alpha", "limit": math.nan})
def test_kv_listing_bodies_never_500(http, body):
    """Any body answers a page or a coded 400, never a 500. Sent with Python's json.dumps,
    which writes a non-finite float as Infinity or NaN: tokens outside JSON that a client
    can still send (and the broker's parser reads), so they are part of the attack."""
    r = http.post("/api/v1/resources/kv/list", content=json.dumps(body),
                  headers={"content-type": "application/json"})
    assert r.status_code in (200, 400), (body, r.status_code, r.text)
    if r.status_code == 200:
        page = r.json()
        assert len(page["rows"]) <= 1000 and page["truncated"] in (True, False)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(params=st.dictionaries(st.sampled_from(["prefix", "after", "limit"]),
                              st.text(max_size=6), max_size=3))
def test_locks_listing_parameters_never_500(http, params):
    r = http.get("/api/v1/resources/locks", params=params)
    assert r.status_code in (200, 400), (params, r.status_code, r.text)
