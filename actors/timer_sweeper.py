"""TimerSweeper: delivers due timers as messages, on every broker.

Not leader-gated and no advisory lock: every broker sweeps, and PostgreSQL picks who
delivers what (due rows are claimed ``FOR UPDATE SKIP LOCKED`` and deleted in the
transaction that pushes them), so each timer is delivered by exactly one broker.

When it sleeps: until the earliest pending timer is due (as the last sweep read it),
never longer than ``MAX_SLEEP_S`` (a timer scheduled on another broker is seen within
that), never shorter than ``MIN_SLEEP_S`` unless told. A timer scheduled on this broker
tells it (``due_in``), so a sooner timer cuts the sleep short: its delivery waits for
its time plus one sweep, not for the next poll. A full batch sweeps again at once.

The sweep itself is injected (``deliver``: a coroutine answering how many timers it
took and the seconds until the next one is due), so this actor knows asyncio and
nothing of HTTP or SQL."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from loguru import logger

from actors.periodic import PeriodicActor
from broker.store.health import is_outage

MIN_SLEEP_S = 0.01
MAX_SLEEP_S = 1.0
WARN_EVERY_S = 30.0

Deliver = Callable[[], Awaitable[tuple[int, float | None]]]


class TimerSweeper(PeriodicActor):
    loop_name = "timer-sweeper"

    def __init__(self, deliver: Deliver, *, batch: int) -> None:
        super().__init__()
        self._deliver = deliver
        self._batch = batch
        # Loop time of the soonest timer announced by due_in since the last sweep began
        # (reset before each sweep: that sweep's own reading covers what came before).
        self._soonest: float | None = None
        self.sweeps = 0
        self.delivered = 0
        self.failures = 0
        self.last_error: str | None = None
        self._last_warning = 0.0

    def due_in(self, seconds: float) -> None:
        """A timer committed here is due in ``seconds``: sweep then if that is sooner."""
        at = asyncio.get_running_loop().time() + max(seconds, 0.0)
        if self._soonest is None or at < self._soonest:
            self._soonest = at
        self.wake()

    def stats(self) -> dict:
        return {"sweeps": self.sweeps, "delivered": self.delivered, "failures": self.failures,
                "lastError": self.last_error}

    async def _sweep(self) -> tuple[int, float | None]:
        self.sweeps += 1
        try:
            taken, next_due = await self._deliver()
        except Exception as exc:  # the loop goes on; a database outage ends by itself
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if is_outage(exc):  # the store's DatabaseHealth tells the outage
                logger.debug("timer sweeper: {}", self.last_error)
            elif time.monotonic() - self._last_warning > WARN_EVERY_S:
                self._last_warning = time.monotonic()
                logger.warning("timer sweeper: {}", self.last_error)
            return 0, None
        self.delivered += taken
        return taken, next_due

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._soonest = None
            taken, next_due = await self._sweep()
            self.passed.fire()
            if taken >= self._batch:
                continue
            pause = MAX_SLEEP_S if next_due is None else min(max(next_due, MIN_SLEEP_S),
                                                            MAX_SLEEP_S)
            target = loop.time() + pause
            while True:
                if self._soonest is not None:
                    target = min(target, self._soonest)
                left = target - loop.time()
                if left <= 0 or not await self._pause(left):
                    break
