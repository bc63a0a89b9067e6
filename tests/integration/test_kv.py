"""Key/value through the official client's ``client.kv`` (POST /api/v1/kv)
and the path-style sugar routes over HTTP, against the real broker process."""
from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queen.errors import KvError

from tests.conftest import db_val
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ns() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def test_put_get_versions_and_delete(client, ns):
    """put creates at version 1 and each write adds one; get answers value, version and
    expiry; a delete is idempotent (absent the second time); a missing key is found:false,
    and a stored null is found:true with value None."""
    kv = client.kv
    first = await kv.put(ns, "a", {"n": 1}, forever=True)
    assert first["applied"] and first["version"] == 1 and first["expiresAt"] is None
    second = await kv.put(ns, "a", {"n": 2}, ttl_seconds=60)
    assert second["version"] == 2 and second["expiresAt"].endswith("Z")
    got = await kv.get(ns, "a")
    assert got["found"] and got["value"] == {"n": 2} and got["version"] == 2
    assert not await kv.get(ns, "missing")
    await kv.put(ns, "nul", None, forever=True)
    nul = await kv.get(ns, "nul")
    assert nul["found"] is True and nul["value"] is None
    assert (await kv.delete(ns, "a"))["applied"] is True
    again = await kv.delete(ns, "a")
    assert again["applied"] is False and again["reason"] == "absent"
    assert not (await kv.get(ns, "a"))["found"]


async def test_preconditions(client, ns):
    """expect=0 is "must not exist", expect=N a pure update that creates nothing; a loser
    gets the current value and version; check writes nothing."""
    kv = client.kv
    assert (await kv.put(ns, "k", "v1", forever=True, expect=0))["applied"]
    lost = await kv.put(ns, "k", "v2", forever=True, expect=0)
    assert (lost["applied"], lost["reason"], lost["value"], lost["version"]) == (
        False, "exists", "v1", 1)
    stale = await kv.put(ns, "k", "v2", forever=True, expect=7)
    assert (stale["applied"], stale["reason"], stale["version"]) == (False, "version", 1)
    assert (await kv.put(ns, "k", "v2", forever=True, expect=1))["version"] == 2
    none = await kv.put(ns, "nothing-here", "x", forever=True, expect=3)
    assert none["reason"] == "absent" and not (await kv.get(ns, "nothing-here"))["found"]
    assert (await kv.delete(ns, "k", expect=1))["reason"] == "version"
    assert (await kv.check(ns, "k", expect=2))["applied"] is True
    assert (await kv.check(ns, "k", expect=1))["reason"] == "version"
    assert (await kv.check(ns, "nope", expect=0))["applied"] is True
    assert (await kv.get(ns, "k"))["version"] == 2  # the checks wrote nothing
    assert (await kv.delete(ns, "k", expect=2))["applied"] is True


async def test_put_if_absent_has_one_winner(client, ns):
    """Exactly one of many concurrent putIfAbsent applies."""
    results = await asyncio.gather(*(
        client.kv.put_if_absent(ns, "gate", i, ttl_seconds=60) for i in range(20)))
    winners = [r for r in results if r["applied"]]
    assert len(winners) == 1
    assert (await client.kv.get(ns, "gate"))["value"] == winners[0]["value"]
    assert await client.kv.once(ns, "gate2", ttl_seconds=60) is True
    assert await client.kv.once(ns, "gate2", ttl_seconds=60) is False


async def test_incr_bounds_and_create_only_ttl(client, ns):
    """incr counts from zero, refuses past max without spending, keeps a live counter's
    expiry (create-only TTL), and refuses a value that is not a number."""
    kv = client.kv
    one = await kv.incr(ns, "c", ttl_seconds=3600)
    assert (one["applied"], one["value"]) == (True, 1)
    two = await kv.incr(ns, "c", delta=2, max=3, ttl_seconds=5)
    assert two["value"] == 3 and two["expiresAt"] == one["expiresAt"]
    refused = await kv.incr(ns, "c", max=3, ttl_seconds=3600)
    assert (refused["applied"], refused["reason"], refused["value"]) == (False, "max", 3)
    assert (await kv.incr(ns, "c", delta=-5, min=0, ttl_seconds=1))["reason"] == "min"
    total = await asyncio.gather(*(kv.incr(ns, "n", forever=True) for _ in range(25)))
    assert sorted(r["value"] for r in total) == list(range(1, 26))
    await kv.put(ns, "s", "text", forever=True)
    assert (await kv.incr(ns, "s", forever=True))["reason"] == "not_a_number"


async def test_ttl_expiry_is_enforced_before_any_sweep(client, ns, database):
    """A key past its expiry is absent to get, getMany, getPrefix, expect=0 and incr
    while its row is still in the table (the sweep is test_retention_sweeps_dead_rows)."""
    import asyncpg
    kv = client.kv
    await kv.put(ns, "short", "v", ttl_seconds=1)
    await kv.put(ns, "cnt", 41, ttl_seconds=1)
    assert (await kv.get(ns, "short"))["found"]
    # Hold the two rows FOR SHARE so the retention sweep (FOR UPDATE SKIP LOCKED) leaves
    # them in the table however soon it runs: what hides them is then the expiry alone.
    holder = await asyncpg.connect(database.dsn)
    try:
        async with holder.transaction():
            held = await holder.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM queen.kv WHERE namespace = $1 "
                "AND key IN ('short', 'cnt') FOR SHARE) r", ns)
            assert held == 2
            await wait_until_async(lambda: _absent(kv, ns, "short"), 10, "the key to expire")
            await wait_until_async(lambda: _absent(kv, ns, "cnt"), 10, "the counter to expire")
            many = await kv.get_many(ns, ["short", "cnt"])
            assert many["rows"] == [] and many["missing"] == ["short", "cnt"]
            assert (await kv.get_prefix(ns, "s"))["rows"] == []
            assert await holder.fetchval("SELECT count(*) FROM queen.kv WHERE namespace = $1",
                                         ns) == 2  # still there: the expiry rules, not a sweep
    finally:
        await holder.close()
    assert (await kv.put(ns, "short", "w", forever=True, expect=0))["applied"]
    fresh = await kv.incr(ns, "cnt", ttl_seconds=60)
    assert fresh["value"] == 1  # an expired counter counts as zero


async def adb_val(database, sql: str, *params):
    """One value from the test database, from an async test."""
    import asyncpg
    conn = await asyncpg.connect(database.dsn)
    try:
        return await conn.fetchval(sql, *params)
    finally:
        await conn.close()


async def _absent(kv, ns: str, key: str) -> bool:
    return not (await kv.get(ns, key))["found"]


async def test_get_prefix_pages_and_batch_alignment(client, ns):
    """getPrefix pages in key order with nextAfter, never leaves the prefix; a batch answers
    one result per op, in order."""
    kv = client.kv
    keys = [f"user:{i:03d}" for i in range(25)]
    await kv.batch([kv.op.put(ns, k, i, forever=True) for i, k in enumerate(keys)]
                   + [kv.op.put(ns, "user;after", 0, forever=True),
                      kv.op.put(ns, "usea", 0, forever=True)])
    page = await kv.get_prefix(ns, "user:", limit=10)
    assert [r["key"] for r in page["rows"]] == keys[:10] and page["truncated"]
    assert page["nextAfter"] == keys[9]
    assert [r["key"] for r in await kv.list_all(ns, "user:", limit=7)] == keys
    only = await kv.get_prefix(ns, "user:02", keys_only=True)
    assert [r["key"] for r in only["rows"]] == keys[20:] and "value" not in only["rows"][0]
    results = await kv.batch([kv.op.get(ns, keys[3]), kv.op.put(ns, "x", 1, forever=True),
                              kv.op.get(ns, "x"), kv.op.delete(ns, "nope"),
                              kv.op.get_many(ns, [keys[0], "nope", keys[1]])])
    assert [r["op"] for r in results] == ["get", "put", "get", "delete", "getMany"]
    assert results[0]["value"] == 3 and results[2]["value"] == 1
    assert [r["key"] for r in results[4]["rows"]] == [keys[0], keys[1]]
    assert results[4]["missing"] == ["nope"]


async def test_required_rolls_the_batch_back(client, ns):
    """A required op that does not apply rolls back every write of the batch."""
    kv = client.kv
    await kv.put(ns, "held", 1, forever=True)
    results = await kv.batch([kv.op.put(ns, "w1", 1, forever=True),
                              kv.op.put_if_absent(ns, "held", 2, forever=True, required=True),
                              kv.op.put(ns, "w2", 1, forever=True)])
    assert [r.get("reason") for r in results] == ["rolled_back", "exists", "not_run"]
    assert not (await kv.get(ns, "w1"))["found"] and not (await kv.get(ns, "w2"))["found"]


async def test_refusals_are_typed_and_change_nothing(client, ns):
    """A bad op is a 400 KvError with a code, and the batch around it wrote nothing; the
    lock namespace is not writable through /api/v1/kv."""
    bad = [{"op": "put", "ns": ns, "key": "k", "value": 1},  # no expiry
           {"op": "getPrefix", "ns": ns, "prefix": ""},
           {"op": "put", "ns": "queen-locks", "key": "x#0", "value": 1, "forever": True},
           {"op": "frobnicate", "ns": ns, "key": "k"}]
    codes = []
    for op in bad:
        with pytest.raises(KvError) as err:
            await client.kv.batch([{"op": "put", "ns": ns, "key": "first", "value": 1,
                                    "forever": True}, op])
        assert err.value.status == 400
        codes.append(err.value.code)
    assert codes == ["kv_expiry_not_specified", "kv_prefix_required", "kv_namespace_reserved",
                     "kv_unknown_op"]
    assert not (await client.kv.get(ns, "first"))["found"]


def test_sugar_routes(http, ns):
    """GET/PUT/DELETE /api/v1/kv/<ns>/<key>: ETag is the version, If-Match / If-None-Match
    are expect (412 when they do not hold), a missing key is a 404 kv_not_found."""
    r = http.put(f"/api/v1/kv/{ns}/a/b", json={"value": {"x": 1}, "forever": True},
                 headers={"If-None-Match": "*"})
    assert r.status_code == 200 and r.headers["etag"] == '"1"', r.text
    r = http.get(f"/api/v1/kv/{ns}/a/b")
    assert r.status_code == 200 and r.json()["value"] == {"x": 1}
    assert r.headers["etag"] == '"1"'
    r = http.put(f"/api/v1/kv/{ns}/a/b", json={"value": 2, "ttlSeconds": 60},
                 headers={"If-Match": '"5"'})
    assert r.status_code == 412 and r.json()["reason"] == "version"
    r = http.put(f"/api/v1/kv/{ns}/a/b", json={"value": 2, "ttlSeconds": 60},
                 headers={"If-Match": '"1"'})
    assert r.status_code == 200 and r.headers["etag"] == '"2"'
    assert http.delete(f"/api/v1/kv/{ns}/a/b").status_code == 200
    r = http.get(f"/api/v1/kv/{ns}/a/b")
    assert r.status_code == 404 and r.json()["error"] == "kv_not_found"
    assert http.delete(f"/api/v1/kv/{ns}/a/b").json()["reason"] == "absent"
    assert http.put(f"/api/v1/kv/{ns}/k", json={"value": 1}).status_code == 400


def test_retention_sweeps_dead_rows(http, ns, database):
    """Expired and deleted rows are deleted by the retention job (leader-gated)."""
    r = http.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": ns, "key": "gone", "value": 1, "ttlSeconds": 1},
        {"op": "put", "ns": ns, "key": "del", "value": 1, "forever": True},
        {"op": "delete", "ns": ns, "key": "del"},
        {"op": "put", "ns": ns, "key": "stays", "value": 1, "forever": True}]})
    assert r.status_code == 200, r.text

    def swept() -> bool:
        http.post("/api/v1/system/jobs/retention/run")
        return db_val(database, "SELECT array_agg(key ORDER BY key) FROM queen.kv "
                      "WHERE namespace = $1", ns) == ["stays"]

    wait_until(swept, 20, "the dead rows to be swept", interval=0.3)


_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4),
                      lambda inner: st.lists(inner, max_size=2)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=4)
_OP = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(["get", "getMany", "getPrefix", "put", "putIfAbsent", "delete",
                           "incr", "check", "nope"]) | st.integers(),
    "ns": st.sampled_from(["hyp", "queen-locks", "", "bad ns"]) | st.integers(),
    "key": st.text(max_size=4) | st.integers() | st.none(),
    "keys": st.lists(st.text(max_size=3), max_size=3) | st.text(max_size=2),
    "prefix": st.text(max_size=3) | st.integers(),
    "value": _VALUE,
    "ttlSeconds": st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=2),
    "forever": st.booleans() | st.integers(),
    "expect": st.integers() | st.none() | st.text(max_size=2),
    "delta": st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.booleans(),
    "limit": st.integers() | st.text(max_size=2),
    "required": st.booleans() | st.integers(),
})


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_OP, max_size=4) | st.integers() | st.text(max_size=3))
def test_kv_bodies_never_500_and_refusals_change_nothing(http, database, ops):
    """Any body answers 200 or 400; a 400 leaves the namespace as it was."""
    before = db_val(database, "SELECT count(*) FROM queen.kv WHERE namespace = 'hyp' "
                    "AND (expires_at IS NULL OR expires_at > now())")
    r = http.post("/api/v1/kv", json={"operations": ops})
    assert r.status_code in (200, 400), (ops, r.status_code, r.text)
    if r.status_code == 400:
        assert r.json()["error"].startswith("kv_")
        after = db_val(database, "SELECT count(*) FROM queen.kv WHERE namespace = 'hyp' "
                       "AND (expires_at IS NULL OR expires_at > now())")
        assert after == before
    else:
        assert len(r.json()["results"]) == len(ops)
