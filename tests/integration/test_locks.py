"""Locks and semaphores with fencing tokens through the official client's
``client.lock`` / ``client.semaphore`` / ``client.locks`` (POST /api/v1/locks)."""
from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queen.errors import LockError

from tests.waiting import wait_until_async

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def lock_name() -> str:
    return f"lock-{uuid.uuid4().hex[:10]}"


async def test_acquire_renew_release_with_rising_tokens(client, lock_name):
    """One holder at a time; every acquire and renew answers a higher token, the old one
    stops working; release frees the lock and the next holder's token is higher still."""
    first = client.lock(lock_name, ttl_seconds=30, auto_renew=False)
    second = client.lock(lock_name, ttl_seconds=30, auto_renew=False)
    assert await first.acquire()
    t1 = first.token
    assert not await second.acquire()
    assert await first.renew()
    t2 = first.token
    assert t2 > t1
    # the token before the renew no longer works
    stale = await client.locks.release(lock_name, token=t1)
    assert stale["released"] is False and stale["reason"] == "lost"
    held = await client.locks.get(lock_name)
    assert held["held"] and [h["owner"] for h in held["holders"]] == [first.owner]
    assert held["holders"][0]["token"] == t2
    assert await first.release()
    assert not (await client.locks.get(lock_name))["held"]
    assert await second.acquire()
    assert second.token > t2
    await second.release()


async def test_acquire_is_idempotent_per_owner(client, lock_name):
    """An acquire sent again by the same owner answers the permit the first one took."""
    one = await client.locks.acquire(lock_name, ttl_seconds=30, owner="me")
    again = await client.locks.acquire(lock_name, ttl_seconds=30, owner="me")
    other = await client.locks.acquire(lock_name, ttl_seconds=30, owner="you")
    assert one["acquired"] and again["acquired"] and again.get("already") is True
    assert (again["token"], again["slot"]) == (one["token"], one["slot"])
    assert other["acquired"] is False and other["reason"] == "held"
    assert [h["owner"] for h in other["holders"]] == ["me"]
    assert one["guard"] == {"op": "check", "ns": "queen-locks", "key": f"{lock_name}#0",
                            "expect": one["token"], "required": True}


async def test_expired_permit_is_free_at_once_and_the_token_still_rises(client, lock_name):
    """A permit past its lifetime is free to the next acquire before any sweep; the
    token counter survives the row's expiry; the paused holder's renew is refused."""
    paused = await client.locks.acquire(lock_name, ttl_seconds=1, owner="paused")
    assert paused["acquired"]

    async def taken_over():
        r = await client.locks.acquire(lock_name, ttl_seconds=30, owner="next")
        return r if r["acquired"] else None

    nxt = await wait_until_async(taken_over, 10, "the expired permit to be free")
    assert nxt["token"] > paused["token"]
    renew = await client.locks.renew(lock_name, token=paused["token"], ttl_seconds=30)
    assert renew["renewed"] is False and renew["reason"] == "lost"


async def test_semaphore_admits_n(client, lock_name):
    """A semaphore of 3 admits 3 concurrent holders in 3 distinct slots, refuses a fourth,
    and admits it once one releases."""
    handles = [client.semaphore(lock_name, 3, ttl_seconds=30, auto_renew=False)
               for _ in range(4)]
    got = await asyncio.gather(*(h.acquire() for h in handles))
    assert sorted(got) == [False, True, True, True]
    holders = [h for h, ok in zip(handles, got) if ok]
    assert sorted(h.slot for h in holders) == [0, 1, 2]
    assert len({h.token for h in holders}) == 3
    waiting = next(h for h, ok in zip(handles, got) if not ok)
    assert await holders[0].release()
    assert await waiting.acquire()
    for h in [*holders[1:], waiting]:
        await h.release()


async def test_concurrent_acquires_admit_exactly_the_limit(client, lock_name):
    """Twenty owners race for a lock and for a semaphore of 5 at once (each acquire is one
    statement serialised on the lock's fence): one and five win, in distinct slots with
    distinct tokens; the losers see the winners as holders; the next token is higher than
    every one handed out."""
    async def race(name: str, limit: int) -> list[dict]:
        return list(await asyncio.gather(*(
            client.locks.acquire(name, ttl_seconds=30, owner=f"o{n}", limit=limit)
            for n in range(20))))

    for name, limit in ((lock_name, 1), (lock_name + "-sem", 5)):
        results = await race(name, limit)
        won = [r for r in results if r["acquired"]]
        assert len(won) == limit, results
        assert sorted(r["slot"] for r in won) == list(range(limit))
        assert len({r["token"] for r in won}) == limit
        winners = {r["owner"] for r in won}
        for lost in (r for r in results if not r["acquired"]):
            assert {h["owner"] for h in lost["holders"]} == winners
        held = await client.locks.get(name)
        assert {h["owner"] for h in held["holders"]} == winners
        first = won[0]
        renewed = await client.locks.renew(name, token=first["token"], ttl_seconds=30)
        assert renewed["token"] > max(r["token"] for r in won)


async def test_background_renew_changes_the_token(client, lock_name):
    """The handle renews by itself and keeps the new token."""
    lock = client.lock(lock_name, ttl_seconds=3, renew_every=0.2)
    assert await lock.acquire()
    first = lock.token

    async def moved():
        return lock.token is not None and lock.token > first

    await wait_until_async(moved, 10, "a background renew")
    assert (await client.locks.get(lock_name))["holders"][0]["token"] == lock.token
    await lock.release()


async def test_bad_lock_calls_are_lock_errors(client):
    """A malformed call is a 400 LockError with a code; a verdict never is."""
    with pytest.raises(LockError) as err:
        await client.locks.batch([{"op": "acquire", "name": "x", "ttlSeconds": 0}])
    assert err.value.status == 400 and err.value.code == "lock_bad_request"
    with pytest.raises(LockError):
        await client.locks.batch([{"op": "get", "name": "a"}, {"op": "get", "name": "a"}])


_LOCK_OP = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(["acquire", "renew", "release", "get", "steal"]) | st.integers(),
    "name": st.text(max_size=5) | st.integers(),
    "ttlSeconds": st.integers() | st.text(max_size=2) | st.booleans(),
    "token": st.integers() | st.none() | st.text(max_size=2),
    "slot": st.integers() | st.text(max_size=2),
    "limit": st.integers() | st.booleans(),
    "owner": st.text(max_size=5) | st.integers(),
})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_LOCK_OP, max_size=3) | st.integers() | st.none())
def test_lock_bodies_never_500(http, ops):
    """Any body answers 200 (one result per op) or a coded 400."""
    r = http.post("/api/v1/locks", json={"operations": ops})
    assert r.status_code in (200, 400), (ops, r.status_code, r.text)
    if r.status_code == 400:
        assert r.json()["error"].startswith("lock_")
    else:
        assert len(r.json()["results"]) == len(ops)
    # leave nothing held for the next example
    for res in r.json().get("results", []) if r.status_code == 200 else []:
        if res.get("acquired") and not res.get("already"):
            http.post("/api/v1/locks", json={"operations": [
                {"op": "release", "name": res["name"], "token": res["token"]}]})
