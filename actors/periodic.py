"""PeriodicActor: the lifecycle every actor with a loop of its own shares.

The staging merger, the timer sweeper and the leader jobs each work on their own schedule:
one loop task, started when the actor starts and cancelled (and awaited) when it stops.
The base owns that task and the pause between two passes of the loop; each subclass writes
only its loop (``_loop``), which decides when to work and how long to pause.

* ``wake()`` cuts the current pause short (a kick, a timer announced here). A wake that
  comes while the loop works is not remembered across the next pause: the loop reads the
  state it needs (a count, the soonest due time) before pausing, as each loop says.
* ``passed`` is a :class:`Signal` the loop fires after each pass, so a test waits for
  "the loop ran n times" (``await actor.passed.reached(n)``) instead of polling figures.
"""
from __future__ import annotations

import asyncio

from actors.runtime import AsyncioActor

__all__ = ["PeriodicActor", "Signal", "cancel_and_wait"]


class Signal:
    """A count tests can wait on: the owner fires it, ``await signal.reached(n)`` returns
    once it fired ``n`` times in all (at once when it already has)."""

    def __init__(self) -> None:
        self.count = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def fire(self) -> None:
        self.count += 1
        still = []
        for n, future in self._waiting:
            if future.done():
                continue
            if self.count >= n:
                future.set_result(None)
            else:
                still.append((n, future))
        self._waiting = still

    async def reached(self, n: int) -> int:
        if self.count < n:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((n, future))
            await future
        return self.count


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a task and wait until it ended (its ``finally`` blocks ran)."""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class PeriodicActor(AsyncioActor):
    """An actor running ``_loop()`` as a task from its start to its stop; see the module
    docstring. Subclasses set ``loop_name`` (the task's name) and write ``_loop``."""

    loop_name = "periodic"  # the loop task's name

    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.passed = Signal()

    def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.loop_name)

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        await cancel_and_wait(self._task)

    def wake(self) -> None:
        """End the loop's current pause now."""
        self._wake.set()

    async def _pause(self, seconds: float) -> bool:
        """Pause up to ``seconds``, or until ``wake()``; True when woken."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _loop(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
