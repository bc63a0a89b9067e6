"""The Batcher actor, through its messages: concurrent requests fold into few
round trips, each request gets exactly its own results, and one request the
flush rejects never fails its neighbours."""
from __future__ import annotations

import asyncio

from actors.batcher import Batcher
from tests.waiting import wait_until_async


class Flush:
    """A stand-in for the SQL round trip: echoes items, records each call, can
    be held open (so requests pile up) and rejects items marked bad."""

    def __init__(self):
        self.calls: list[list] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, items):
        self.calls.append(list(items))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if any(item == "bad" for item in items):
                raise ValueError("rejected")
            return [f"ok:{item}" for item in items]
        finally:
            self.in_flight -= 1


async def submit(ref, items):
    return await (await ref.proxy().submit(items))


async def pending(ref, n: int) -> None:
    """Wait until ``n`` requests wait in the batcher behind the round trips in flight."""
    async def there() -> bool:
        return (await ref.proxy().stats())["pending"] == n
    await wait_until_async(there, 5, f"{n} pending requests")


async def flush_called(flush_calls: list, n: int) -> None:
    """Wait until the flush stub was entered ``n`` times (its round trips are in flight)."""
    await wait_until_async(lambda: len(flush_calls) == n, 5, f"{n} flush calls")


async def test_requests_waiting_behind_a_round_trip_go_out_together():
    flush = Flush()
    ref = Batcher.start(flush, max_items=1000, max_concurrent=1, name="t")
    try:
        flush.gate.clear()
        first = asyncio.create_task(submit(ref, ["a"]))
        await flush_called(flush.calls, 1)  # the first round trip is in flight, held open
        rest = [asyncio.create_task(submit(ref, [f"b{i}", f"c{i}"])) for i in range(10)]
        await pending(ref, 10)  # all ten wait behind it
        flush.gate.set()
        assert await first == ["ok:a"]
        results = await asyncio.gather(*rest)
        # Each request gets exactly its own results, in its own order...
        assert results == [[f"ok:b{i}", f"ok:c{i}"] for i in range(10)]
        # ...and the ten waiting requests went out as one round trip.
        assert len(flush.calls) == 2 and len(flush.calls[1]) == 20
    finally:
        await ref.stop(block=False)


async def test_a_rejected_request_does_not_fail_its_neighbours():
    flush = Flush()
    ref = Batcher.start(flush, max_items=1000, max_concurrent=1, name="t")
    try:
        flush.gate.clear()
        first = asyncio.create_task(submit(ref, ["a"]))
        await flush_called(flush.calls, 1)
        good = asyncio.create_task(submit(ref, ["g1"]))
        bad = asyncio.create_task(submit(ref, ["bad"]))
        good2 = asyncio.create_task(submit(ref, ["g2"]))
        await pending(ref, 3)  # the three fold into the next round trip
        flush.gate.set()
        await first
        assert await good == ["ok:g1"] and await good2 == ["ok:g2"]
        try:
            await bad
            raise AssertionError("the bad request should have failed")
        except ValueError as exc:
            assert "rejected" in str(exc)
    finally:
        await ref.stop(block=False)


async def test_round_trips_respect_the_item_and_concurrency_limits():
    flush = Flush()
    ref = Batcher.start(flush, max_items=5, max_concurrent=2, name="t")
    try:
        flush.gate.clear()
        tasks = [asyncio.create_task(submit(ref, [i, i])) for i in range(12)]
        # The first two requests go out at once, one each (a free slot never waits for more);
        # the other ten wait for a slot.
        await flush_called(flush.calls, 2)
        await pending(ref, 10)
        assert flush.in_flight == 2  # never more than max_concurrent at once
        flush.gate.set()
        results = await asyncio.gather(*tasks)
        assert results == [[f"ok:{i}", f"ok:{i}"] for i in range(12)]
        assert flush.max_in_flight == 2
        # a request is never split, and no round trip carries more than max_items
        # (a single request larger than max_items would still go out whole)
        assert all(len(call) <= 5 for call in flush.calls)
        assert sum(len(call) for call in flush.calls) == 24
    finally:
        await ref.stop(block=False)


async def test_an_idle_batcher_sends_a_lone_request_at_once():
    flush = Flush()
    ref = Batcher.start(flush, max_items=1000, max_concurrent=4, name="t")
    try:
        assert await asyncio.wait_for(submit(ref, ["solo"]), 1) == ["ok:solo"]
        stats = await ref.proxy().stats()
        assert stats["requests"] == 1 and stats["round_trips"] == 1
    finally:
        await ref.stop(block=False)


class Down(ConnectionError):
    pass


async def test_an_outage_fails_every_folded_request_at_once():
    """When the fold fails for a reason every request shares (the
    database is down), no request is retried alone: all fail in one round
    trip, so each caller can spool at once instead of waiting N timeouts."""
    calls: list[list] = []
    gate = asyncio.Event()

    async def flush(items):
        calls.append(list(items))
        await gate.wait()
        raise Down("connection refused")

    ref = Batcher.start(flush, max_items=1000, max_concurrent=1, name="t",
                        retry_alone=lambda exc: not isinstance(exc, Down))
    try:
        first = asyncio.create_task(submit(ref, ["a"]))
        await flush_called(calls, 1)  # the first round trip is in flight, held open
        rest = [asyncio.create_task(submit(ref, [f"b{i}"])) for i in range(5)]
        await pending(ref, 5)
        gate.set()
        outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
        assert all(isinstance(o, Down) for o in outcomes)
        assert [len(c) for c in calls] == [1, 5]  # one fold of five, never five singles
    finally:
        await ref.stop(block=False)
