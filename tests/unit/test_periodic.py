"""The periodic actors' shared lifecycle (actors/periodic.py): the loop starts with the
actor, a wake ends its pause, its passes are a signal a test waits on, and a stop cancels
the loop and waits for its end. The three periodic actors run on this base."""
from __future__ import annotations

import asyncio

import pytest

from actors.leader_jobs import PeriodicJob
from actors.periodic import PeriodicActor, Signal
from actors.runtime import stop_all
from actors.staging_merger import StagingMerger
from actors.timer_sweeper import TimerSweeper

HOUR = 3600.0
LIMIT = 10.0  # bounds how long a broken run takes to fail; nothing here is timed


class Ticker(PeriodicActor):
    """Counts its passes and pauses an hour after each, unless woken."""

    loop_name = "ticker"

    def __init__(self) -> None:
        super().__init__()
        self.woken = 0
        self.ended = asyncio.Event()

    async def _loop(self) -> None:
        try:
            while True:
                self.passed.fire()
                if await self._pause(HOUR):
                    self.woken += 1
        finally:
            self.ended.set()


@pytest.fixture
async def ticker():
    ref = Ticker.start()
    try:
        yield ref
    finally:
        await stop_all()


async def test_the_loop_runs_from_the_start_and_a_wake_ends_its_pause(ticker):
    passed = await ticker.proxy().passed
    await asyncio.wait_for(passed.reached(1), LIMIT)  # started with the actor
    await ticker.proxy().wake()
    assert await asyncio.wait_for(passed.reached(2), LIMIT) == 2  # not an hour later
    assert await ticker.proxy().woken == 1


async def test_a_stop_cancels_the_loop_and_waits_for_its_end(ticker):
    proxy = ticker.proxy()
    ended = await proxy.ended
    await asyncio.wait_for((await proxy.passed).reached(1), LIMIT)
    await ticker.stop(block=False)
    assert ended.is_set()  # the loop's finally ran before the stop returned


async def test_a_signal_answers_at_once_when_reached_and_later_when_fired():
    signal = Signal()
    signal.fire()
    assert await signal.reached(1) == 1
    waiting = asyncio.ensure_future(signal.reached(3))
    signal.fire()
    await asyncio.sleep(0)
    assert not waiting.done()
    signal.fire()
    assert await asyncio.wait_for(waiting, LIMIT) == 3


def test_the_merger_the_sweeper_and_the_jobs_share_the_base():
    assert all(issubclass(cls, PeriodicActor) for cls in (StagingMerger, TimerSweeper,
                                                           PeriodicJob))
