"""Wakes on release: an ack that releases a lease makes the
partition claimable again, and a pop parked on it is served at once, not at
its next backoff re-check.

The broker runs with a 20 s re-check interval, so within the bound below only
a wake can have served the parked pop: the bound tells a wake from a timer,
it is not a performance target (the margin is wide on purpose).
"""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.conftest import start_broker
from tests.waiting import wait_until

RECHECK_MS = "20000"
WAKE_BOUND_S = 5.0  # far below the re-check interval, far above a loaded machine's wake


@pytest.fixture(scope="module")
def slow_recheck_broker(database, tmp_path_factory):
    b = start_broker(database, tmp_path_factory.mktemp("release-wake"),
                     POP_WAIT_INITIAL_INTERVAL_MS=RECHECK_MS, POP_WAIT_MAX_INTERVAL_MS=RECHECK_MS)
    yield b
    b.stop()


def wait_parked(http: httpx.Client, n: int, timeout: float = 10.0) -> None:
    wait_until(lambda: http.get("/metrics").json()["longPollsInFlight"] >= n, timeout,
               f"{n} pop(s) parked", interval=0.02)


@pytest.mark.parametrize("ack_status", ["completed", "failed"])
def test_a_pop_parked_on_a_leased_partition_is_served_when_the_lease_is_released(
        slow_recheck_broker, queue_name, ack_status):
    url = slow_recheck_broker.url
    with httpx.Client(base_url=url, timeout=30) as http:
        for i in range(2):
            r = http.post("/api/v1/push", json={"items": [
                {"queue": queue_name, "transactionId": f"m{i}", "payload": i}]})
            assert r.status_code == 200
        first = http.get(f"/api/v1/pop/queue/{queue_name}", params={"batch": 1}).json()
        (message,) = first["messages"]
        answer: dict = {}

        def second_consumer() -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                answer["response"] = c.get(f"/api/v1/pop/queue/{queue_name}",
                                           params={"batch": 1, "wait": "true",
                                                   "timeout": 15000}).json()
                answer["at"] = time.monotonic()

        thread = threading.Thread(target=second_consumer)
        thread.start()
        try:
            wait_parked(http, 1)  # the partition is leased: it parks
            acked_at = time.monotonic()
            r = http.post("/api/v1/ack", json={
                "transactionId": message["transactionId"], "partitionId": message["partitionId"],
                "leaseId": message["leaseId"], "status": ack_status})
            assert r.status_code == 200 and r.json()[0]["leaseReleased"], r.text
        finally:
            thread.join(20)
        got = [m["transactionId"] for m in answer["response"]["messages"]]
        # completed: the next message; failed: the same one again (retry)
        assert got == (["m1"] if ack_status == "completed" else ["m0"])
        assert answer["at"] - acked_at < WAKE_BOUND_S


@pytest.mark.parametrize("route", ["/partition/Default", ""])
def test_a_pop_parked_on_a_leased_partition_is_served_when_the_lease_expires(
        slow_recheck_broker, queue_name, route):
    """Nothing wakes a pop when a lease expires (no ack arrives): a pop parked
    on the leased partition re-checks at the lease's end, not at its 20 s
    backoff; the claim's verdict says when (a partition pop), or the
    hot-list's wheel does (a wildcard pop)."""
    url = slow_recheck_broker.url
    with httpx.Client(base_url=url, timeout=30) as http:
        r = http.post("/api/v1/configure", json={"queue": queue_name,
                                                 "options": {"leaseTime": 2}})
        assert r.status_code == 200, r.text
        assert http.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "transactionId": "m0", "payload": 0}]}).status_code == 200
        first = http.get(f"/api/v1/pop/queue/{queue_name}", params={"batch": 1}).json()
        assert [m["transactionId"] for m in first["messages"]] == ["m0"]  # never acked
        leased_at = time.monotonic()
        r = http.get(f"/api/v1/pop/queue/{queue_name}{route}",
                     params={"batch": 1, "wait": "true", "timeout": 15000})
        waited = time.monotonic() - leased_at
        assert [m["transactionId"] for m in r.json()["messages"]] == ["m0"]  # redelivered
        assert r.json()["messages"][0]["retryCount"] >= 0
        assert 1.5 <= waited < 2 + WAKE_BOUND_S  # at the lease's end, far below 20 s


def test_a_released_lease_wakes_only_the_pops_of_the_group_that_released_it(
        slow_recheck_broker, queue_name):
    """g1 and g2 each have a pop parked on the queue; g1's ack releases g1's lease. Only g1's
    pop is woken (one wake, counted in /health): g2's lease and cursor did not move, so a g2
    pop woken by it would only run an empty claim."""
    url = slow_recheck_broker.url

    def woken(http: httpx.Client) -> int:
        return http.get("/health").json()["shared_state"]["longPolls"]["woken"]

    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "transactionId": "m0", "payload": 0}]}).status_code == 200
        pops = {g: http.get(f"/api/v1/pop/queue/{queue_name}",
                            params={"consumerGroup": g, "batch": 1}).json()["messages"]
                for g in ("g1", "g2")}
        assert [m["transactionId"] for g in ("g1", "g2") for m in pops[g]] == ["m0", "m0"]
        (m2,) = pops["g2"]
        assert http.post("/api/v1/ack", json={
            "transactionId": "m0", "partitionId": m2["partitionId"], "leaseId": m2["leaseId"],
            "status": "completed", "consumerGroup": "g2"}).json()[0]["success"]
        answers: dict[str, dict] = {}

        def parked_pop(group: str) -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                answers[group] = c.get(f"/api/v1/pop/queue/{queue_name}", params={
                    "consumerGroup": group, "batch": 1, "wait": "true",
                    "timeout": 4000}).json()

        threads = [threading.Thread(target=parked_pop, args=(g,)) for g in ("g1", "g2")]
        for t in threads:
            t.start()
        try:
            wait_parked(http, 2)  # g2: nothing left for it; g1: its lease holds the partition
            before = woken(http)
            (m1,) = pops["g1"]
            r = http.post("/api/v1/ack", json={
                "transactionId": "m0", "partitionId": m1["partitionId"],
                "leaseId": m1["leaseId"], "status": "completed", "consumerGroup": "g1"})
            assert r.status_code == 200 and r.json()[0]["leaseReleased"], r.text
            after = wait_until(lambda: woken(http) - before, 5, "g1's parked pop woken")
        finally:
            for t in threads:
                t.join(20)
        assert after == 1, f"{after} pops woken by g1's release"
        assert answers["g1"].get("messages", []) == [] and answers["g2"].get("messages", []) == []
