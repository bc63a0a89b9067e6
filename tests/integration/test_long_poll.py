"""Long-poll pops on one broker: woken by a committed push, not by the timer;
parked pops hold nothing and vanish when their client goes away."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.waiting import wait_until_async

# slow_timer_broker (tests/conftest.py): its backoff timer alone would take 8 s to re-check.


async def _parked(client: httpx.AsyncClient) -> int:
    return (await client.get("/health")).json()["shared_state"]["parkedPops"]


async def _wait_parked(client: httpx.AsyncClient, count: int) -> None:
    async def parked() -> bool:
        return await _parked(client) == count
    await wait_until_async(parked, 10, f"{count} parked pops", interval=0.05)


async def test_committed_push_wakes_a_parked_pop_before_its_timer(slow_timer_broker, queue_name):
    async with httpx.AsyncClient(base_url=slow_timer_broker.url, timeout=30) as client:
        started = time.monotonic()
        pop = asyncio.create_task(client.get(
            f"/api/v1/pop/queue/{queue_name}", params={"wait": "true", "timeout": "20000"}))
        await _wait_parked(client, 1)
        r = await client.post("/api/v1/push", json={"items": [
            {"queue": queue_name, "partition": "p1", "payload": {"n": 1}}]})
        assert r.status_code == 200
        answer = await pop
        elapsed = time.monotonic() - started
    body = answer.json()
    assert [m["data"] for m in body["messages"]] == [{"n": 1}]
    # The timer alone would have answered after 8 s: only the wake explains this.
    assert elapsed < 6, f"pop answered after {elapsed:.1f}s: woken by the timer, not the push"


async def test_wake_for_another_queue_does_not_answer_the_pop(slow_timer_broker, queue_name):
    async with httpx.AsyncClient(base_url=slow_timer_broker.url, timeout=30) as client:
        pop = asyncio.create_task(client.get(
            f"/api/v1/pop/queue/{queue_name}", params={"wait": "true", "timeout": "1500"}))
        await _wait_parked(client, 1)
        await client.post("/api/v1/push", json={"items": [
            {"queue": queue_name + "-other", "payload": 1}]})
        body = (await pop).json()
    assert body["messages"] == [] and body["success"] is True and body["leaseId"] is None


async def test_client_disconnect_removes_the_parked_pop_and_takes_no_lease(
        slow_timer_broker, queue_name):
    async with httpx.AsyncClient(base_url=slow_timer_broker.url, timeout=30) as client:
        async with httpx.AsyncClient(base_url=slow_timer_broker.url, timeout=30) as doomed:
            pop = asyncio.create_task(doomed.get(
                f"/api/v1/pop/queue/{queue_name}", params={"wait": "true", "timeout": "20000"}))
            await _wait_parked(client, 1)
            pop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pop
        await _wait_parked(client, 0)
        await client.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 7}]})
        await asyncio.sleep(0.2)
        body = (await client.get(f"/api/v1/pop/queue/{queue_name}")).json()
    # Nobody leased the message on behalf of the vanished client.
    assert [m["data"] for m in body["messages"]] == [7]


async def test_long_poll_deadline_answers_empty(broker, queue_name):
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        started = time.monotonic()
        r = await client.get(f"/api/v1/pop/queue/{queue_name}",
                             params={"wait": "true", "timeout": "700"})
        elapsed = time.monotonic() - started
    assert r.status_code == 200
    assert r.json()["messages"] == [] and r.json()["leaseId"] is None
    assert elapsed >= 0.6


async def test_a_stopping_broker_answers_its_parked_pops_and_exits(broker_factory, queue_name):
    """SIGTERM with long polls parked (a durable pop and an ephemeral one, each with a
    minute left): both are answered as at their deadline (the same empty answer) instead
    of holding the stop for Sanic's graceful timeout and then being cut off unanswered,
    their connections are closed after the answers, and the broker exits cleanly while their
    clients still hold them."""
    b = broker_factory()
    durable = (f"/api/v1/pop/queue/{queue_name}", {"wait": "true"})
    ephemeral = ("/api/v1/ephemeral/pop", {"queue": queue_name, "wait": "true"})
    async with httpx.AsyncClient(base_url=b.url, timeout=90) as client:
        expected = [(await client.get(path, params={**params, "timeout": "100"}))
                    for path, params in (durable, ephemeral)]
        pops = [asyncio.create_task(client.get(path, params={**params, "timeout": "60000"}))
                for path, params in (durable, ephemeral)]

        async def both_parked() -> bool:
            health = (await client.get("/health")).json()
            return (health["shared_state"]["parkedPops"], health["ephemeral"]["parkedPops"]) \
                == (1, 1)
        await wait_until_async(both_parked, 10, "one durable and one ephemeral pop parked")
        b.proc.terminate()
        answers = await asyncio.wait_for(asyncio.gather(*pops), 45)
        exit_code = await asyncio.to_thread(b.proc.wait, 45)
    assert [(a.status_code, a.json()) for a in answers] == \
        [(e.status_code, e.json()) for e in expected]
    # Answered while stopping, each closes its connection: left open for the next request
    # (keep-alive), it would hold the stop until Sanic's graceful timeout ran out.
    assert [a.headers.get("connection") for a in answers] == ["close", "close"]
    assert exit_code == 0
    assert "2 parked long poll(s) answered empty" in b.log()
