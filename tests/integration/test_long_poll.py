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
