"""LoopMonitor (broker/core/loop_lag.py): the measure behind /health/live."""
from __future__ import annotations

import asyncio
import time

from broker.core.loop_lag import INTERVAL_S, WINDOW_S, LoopMonitor
from tests.waiting import wait_until_async


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_small_lags_are_live():
    clock = Clock()
    m = LoopMonitor(1.0, clock)
    for _ in range(10):
        clock.now += INTERVAL_S
        m.tick(clock.now, 0.01)
    assert m.verdict(clock.now) == (True, 0.01)


def test_a_lag_past_the_threshold_is_stuck_until_it_leaves_the_window():
    clock = Clock()
    m = LoopMonitor(1.0, clock)
    clock.now += INTERVAL_S + 3.0
    m.tick(clock.now, 3.0)  # the loop was held 3 s
    assert m.verdict(clock.now) == (False, 3.0)
    while clock.now < 100.0 + WINDOW_S + 5:
        clock.now += INTERVAL_S
        m.tick(clock.now, 0.0)
    assert m.verdict(clock.now)[0] is True


def test_a_monitor_that_stopped_ticking_is_stuck():
    clock = Clock()
    m = LoopMonitor(1.0, clock)
    clock.now += INTERVAL_S + 0.5
    assert m.verdict(clock.now)[0] is True
    clock.now += 1.0  # no tick for 2 s: the loop is held right now, or the task is gone
    live, worst = m.verdict(clock.now)
    assert live is False and worst > 1.0


async def test_a_blocking_call_on_the_loop_is_measured():
    m = LoopMonitor(0.2)
    task = asyncio.get_running_loop().create_task(m.run())
    try:
        first = m.last_tick
        await wait_until_async(lambda: m.last_tick != first, 5,
                               "one tick, measured on a loop left free")
        assert m.verdict(time.monotonic())[0] is True
        time.sleep(INTERVAL_S + 0.5)  # the stimulus: a call that holds the loop
        await asyncio.sleep(0)
        live, worst = m.verdict(time.monotonic())
        assert live is False and worst >= 0.4
    finally:
        task.cancel()
