"""The event loop's lag, for ``GET /health/live`` (broker/service/health.py): a task asks
the loop to wake it every ``INTERVAL_S`` and records how much later than asked it woke,
that is how long other work held the loop."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

INTERVAL_S = 0.5  # how often the monitor measures the loop's lag
WINDOW_S = 10.0  # how far back a lag counts


class LoopMonitor:
    """The event loop's lag, measured by a task that sleeps ``INTERVAL_S`` and sees how
    much later than asked it woke. ``tick`` and ``verdict`` take the time so that they can
    be checked without a loop."""

    def __init__(self, max_lag_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_lag_s = max_lag_s
        self.clock = clock
        self.last_tick = clock()  # the start counts as a tick: a monitor not yet run is live
        self.lags: deque[tuple[float, float]] = deque()  # (when, lag) over the last WINDOW_S

    def tick(self, now: float, lag: float) -> None:
        self.last_tick = now
        self.lags.append((now, lag))
        while self.lags and self.lags[0][0] < now - WINDOW_S:
            self.lags.popleft()

    def verdict(self, now: float) -> tuple[bool, float]:
        """(live, the worst lag seen in the window, or the time since the last tick when
        that is worse: a loop held right now, or a monitor that stopped)."""
        worst = max((lag for when, lag in self.lags if when >= now - WINDOW_S), default=0.0)
        silent = now - self.last_tick - INTERVAL_S
        worst = max(worst, silent)
        return worst <= self.max_lag_s, worst

    async def run(self) -> None:
        while True:
            asked = self.clock() + INTERVAL_S
            await asyncio.sleep(INTERVAL_S)
            now = self.clock()
            self.tick(now, max(0.0, now - asked))
