"""When the TimerSweeper (actors/timer_sweeper.py) sweeps, through its messages.

No database: ``deliver`` is a fake that answers what a sweep would (timers taken, seconds
until the next one) and records each call. The idle poll (``MAX_SLEEP_S``) is set to an
hour, so every sweep after the first one that these tests see within their generous
timeouts was caused by the rule under test, not by the poll: the tests assert causes,
never how fast a sweep came.
"""
from __future__ import annotations

import asyncio

import pytest

import actors.timer_sweeper as timer_sweeper
from actors.timer_sweeper import TimerSweeper
from tests.waiting import wait_until_async

BATCH = 5
HOUR = 3600.0


class FakeDeliver:
    """Answers the queued (taken, next_due) pairs in turn, then (0, None): nothing pending.
    An item that is an exception is raised instead. ``gate``, when set, holds sweep
    number ``gate_at`` until the test opens it."""

    def __init__(self, *answers: object, gate_at: int | None = None) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate_at = gate_at
        self.entered = asyncio.Event()

    async def __call__(self) -> tuple[int, float | None]:
        self.calls += 1
        if self.calls == self.gate_at:
            self.entered.set()
            await self.gate.wait()
        answer = self.answers.pop(0) if self.answers else (0, None)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def no_idle_poll(monkeypatch):
    monkeypatch.setattr(timer_sweeper, "MAX_SLEEP_S", HOUR)


async def started(deliver: FakeDeliver):
    ref = TimerSweeper.start(deliver, batch=BATCH)
    await wait_until_async(lambda: deliver.calls >= 1, 10, "the first sweep")
    return ref


async def sweeps(deliver: FakeDeliver, n: int, what: str) -> None:
    await wait_until_async(lambda: deliver.calls >= n, 10, what)


async def test_idle_sweeper_sleeps_until_told():
    """Nothing pending: no sweep until a timer committed here announces itself (due_in)."""
    deliver = FakeDeliver()
    ref = await started(deliver)
    try:
        await asyncio.sleep(0.2)  # a chance to sweep again, which it must not take
        assert deliver.calls == 1
        await ref.proxy().due_in(0.0)
        await sweeps(deliver, 2, "the sweep due_in asked for")
    finally:
        await ref.stop(block=False)


async def test_next_due_from_the_sweep_schedules_the_next_one():
    """A sweep that reads the next timer due in 50 ms sweeps again then (it would
    otherwise sleep an hour), and a timer announced for later does not postpone it."""
    deliver = FakeDeliver((0, 0.05))
    ref = await started(deliver)
    try:
        await ref.proxy().due_in(HOUR / 2)
        await sweeps(deliver, 2, "the sweep at the next timer's time")
    finally:
        await ref.stop(block=False)


async def test_full_batch_sweeps_again_at_once():
    deliver = FakeDeliver((BATCH, None), (BATCH, None))
    ref = await started(deliver)
    try:
        await sweeps(deliver, 3, "two more sweeps after full batches")
        await asyncio.sleep(0.2)
        assert deliver.calls == 3  # the third took less than a batch: asleep again
    finally:
        await ref.stop(block=False)


@pytest.mark.parametrize("outcome", [(0, None), ConnectionError("database gone")],
                         ids=["sweep-succeeds", "sweep-fails"])
async def test_due_in_during_a_sweep_is_kept(outcome):
    """A timer committed while a sweep runs (which may not have seen it) is swept for
    after that sweep, whether the sweep succeeded or failed."""
    deliver = FakeDeliver((0, None), outcome, gate_at=2)
    ref = await started(deliver)
    try:
        await ref.proxy().due_in(0.0)  # wakes sweep 2, which the gate holds
        await asyncio.wait_for(deliver.entered.wait(), 10)
        await ref.proxy().due_in(0.0)  # announced during sweep 2
        deliver.gate.set()
        await sweeps(deliver, 3, "the sweep for the timer announced during the last one")
        if isinstance(outcome, BaseException):
            stats = await ref.proxy().stats()
            assert stats["failures"] == 1 and "database gone" in stats["lastError"]
    finally:
        await ref.stop(block=False)
