"""No thundering herd: a committed push wakes, per queue and consumer group, only
as many parked long polls as it can satisfy, and timer re-checks of many parked pops on one
queue are shared. Counted through /health's ``shared_state.longPolls`` figures (claim
statements issued, timer re-checks and how many of them another pop's check answered), never
timed.
"""
from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import start_broker
from tests.waiting import wait_until_async

NEVER_MS = "120000"  # parked pops' timer: never fires while a test runs
PARKED = 40


@pytest.fixture(scope="module")
def no_timer_broker(database, tmp_path_factory):
    b = start_broker(database, tmp_path_factory.mktemp("herd"),
                     POP_WAIT_INITIAL_INTERVAL_MS=NEVER_MS, POP_WAIT_MAX_INTERVAL_MS=NEVER_MS)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def fast_timer_broker(database, tmp_path_factory):
    b = start_broker(database, tmp_path_factory.mktemp("herd-timer"),
                     POP_WAIT_INITIAL_INTERVAL_MS="50", POP_WAIT_MAX_INTERVAL_MS="50")
    yield b
    b.stop()


async def figures(client: httpx.AsyncClient) -> dict:
    return (await client.get("/health")).json()["shared_state"]["longPolls"]


async def wait_parked(client: httpx.AsyncClient, n: int) -> dict:
    async def parked() -> dict | None:
        f = await figures(client)
        return f if f["parked"] == n else None
    return await wait_until_async(parked, 30, f"{n} parked pops", interval=0.05)


def park(client: httpx.AsyncClient, queue: str, n: int, group: str | None = None
         ) -> list[asyncio.Task]:
    params = {"wait": "true", "timeout": "60000"}
    if group:
        params["consumerGroup"] = group
    return [asyncio.create_task(client.get(f"/api/v1/pop/queue/{queue}", params=params))
            for _ in range(n)]


async def push(client: httpx.AsyncClient, queue: str, partitions: list[str]) -> None:
    r = await client.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": p, "payload": {"p": p}} for p in partitions]})
    assert r.status_code in (200, 201), r.text


async def first_answers(tasks: list[asyncio.Task], n: int) -> list[dict]:
    """The bodies of the first ``n`` pops to answer (bounded wait)."""
    done: set[asyncio.Task] = set()
    async with asyncio.timeout(30):
        while len(done) < n:
            finished, _ = await asyncio.wait([t for t in tasks if t not in done],
                                             return_when=asyncio.FIRST_COMPLETED)
            done |= finished
    return [t.result().json() for t in done]


async def cancel(tasks: list[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_push_to_a_queue_with_many_parked_pops_runs_one_claim(no_timer_broker,
                                                                        queue_name):
    limits = httpx.Limits(max_connections=PARKED + 10)
    async with httpx.AsyncClient(base_url=no_timer_broker.url, timeout=90,
                                 limits=limits) as client:
        tasks = park(client, queue_name, PARKED)
        try:
            before = await wait_parked(client, PARKED)
            await push(client, queue_name, ["p0"])
            [body] = await first_answers(tasks, 1)
            assert [m["data"] for m in body["messages"]] == [{"p": "p0"}]
            after = await wait_parked(client, PARKED - 1)  # the others keep waiting
            # One claim statement for the push, not one per parked pop (the herd: 40).
            assert after["claimQueries"] - before["claimQueries"] == 1
            assert after["woken"] - before["woken"] == 1

            # The others get later messages, each exactly one, nothing twice.
            rest = [f"p{i}" for i in range(1, PARKED)]
            await push(client, queue_name, rest)
            bodies = await first_answers(tasks, PARKED)
            got = sorted(m["data"]["p"] for b in bodies for m in b["messages"])
            assert got == sorted(["p0", *rest])
            final = await figures(client)
            assert final["parked"] == 0
            assert final["claimQueries"] - after["claimQueries"] <= 2 * len(rest)
        finally:
            await cancel(tasks)


async def test_a_push_wakes_one_parked_pop_per_consumer_group(no_timer_broker, queue_name):
    limits = httpx.Limits(max_connections=PARKED + 10)
    async with httpx.AsyncClient(base_url=no_timer_broker.url, timeout=90,
                                 limits=limits) as client:
        a = park(client, queue_name, PARKED // 2, "group-a")
        b = park(client, queue_name, PARKED // 2, "group-b")
        try:
            before = await wait_parked(client, PARKED)
            await push(client, queue_name, ["only"])
            [from_a] = await first_answers(a, 1)
            [from_b] = await first_answers(b, 1)
            for body, group in ((from_a, "group-a"), (from_b, "group-b")):
                assert body["consumerGroup"] == group
                assert [m["data"] for m in body["messages"]] == [{"p": "only"}]
            after = await wait_parked(client, PARKED - 2)
            assert after["claimQueries"] - before["claimQueries"] == 2
        finally:
            await cancel(a + b)


async def test_timer_rechecks_of_pops_parked_on_one_queue_are_shared(fast_timer_broker,
                                                                     queue_name):
    limits = httpx.Limits(max_connections=PARKED + 10)
    async with httpx.AsyncClient(base_url=fast_timer_broker.url, timeout=90,
                                 limits=limits) as client:
        tasks = park(client, queue_name, PARKED)
        try:
            before = await wait_parked(client, PARKED)

            async def many_rechecks() -> dict | None:
                f = await figures(client)
                return f if f["timerRechecks"] - before["timerRechecks"] >= 10 * PARKED else None
            after = await wait_until_async(many_rechecks, 60, "ten re-checks per parked pop",
                                           interval=0.1)
            rechecks = after["timerRechecks"] - before["timerRechecks"]
            claims = after["claimQueries"] - before["claimQueries"]
            # One query per timer re-check without sharing; about one per interval with it.
            assert claims * 4 <= rechecks, (claims, rechecks)
            assert after["sharedRechecks"] > before["sharedRechecks"]
            # Nothing lost: a push is still served, and the rest keep waiting.
            await push(client, queue_name, ["late"])
            [body] = await first_answers(tasks, 1)
            assert [m["data"] for m in body["messages"]] == [{"p": "late"}]
        finally:
            await cancel(tasks)
