"""In-memory time series this broker keeps for the dashboard's charts (nothing is stored
in PostgreSQL, nothing survives a restart):

* throughput: messages pushed, popped and acknowledged through *this* broker, per
  second, for the last ``THROUGHPUT_SECONDS``; sampled once a second from the process
  counters (broker/core/telemetry.py), so a second's figure is the counters' difference;
* depth: every queue's pending figure as queen.stats holds it (the stats job counts it),
  read every ``depth_interval_s`` and kept for ``DEPTH_POINTS`` samples.

One actor owns both rings; its two loops only append, readers get copies.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from actors.runtime import AsyncioActor

THROUGHPUT_SECONDS = 900       # 15 minutes of per-second points
DEPTH_POINTS = 240             # 1 hour at the default 15 s


class LiveSeries(AsyncioActor):
    def __init__(self, totals: Callable[[], dict[str, int]],
                 depths: Callable[[], Awaitable[dict[str, int]]],
                 depth_interval_s: float = 15.0) -> None:
        super().__init__()
        self._totals = totals
        self._depths = depths
        self._depth_interval = depth_interval_s
        # (second, pushed, popped, acked); the second is a Unix time in whole seconds
        self.throughput: deque[tuple[int, int, int, int]] = deque(maxlen=THROUGHPUT_SECONDS)
        # (Unix time, {queue: pending or None (gone)} of the queues whose figure changed
        # since the sample before): with 1,000 mostly idle queues a sample costs only
        # what moved. _base holds the figures as of just before the oldest kept sample,
        # _current those of the newest.
        self.depth: deque[tuple[float, dict[str, int | None]]] = deque()
        self._base: dict[str, int] = {}
        self._current: dict[str, int] = {}
        self._last: dict[str, int] | None = None
        self._tasks: list[asyncio.Task] = []
        self.depth_failures = 0

    def on_start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._tick_loop(), name="live-throughput"),
                       loop.create_task(self._depth_loop(), name="live-depth")]

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- sampling ------------------------------------------------------------
    def sample(self, now: float | None = None) -> None:
        """Record the counters' growth since the previous sample under the current second
        (a late tick adds to the second it lands in; a second without a tick has no point,
        which readers show as zero)."""
        totals = self._totals()
        second = int(time.time() if now is None else now)
        if self._last is not None:
            pushed, popped, acked = (max(0, totals[k] - self._last[k])
                                     for k in ("pushed", "popped", "acked"))
            if self.throughput and self.throughput[-1][0] == second:
                _, a, b, c = self.throughput.pop()
                pushed, popped, acked = pushed + a, popped + b, acked + c
            self.throughput.append((second, pushed, popped, acked))
        self._last = dict(totals)

    async def _tick_loop(self) -> None:
        while True:
            self.sample()
            # wake just after the next whole second, so each tick lands in its own second
            await asyncio.sleep(1.0 - (time.time() % 1.0) + 0.01)

    async def sample_depth(self) -> None:
        try:
            depths = await self._depths()
        except Exception as exc:  # database down: a gap in the chart, not a dead loop
            self.depth_failures += 1
            logger.debug("depth sample failed: {}", exc)
            return
        self.record_depths(time.time(), depths)

    def record_depths(self, now: float, depths: dict[str, int]) -> None:
        changes: dict[str, int | None] = {q: v for q, v in depths.items()
                                          if self._current.get(q) != v}
        changes.update(dict.fromkeys(self._current.keys() - depths.keys()))
        if len(self.depth) >= DEPTH_POINTS:
            _, oldest = self.depth.popleft()
            _apply(self._base, oldest)
        self.depth.append((now, changes))
        _apply(self._current, changes)

    async def _depth_loop(self) -> None:
        while True:
            await self.sample_depth()
            await asyncio.sleep(self._depth_interval)

    # -- reading -------------------------------------------------------------
    def throughput_series(self, seconds: int, now: float | None = None) -> list[tuple[int, int, int, int]]:
        """One point per second of the last ``seconds`` complete seconds, oldest first
        (seconds with no sample read as zero)."""
        end = int(time.time() if now is None else now)  # the current second is incomplete
        start = end - seconds
        known = {p[0]: p for p in self.throughput if start <= p[0] < end}
        return [known.get(s, (s, 0, 0, 0)) for s in range(start, end)]

    def depth_series(self, queue: str) -> list[tuple[float, int | None]]:
        """(time, pending) of ``queue`` per sample, oldest first; None where the stats job
        had not counted the queue yet."""
        value = self._base.get(queue)
        out = []
        for t, changes in self.depth:
            if queue in changes:
                value = changes[queue]
            out.append((t, value))
        return out

    def stats(self) -> dict[str, Any]:
        return {"throughputPoints": len(self.throughput), "depthSamples": len(self.depth),
                "depthIntervalSeconds": self._depth_interval,
                "depthFailures": self.depth_failures}


def _apply(figures: dict[str, int], changes: dict[str, int | None]) -> None:
    for queue, value in changes.items():
        if value is None:
            figures.pop(queue, None)
        else:
            figures[queue] = value
