"""Parked long-poll pops, and the registry that wakes them after a push.

A pop that finds nothing parks instead of returning: it re-checks on a backoff
timer, and sooner when `PopWaiterRegistry.wake()` reports a committed push to
its queue. A parked pop holds no database connection: `long_poll()` runs in
the HTTP handler's task and only talks to the registry through messages, so
the registry actor never does database work.

Wakes come from this broker's own commits (pushes, and acks that release a
lease) and, with a mesh, from the peers' (actors/hints.py sends and receives
both); without a mesh, a push through another broker is seen at the backoff
re-check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, cast

from pykka import ActorDeadError, ActorRef
from pykka.messages import ProxyCall

from actors.runtime import AsyncioActor, AsyncioFuture

__all__ = ["PopWaiterRegistry", "Waiter", "backoff_interval_ms", "long_poll"]

R = TypeVar("R")

# Per-queue partition hints kept for woken pops to drain.
HINT_MAILBOX_SIZE = 64


def backoff_interval_ms(
    k: int, initial_ms: float, threshold: int, multiplier: float, max_ms: float
) -> float:
    """Sleep before the next re-check, after the k-th consecutive empty one (k >= 1).

    The first `threshold` re-checks wait `initial_ms`; after that the wait
    grows by `multiplier` per empty re-check, never beyond `max_ms`.
    With the defaults (100, 3, 2.0, 1000): 100, 100, 100, 200, 400, 800, 1000, ...
    """
    if k <= threshold:
        return min(initial_ms, max_ms)
    try:
        interval = initial_ms * multiplier ** (k - threshold)
    except OverflowError:  # a pop parked for a very long time
        return max_ms
    return min(interval, max_ms)


class Waiter:
    """One parked pop. `event` is set by the registry to wake it.

    The event stays set until the pop next waits, so a wake that lands while
    the pop is busy re-checking is not lost.
    """

    __slots__ = ("event", "queue")

    def __init__(self, queue: str | None) -> None:
        self.queue = queue  # None: woken by a push to any queue
        self.event = asyncio.Event()


class PopWaiterRegistry(AsyncioActor):
    """Parked pops by queue, and partition hints for the queues they wait on.

    A queue's hint mailbox exists only while some pop is parked on that queue,
    so pushes to queues nobody polls allocate nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        # queue name (None = the "any push" gate) -> parked waiters
        self._waiters: dict[str | None, set[Waiter]] = {}
        # queue name -> pending partition hints; a dict is an ordered set
        # (FIFO, no duplicates). Values are unused.
        self._hints: dict[str, dict[str, None]] = {}

    def register(self, waiter: Waiter) -> None:
        self._waiters.setdefault(waiter.queue, set()).add(waiter)
        if waiter.queue is not None:
            self._hints.setdefault(waiter.queue, {})

    def unregister(self, waiter: Waiter) -> None:
        waiters = self._waiters.get(waiter.queue)
        if waiters is None:
            return
        waiters.discard(waiter)
        if not waiters:
            del self._waiters[waiter.queue]
            # Nobody left to use the hints: pops that park later start with a
            # fresh re-check anyway.
            self._hints.pop(waiter.queue, None)  # type: ignore[arg-type]

    def wake(self, queue: str, partition: str | None = None) -> int:
        """A push to (queue, partition) committed. Returns how many pops were woken."""
        return self.wake_many([(queue, partition)])

    def wake_many(self, pushes: Iterable[tuple[str, str | None]]) -> int:
        """Like `wake()` for several (queue, partition) pairs; each pop is woken once."""
        woken: set[Waiter] = set()
        any_push = False
        for queue, partition in pushes:
            any_push = True
            waiters = self._waiters.get(queue)
            if not waiters:
                continue
            woken.update(waiters)
            if partition:
                self._add_hint(queue, partition)
        if any_push:
            woken.update(self._waiters.get(None, ()))
        for waiter in woken:
            waiter.event.set()
        return len(woken)

    def _add_hint(self, queue: str, partition: str) -> None:
        hints = self._hints[queue]
        if partition in hints:
            return  # keeps its place in line
        hints[partition] = None
        if len(hints) > HINT_MAILBOX_SIZE:
            del hints[next(iter(hints))]  # drop the oldest

    def take_hints(self, queue: str, n: int) -> list[str]:
        """Remove and return up to n distinct hinted partitions of `queue`, oldest first."""
        hints = self._hints.get(queue)
        if not hints:
            return []
        taken = []
        for partition in list(hints)[:n]:
            del hints[partition]
            taken.append(partition)
        return taken

    def parked_count(self) -> int:
        return sum(len(waiters) for waiters in self._waiters.values())

    def stats(self) -> dict[str, int]:
        """Parked pops, and named queues with at least one parked pop."""
        queues = sum(1 for queue in self._waiters if queue is not None)
        return {"parked": self.parked_count(), "queues": queues}


def _call(ref: ActorRef[Any], method: str, *args: Any) -> AsyncioFuture[Any]:
    # A ProxyCall straight to the inbox: building an ActorProxy would
    # introspect the actor on every long poll.
    # An AsyncioActor's inbox answers with an AsyncioFuture (see actors/runtime.py).
    return cast(AsyncioFuture[Any],
                ref.ask(ProxyCall(attr_path=(method,), args=args, kwargs={}), block=False))


def _tell(ref: ActorRef[Any], method: str, *args: Any) -> None:
    ref.tell(ProxyCall(attr_path=(method,), args=args, kwargs={}))


async def _wait_for_wake(event: asyncio.Event, timeout: float) -> bool:
    """True when woken, False when `timeout` seconds passed first."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def long_poll(
    registry_ref: ActorRef[PopWaiterRegistry],
    queue: str | None,
    attempt: Callable[[list[str]], Awaitable[R]],
    deadline: float,
    *,
    initial_ms: float,
    threshold: int,
    multiplier: float,
    max_ms: float,
    hint_count: int = 4,
    recheck_by: Callable[[], float | None] = lambda: None,
) -> R:
    """Run `attempt` until it returns something truthy or `deadline` passes.

    `attempt(hints)` does one pop and returns a falsy result when it found
    nothing; `hints` are partitions recently pushed to (possibly empty).
    `deadline` is a `time.monotonic()` value. `queue=None` parks on the
    "any push" gate (pops that span queues). Returns the first truthy result,
    or the last empty one at the deadline. `recheck_by()` may name a
    `time.monotonic()` moment the next attempt must not wait past (the end of
    a lease the last attempt found: nothing wakes a pop when a lease expires).
    """
    result = await attempt([])
    if result or time.monotonic() >= deadline:
        return result

    waiter = Waiter(queue)
    # A tell, not an ask: the inbox is FIFO, so any wake sent after this
    # already finds the waiter, without making every pop wait for a reply.
    _tell(registry_ref, "register", waiter)
    try:
        empty_rechecks = 1  # k: the attempt above was the first empty one
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return result
            interval = backoff_interval_ms(
                empty_rechecks, initial_ms, threshold, multiplier, max_ms
            ) / 1000
            due = recheck_by()
            if due is not None:
                interval = min(interval, max(0.0, due - time.monotonic()))
            if await _wait_for_wake(waiter.event, min(interval, remaining)):
                # Clear before draining, so a wake during the next attempt
                # makes the following wait return at once.
                waiter.event.clear()
                hints = []
                if queue is not None and hint_count > 0:
                    hints = await _call(registry_ref, "take_hints", queue, hint_count)
                empty_rechecks = 0
            else:
                if time.monotonic() >= deadline:
                    return result  # the clipped last sleep: time is up
                hints = []
            result = await attempt(hints)
            if result:
                return result
            empty_rechecks += 1
    finally:
        # Also on cancellation (the client went away): a tell needs no await,
        # so it cannot be interrupted by a second cancel.
        try:
            _tell(registry_ref, "unregister", waiter)
        except ActorDeadError:
            pass  # registry already stopped (shutdown): nothing to clean up
