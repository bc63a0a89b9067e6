"""Invariants of the pop-waiter registry and long_poll (actors/pop_waiters.py).

No HTTP and no database: `attempt` is a fake that records its calls.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.pop_waiters import (
    HINT_MAILBOX_SIZE,
    PopWaiterRegistry,
    Waiter,
    backoff_interval_ms,
    long_poll,
)
from tests.waiting import wait_until_async

DEFAULTS = {"initial_ms": 100, "threshold": 3, "multiplier": 2.0, "max_ms": 1000}
# A timer so long that a test finishing well within WAKE_BOUND_S proves a wake did it: a wake
# answers in milliseconds, so the bound is wide enough for a loaded machine and still far
# below the timer.
SLOW_TIMER = {"initial_ms": 60_000, "threshold": 3, "multiplier": 2.0, "max_ms": 60_000}
WAKE_BOUND_S = 10


class FakeAttempt:
    """Returns the queued results in turn (then falsy); records hints passed."""

    def __init__(self, *results: object) -> None:
        self.results = list(results)
        self.calls: list[list[str]] = []
        self.called = asyncio.Event()

    async def __call__(self, hints: list[str]) -> object:
        self.calls.append(hints)
        self.called.set()
        return self.results.pop(0) if self.results else []


@pytest.fixture
async def registry():
    ref = PopWaiterRegistry.start()
    yield ref
    await ref.stop(block=False)


async def wait_parked(registry, count: int) -> None:
    async def parked() -> bool:
        return await registry.proxy().parked_count() == count
    await wait_until_async(parked, 5, f"{count} parked pops")


# --- backoff schedule -----------------------------------------------------


def test_backoff_documented_sequence():
    intervals = [backoff_interval_ms(k, **DEFAULTS) for k in range(1, 10)]
    assert intervals == [100, 100, 100, 200, 400, 800, 1000, 1000, 1000]


def test_backoff_is_initial_up_to_threshold_monotone_and_capped():
    intervals = [backoff_interval_ms(k, **DEFAULTS) for k in range(1, 2000)]
    assert intervals[:3] == [100, 100, 100]
    assert all(a <= b for a, b in zip(intervals, intervals[1:]))
    assert max(intervals) == 1000  # also no overflow for very long parks


# --- registry messages ------------------------------------------------------


async def test_wake_sets_only_waiters_of_that_queue_and_the_any_queue_gate(registry):
    on_a, on_b, on_any = Waiter("a"), Waiter("b"), Waiter(None)
    for waiter in (on_a, on_b, on_any):
        registry.proxy().register(waiter)
    assert await registry.proxy().wake("a", "p1") == 2
    assert on_a.event.is_set() and on_any.event.is_set()
    assert not on_b.event.is_set()
    assert await registry.proxy().stats() == {"parked": 3, "queues": 2}


async def test_wake_many_wakes_each_waiter_once(registry):
    on_a, on_b = Waiter("a"), Waiter("b")
    registry.proxy().register(on_a)
    registry.proxy().register(on_b)
    woken = await registry.proxy().wake_many([("a", "p1"), ("a", "p2"), ("b", None)])
    assert woken == 2
    assert await registry.proxy().take_hints("a", 10) == ["p1", "p2"]
    assert await registry.proxy().take_hints("b", 10) == []


async def test_hints_are_deduplicated_fifo_and_consumed(registry):
    registry.proxy().register(Waiter("q"))
    for partition in ["p1", "p2", "p1", "p3", "", None]:  # empty ones: no hint
        await registry.proxy().wake("q", partition)
    assert await registry.proxy().take_hints("q", 2) == ["p1", "p2"]
    assert await registry.proxy().take_hints("q", 2) == ["p3"]
    assert await registry.proxy().take_hints("q", 2) == []


async def test_hints_are_bounded_and_drop_the_oldest(registry):
    registry.proxy().register(Waiter("q"))
    extra = 6
    await registry.proxy().wake_many(
        [("q", f"p{i}") for i in range(HINT_MAILBOX_SIZE + extra)]
    )
    hints = await registry.proxy().take_hints("q", 1000)
    assert HINT_MAILBOX_SIZE == 64
    assert hints == [f"p{i}" for i in range(extra, HINT_MAILBOX_SIZE + extra)]


async def test_no_hint_is_stored_for_a_queue_nobody_polls(registry):
    assert await registry.proxy().wake("unpolled", "p1") == 0
    registry.proxy().register(Waiter("unpolled"))
    assert await registry.proxy().take_hints("unpolled", 10) == []
    assert await registry.proxy().stats() == {"parked": 1, "queues": 1}


# --- long_poll --------------------------------------------------------------


async def test_found_on_first_attempt_returns_without_parking(registry):
    attempt = FakeAttempt(["msg"])
    result = await long_poll(registry, "q", attempt, time.monotonic() + 5, **DEFAULTS)
    assert result == ["msg"]
    assert attempt.calls == [[]]
    assert await registry.proxy().parked_count() == 0


async def test_wake_makes_a_parked_poll_recheck_long_before_the_timer(registry):
    attempt = FakeAttempt([], ["msg"])
    started = time.monotonic()
    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, started + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    await registry.proxy().wake("q", "p7")
    assert await asyncio.wait_for(poll, timeout=WAKE_BOUND_S) == ["msg"]
    assert time.monotonic() - started < WAKE_BOUND_S  # the 60 s timer never fired
    assert attempt.calls == [[], ["p7"]]  # the woken attempt got the hint
    await wait_parked(registry, 0)


async def test_wake_on_another_queue_does_not_wake_it(registry):
    attempt = FakeAttempt()
    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    assert await registry.proxy().wake("other", "p1") == 0
    await asyncio.sleep(0.05)
    assert attempt.calls == [[]]  # still parked, no re-check
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll


async def test_any_queue_waiter_is_woken_by_a_push_to_any_queue(registry):
    attempt = FakeAttempt([], ["msg"])
    poll = asyncio.create_task(
        long_poll(registry, None, attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    assert await registry.proxy().wake("whatever", "p1") == 1
    assert await asyncio.wait_for(poll, timeout=WAKE_BOUND_S) == ["msg"]
    assert attempt.calls == [[], []]  # no per-queue mailbox for discovery pops


class FakeClock:
    """``time.monotonic`` for pop_waiters, moved on only by the fake wait below."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def test_deadline_clips_the_last_sleep_and_returns_the_empty_result(registry, monkeypatch):
    # On a fake clock, so the schedule is exact whatever the machine's load: every wait
    # times out after exactly the timeout it was given.
    import actors.pop_waiters as pop_waiters

    clock = FakeClock()
    waits: list[int] = []

    async def timer_fires(event: asyncio.Event, timeout: float) -> bool:
        waits.append(round(timeout * 1000))
        clock.now += timeout
        return False

    monkeypatch.setattr(pop_waiters, "time", clock)
    monkeypatch.setattr(pop_waiters, "_wait_for_wake", timer_fires)
    attempt = FakeAttempt()
    deadline = clock.now + 0.35
    result = await long_poll(registry, "q", attempt, deadline, **DEFAULTS)
    assert result == []
    # Re-checks after 0.1, 0.2 and 0.3 s; the last sleep is clipped to the 50 ms left, and
    # the poll returns at the deadline without another attempt.
    assert waits == [100, 100, 100, 50]
    assert len(attempt.calls) == 4
    assert clock.now == pytest.approx(deadline)
    await wait_parked(registry, 0)


async def test_deadline_answers_long_before_the_next_timer(registry):
    # On the real clock: the next re-check is a minute away, so a poll that slept it out
    # instead of stopping at its deadline would answer ~60 s late. The bound is generous
    # (a loaded machine delays the loop by far less) and still catches that.
    attempt = FakeAttempt()
    deadline = time.monotonic() + 0.3
    result = await long_poll(registry, "q", attempt, deadline, **SLOW_TIMER)
    finished = time.monotonic()
    assert result == []
    assert deadline <= finished < deadline + WAKE_BOUND_S
    await wait_parked(registry, 0)


async def test_cancelling_the_poll_unparks_it_and_stops_attempts(registry):
    attempt = FakeAttempt()
    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    assert await registry.proxy().parked_count() == 0  # no polling needed: FIFO inbox
    await registry.proxy().wake("q", "p1")
    await asyncio.sleep(0.05)
    assert attempt.calls == [[]]
    assert await registry.proxy().stats() == {"parked": 0, "queues": 0}


async def test_a_wake_during_an_attempt_is_not_lost(registry):
    release = asyncio.Event()
    calls: list[list[str]] = []

    async def attempt(hints: list[str]) -> list[str]:
        calls.append(hints)
        if len(calls) == 2:  # the woken re-check: a second push lands meanwhile
            await registry.proxy().wake("q", "p2")
            await release.wait()
        return ["msg"] if len(calls) == 3 else []

    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    await registry.proxy().wake("q", "p1")
    await wait_until_async(lambda: len(calls) >= 2, 5, "the woken re-check")
    release.set()
    assert await asyncio.wait_for(poll, timeout=WAKE_BOUND_S) == ["msg"]
    assert calls == [[], ["p1"], ["p2"]]


async def test_backoff_counter_resets_after_a_wake(registry, monkeypatch):
    # Replace the wait itself: record each timeout and answer "timer fired"
    # at once, except the 5th wait, which answers "woken".
    import actors.pop_waiters as pop_waiters

    waits: list[int] = []

    async def fake_wait(event: asyncio.Event, timeout: float) -> bool:
        waits.append(round(timeout * 1000))
        return len(waits) == 5

    monkeypatch.setattr(pop_waiters, "_wait_for_wake", fake_wait)
    attempt = FakeAttempt(*[[]] * 7, ["msg"])
    result = await long_poll(registry, "q", attempt, time.monotonic() + 30, **DEFAULTS)
    assert result == ["msg"]
    # k = 1..5 on the timer, then woken: k restarts at 1.
    assert waits == [100, 100, 100, 200, 400, 100, 100]
