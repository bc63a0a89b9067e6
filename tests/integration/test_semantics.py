"""Delivery semantics over HTTP (docs/wire-contract.md §3, §6.3, §4.1 encryption,
§5.6 subscriptions).

Real broker, real PostgreSQL; each test's docstring names the invariant it checks.
"""
from __future__ import annotations

import threading
import time
import uuid

import httpx

from tests.conftest import WAKE_BOUND_S, db_fetch, parked_pops
from tests.waiting import wait_until


def push(http, queue, *payloads, partition=None):
    items = [{"queue": queue, "payload": p, **({"partition": partition} if partition else {})}
             for p in payloads]
    r = http.post("/api/v1/push", json={"items": items})
    assert r.status_code == 200, r.text
    return r.json()


def pop(http, queue, partition=None, **params):
    params.setdefault("wait", "false")
    path = f"/api/v1/pop/queue/{queue}" + (f"/partition/{partition}" if partition else "")
    r = http.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def ack(http, msg, status="completed", group=None, **extra):
    body = {"transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
            "status": status, "leaseId": msg["leaseId"], "consumerGroup": group, **extra}
    r = http.post("/api/v1/ack", json=body)
    assert r.status_code == 200, r.text
    return r.json()[0]


def configure(http, queue, **options):
    r = http.post("/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


def test_consumer_groups_each_receive_every_message(http, queue_name):
    """Fan-out: every named group (and queue mode) has its own cursor and gets every message."""
    push(http, queue_name, 1, 2, 3)
    for group in ("g1", "g2", None):
        params = {"batch": 10, **({"consumerGroup": group} if group else {})}
        body = pop(http, queue_name, **params)
        assert [m["data"] for m in body["messages"]] == [1, 2, 3]
        assert body["consumerGroup"] == (group or "__QUEUE_MODE__")
        for m in body["messages"]:
            assert ack(http, m, group=group)["success"] is True
        assert pop(http, queue_name, **params)["messages"] == []


def test_workers_of_one_group_parallelise_across_partitions(http, queue_name):
    """One in-flight batch per (partition, group): two consumers of the same group get
    different partitions; a third finds nothing."""
    push(http, queue_name, "a", partition="pa")
    push(http, queue_name, "b", partition="pb")
    first = pop(http, queue_name, consumerGroup="w")
    second = pop(http, queue_name, consumerGroup="w")
    assert {first["partition"], second["partition"]} == {"pa", "pb"}
    assert pop(http, queue_name, consumerGroup="w")["messages"] == []


def test_expired_lease_redelivers_unacked_message(http, queue_name):
    """Lease expiry makes the partition claimable again; delivery restarts after the cursor."""
    configure(http, queue_name, leaseTime=1)
    push(http, queue_name, "x")
    first = pop(http, queue_name)["messages"][0]
    assert pop(http, queue_name)["messages"] == []  # still leased
    again = []
    deadline = time.monotonic() + 10
    while not again and time.monotonic() < deadline:
        again = pop(http, queue_name, wait="true", timeout="3000")["messages"]
    assert again and again[0]["transactionId"] == first["transactionId"]
    assert again[0]["leaseId"] != first["leaseId"]
    # the stale lease can no longer ack; the new one can
    assert ack(http, first)["success"] is False
    assert ack(http, again[0])["success"] is True


def test_nack_redelivers_failed_message_and_the_rest_of_its_batch(http, queue_name):
    """failed ack with retries left: lease dropped, cursor unchanged ⇒ the failed message and
    everything after it in that batch come back, in order."""
    push(http, queue_name, 1, 2, 3)
    msgs = pop(http, queue_name, batch=3)["messages"]
    assert ack(http, msgs[0])["success"] is True
    res = ack(http, msgs[1], status="failed", error="nope")
    assert res["success"] is True and res["leaseReleased"] is True and res["dlq"] is False
    assert [m["data"] for m in pop(http, queue_name, batch=3)["messages"]] == [2, 3]


def test_retry_counter_resets_after_dead_letter(http, queue_name):
    """docs/wire-contract.md §6.3: after a message is dead-lettered the partition's retry
    counter restarts: the next message's first failure is redelivered, not sent straight to the
    DLQ."""
    configure(http, queue_name, retryLimit=1)
    push(http, queue_name, "m1", "m2")
    for _ in range(2):
        m = pop(http, queue_name)["messages"][0]
        assert m["data"] == "m1"
        last = ack(http, m, status="failed")
    assert last["dlq"] is True
    m2 = pop(http, queue_name)["messages"][0]
    assert m2["data"] == "m2"
    res = ack(http, m2, status="failed")
    assert res["dlq"] is False
    assert pop(http, queue_name)["messages"][0]["data"] == "m2"


def test_subscription_mode_new_skips_earlier_messages(http, queue_name):
    """subscriptionMode=new: a named group joining later starts at "now" (first join)."""
    push(http, queue_name, "old")
    first = pop(http, queue_name, consumerGroup="late", subscriptionMode="new")
    assert first["messages"] == []
    push(http, queue_name, "new")
    got = pop(http, queue_name, consumerGroup="late", subscriptionMode="new", batch=10)
    assert [m["data"] for m in got["messages"]] == ["new"]
    # the default group (all) still sees both
    assert [m["data"] for m in pop(http, queue_name, consumerGroup="all-g", batch=10)["messages"]] \
        == ["old", "new"]


def test_encrypted_queue_stores_ciphertext_and_pops_plaintext(http, database, queue_name):
    """encryptionEnabled: payload at rest is {"encrypted","iv","authTag"} (no plaintext in the
    row); pop and DLQ listing return the original payload."""
    configure(http, queue_name, encryptionEnabled=True, retryLimit=0)
    secret = {"card": "4111-1111-1111-1111"}
    pushed = push(http, queue_name, secret)[0]
    raw = db_fetch(database, "SELECT payload::text, is_encrypted FROM queen.messages WHERE id = $1::uuid",
                   uuid.UUID(pushed["message_id"]))[0]
    assert raw["is_encrypted"] is True
    assert "4111" not in raw["payload"]
    for key in ("encrypted", "iv", "authTag"):
        assert key in raw["payload"]
    m = pop(http, queue_name)["messages"][0]
    assert m["data"] == secret
    ack(http, m, status="failed")
    dlq = http.get("/api/v1/dlq", params={"queue": queue_name}).json()
    assert dlq["messages"][0]["data"] == secret


def test_transactional_push_wakes_a_parked_long_poll(slow_timer_broker, queue_name):
    """docs/wire-contract.md §5.5: a push inside POST /transaction wakes parked long polls on
    that queue, like a plain push: on slow_timer_broker the poll's own re-check timer is 8 s
    away, its deadline 20 s."""
    url = slow_timer_broker.url
    out = {}

    def waiter():
        with httpx.Client(base_url=url, timeout=30) as c:
            out["body"] = c.get(f"/api/v1/pop/queue/{queue_name}",
                                params={"wait": "true", "timeout": "20000"}).json()
            out["answered"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: parked_pops(url) == 1, 15, "the pop to park")
    pushed = time.monotonic()
    r = httpx.post(url + "/api/v1/transaction", timeout=30, json={"operations": [
        {"type": "push", "items": [{"queue": queue_name, "payload": "via-txn"}]}]})
    assert r.json()["success"] is True
    t.join(25)
    assert out["body"]["messages"][0]["data"] == "via-txn"
    # Only a wake answers within WAKE_BOUND_S of the push: the timer fires ~8 s after the park.
    elapsed = out["answered"] - pushed
    assert elapsed < WAKE_BOUND_S, f"answered {elapsed:.1f} s after the push: the timer, no wake"


def test_ack_without_lease_after_expiry_still_moves_cursor(http, queue_name):
    """Acks without leaseId are not fenced: a late ack still completes the message."""
    configure(http, queue_name, leaseTime=1)
    push(http, queue_name, "late")
    m = pop(http, queue_name)["messages"][0]
    time.sleep(1.5)
    res = http.post("/api/v1/ack", json={"transactionId": m["transactionId"],
                                         "partitionId": m["partitionId"]}).json()[0]
    assert res["success"] is True
    assert pop(http, queue_name)["messages"] == []
