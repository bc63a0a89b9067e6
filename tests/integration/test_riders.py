"""Transaction riders and guards through the official client:
``client.transaction()...kv...``, ``.timer(...)``, ``.once(...)`` and ``.guard(lock)``
on POST /api/v1/transaction: the acks, pushes, key/value writes and timers of one step
commit in one PostgreSQL transaction, or none of them does."""
from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ns() -> str:
    return f"r-{uuid.uuid4().hex[:10]}"


async def _messages(client, queue: str) -> list:
    read = await client.queue(queue).fetch("Default")
    return [r["payload"] for r in read["Default"]["records"]]


async def test_guarded_step_commits_while_the_permit_holds(client, http, queue_name, ns):
    """Ack + push + kv write + timer under a held lock: all committed, results in the
    append-only layout (operations, then kv with the guard first, then timers)."""
    r = http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": "job"}]})
    assert r.status_code in (200, 201)
    (msg,) = await client.queue(queue_name).batch(1).wait(False).pop()
    lock = client.lock(f"step-{ns}", ttl_seconds=30)
    assert await lock.acquire()
    out = queue_name + "-out"
    res = await (client.transaction().guard(lock).ack(msg)
                 .queue(out).push([{"data": {"done": 1}}])
                 .kv.put(ns, "progress", {"step": 1}, forever=True)
                 .timer(out).key("later").payload({"t": 1}).after_ms(60_000).schedule()
                 .commit())
    assert res["success"] is True
    types = [x["type"] for x in res["results"]]
    assert types == ["ack", "push", "kv", "kv", "timer"]
    assert [x["index"] for x in res["results"]] == [0, 1, 2, 3, 4]
    assert res["results"][2]["op"] == "check" and res["results"][3]["applied"] is True
    assert res["results"][4]["status"] == "scheduled"
    assert await _messages(client, out) == [{"done": 1}]
    assert (await client.kv.get(ns, "progress"))["value"] == {"step": 1}
    assert (await client.timers.peek(out, "later"))["found"]
    # the acked message is gone for the queue-mode consumer
    assert await client.queue(queue_name).batch(1).wait(False).pop() == []
    await lock.release()


async def test_replaced_holder_commits_nothing(client, queue_name, ns):
    """The permit is taken by another owner while the first handle still believes it holds
    it: its guarded step commits nothing (no push, no kv write, no timer), commit() returns
    success False with reason kv_precondition, and the handle reports the lock lost."""
    name = f"report-{ns}"
    lock = client.lock(name, ttl_seconds=30, auto_renew=False)
    assert await lock.acquire()
    # Somebody else's takeover: the permit is released from under the handle and taken.
    assert (await client.locks.release(name, token=lock.token))["released"]
    other = await client.locks.acquire(name, ttl_seconds=30, owner="the-other-one")
    assert other["acquired"] and other["token"] > lock.token
    assert lock.held  # the first handle does not know yet
    res = await (client.transaction().guard(lock)
                 .queue(queue_name).push([{"data": "must not land"}])
                 .kv.put(ns, "k", 1, forever=True)
                 .timer(queue_name).key("t").payload(1).after_ms(10).schedule()
                 .commit())
    assert not res and res["success"] is False and res["reason"] == "kv_precondition"
    assert res["failedIndex"] == 1  # the push item, then the guard
    assert res["kvReason"] == "version" and res["value"]["owner"] == "the-other-one"
    assert lock.lost.is_set() and not lock.held
    assert await _messages(client, queue_name) == []
    assert not (await client.kv.get(ns, "k"))["found"]
    assert not await client.timers.peek(queue_name, "t")


async def test_expired_paused_holder_is_refused(client, queue_name, ns):
    """A holder paused past its lifetime while another owner took the lock: the guard it
    built before the pause (a required check at its token) refuses the step."""
    name = f"paused-{ns}"
    first = await client.locks.acquire(name, ttl_seconds=1, owner="paused")
    from tests.waiting import wait_until_async

    async def taken():
        r = await client.locks.acquire(name, ttl_seconds=30, owner="next")
        return r if r["acquired"] else None

    nxt = await wait_until_async(taken, 10, "the takeover after expiry")
    g = first["guard"]
    res = await (client.transaction()
                 .kv.check(g["ns"], g["key"], expect=g["expect"], required=True)
                 .queue(queue_name).push([{"data": "zombie"}]).commit())
    assert res["success"] is False and res["reason"] == "kv_precondition"
    assert res["kvReason"] == "version" and res["version"] == nxt["token"]
    assert await _messages(client, queue_name) == []
    # the new holder's guard holds
    g2 = nxt["guard"]
    ok = await (client.transaction().kv.check(g2["ns"], g2["key"], expect=g2["expect"],
                                              required=True)
                .queue(queue_name).push([{"data": "fenced"}]).commit())
    assert ok["success"] is True
    assert await _messages(client, queue_name) == ["fenced"]


async def test_once_gate_and_rollback_on_failed_ack(client, http, queue_name, ns):
    """tx.once admits a step once; a step whose ack fails rolls back its kv writes and
    timers too."""
    first = await (client.transaction().once(ns, "msg-1", ttl_seconds=60)
                   .queue(queue_name).push([{"data": 1}]).commit())
    second = await (client.transaction().once(ns, "msg-1", ttl_seconds=60)
                    .queue(queue_name).push([{"data": 2}]).commit())
    assert first["success"] and second["reason"] == "kv_precondition"
    assert second["kvReason"] == "exists"
    assert await _messages(client, queue_name) == [1]
    r = http.post("/api/v1/transaction", json={
        "operations": [{"type": "ack", "transactionId": "nope",
                        "partitionId": str(uuid.uuid4()), "status": "completed"}],
        "kv": [{"op": "put", "ns": ns, "key": "side", "value": 1, "forever": True}],
        "timers": [{"op": "schedule", "queue": queue_name, "timerKey": "side",
                    "payload": "MQ==", "delayMs": 10, "txn": "x"}]})
    assert r.status_code == 200 and r.json()["success"] is False, r.text
    assert [x.get("status") or x.get("reason") for x in r.json()["results"]] == [
        "rolled_back", "rolled_back", "rolled_back"]
    assert not (await client.kv.get(ns, "side"))["found"]
    assert not await client.timers.peek(queue_name, "side")


def test_bad_riders_are_400_and_change_nothing(http, queue_name, ns):
    """A malformed rider refuses the whole transaction before anything is written."""
    for body in [
        {"operations": [], "kv": [{"op": "getPrefix", "ns": ns, "prefix": "a"}]},
        {"operations": [], "kv": "x"},
        {"operations": [{"type": "push", "items": [{"queue": queue_name, "payload": 1}]}],
         "kv": [{"op": "put", "ns": "queen-locks", "key": "a#0", "value": 1, "forever": True}]},
        {"operations": [{"type": "push", "items": [{"queue": queue_name, "payload": 1}]}],
         "timers": [{"op": "schedule", "queue": queue_name, "timerKey": "k", "payload": "MQ==",
                     "delayMs": 1, "deliverAt": "2030-01-01"}]},
        {"operations": []},
    ]:
        r = http.post("/api/v1/transaction", json=body)
        assert r.status_code == 400, (body, r.text)
    got = http.post("/api/v1/fetch", json={"entries": [
        {"queue": queue_name, "partition": "Default", "offset": 0}]}).json()
    assert got["entries"][0]["records"] == []
