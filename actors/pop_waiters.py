"""Parked long-poll pops, and the registry that wakes them after a push.

A pop that finds nothing parks instead of returning: it re-checks on a backoff
timer, and sooner when `PopWaiterRegistry.wake()` reports a committed push to
its queue. A parked pop holds no database connection: `long_poll()` runs in
the HTTP handler's task and only talks to the registry through messages, so
the registry actor never does database work.

No thundering herd. Parked pops that would run the same claim (same queue,
partition filter, namespace, task and consumer group) form a *cohort*. A push
to one partition can satisfy at most one pop of a cohort (a partition has one
leased batch per group at a time), so a committed push wakes, per cohort, one
parked pop per distinct partition it pushed to, the one that waited longest
(woken pops go to the back of the line, so none starves), and hands it the
partition as its hint. The others stay parked. A wake is never dropped on the
way: a pop that leaves (answered, deadline, client gone) with a wake it has
not used, or in the middle of the attempt a wake started, passes the wake on
to the next pop of its cohort; so does an auto-ack pop that took a full batch
(the partition may hold more, and no lease stops the next pop).

Timer re-checks are shared per cohort. A parked pop whose timer fires skips
its query when a pop of its cohort started an empty check later than the
check this pop last learnt from (or than the lease end it waited for), and
joins such a check while it runs. So a cohort of thousands of parked pops
issues about one timer query per re-check interval, not one per pop (and a
slow query is joined, not repeated, so a loaded database is not loaded more),
while a change nobody announces (a push through an unmeshed broker, a lease
running out) is still seen by the cohort's next check, within one interval.

Wakes come from this broker's own commits (pushes, and acks that release a
lease) and, with a mesh, from the peers' (actors/hints.py sends and receives
both); without a mesh, a push through another broker is seen at the backoff
re-check.

Threading: the registry actor and every `long_poll` run on the broker's one
event loop. A waiter's event, hints and cohort are plain objects both sides
touch without awaiting in between (like an `asyncio.Event`), so no message
round trip is spent per wake or per timer re-check.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, TypeVar

from pykka import ActorDeadError, ActorRef
from pykka.messages import ProxyCall

from actors.runtime import AsyncioActor

__all__ = ["Cohort", "PopWaiterRegistry", "Waiter", "backoff_interval_ms", "long_poll"]

R = TypeVar("R")

# Partition hints kept per woken pop (oldest dropped beyond this).
HINTS_PER_WAITER = 64


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


class Cohort:
    """Parked pops that run the same claim, and their shared re-check record.

    `waiters` is the line, longest-unwoken first. `last_empty` is the start
    time (time.monotonic) of the newest check by any member that found
    nothing; `probe` is the check running now (a future set to True when it
    found nothing), started at `probe_started`.
    """

    __slots__ = ("last_empty", "partition", "probe", "probe_started", "waiters")

    def __init__(self, partition: str | None) -> None:
        self.partition = partition  # the members' partition filter (None: any)
        self.waiters: dict[Waiter, None] = {}  # an ordered set
        self.last_empty = float("-inf")
        self.probe: asyncio.Future[bool] | None = None
        self.probe_started = float("-inf")

    def matches(self, partition: str | None) -> bool:
        return self.partition is None or partition is None or partition == self.partition

    def start_check(self, started: float) -> asyncio.Future[bool] | None:
        """A member starts a check: it becomes the probe others may join, unless one runs."""
        if self.probe is not None:
            return None
        self.probe = asyncio.get_running_loop().create_future()
        self.probe_started = started
        return self.probe

    def end_check(self, probe: asyncio.Future[bool] | None, started: float, empty: bool) -> None:
        if empty:
            self.last_empty = max(self.last_empty, started)
        if probe is not None:
            if self.probe is probe:
                self.probe = None
            if not probe.done():
                probe.set_result(empty)


class Waiter:
    """One parked pop. `event` is set by the registry to wake it, `hints` are
    the partitions it was woken for.

    The event stays set until the pop next waits, so a wake that lands while
    the pop is busy re-checking is not lost.
    """

    __slots__ = ("busy", "cohort", "event", "hints", "key", "partition", "queue")

    def __init__(self, queue: str | None, partition: str | None = None,
                 scope: Hashable = ()) -> None:
        self.queue = queue  # None: woken by a push to any queue
        self.partition = partition
        self.key = (partition, scope)  # the cohort within the queue
        self.event = asyncio.Event()
        self.hints: list[str] = []
        self.busy = False  # running an attempt
        self.cohort: Cohort | None = None  # set by the registry when it registers

    def hint(self, partition: str | None) -> None:
        if self.queue is None or not partition or partition in self.hints:
            return  # pops spanning queues take no per-queue hints
        self.hints.append(partition)
        if len(self.hints) > HINTS_PER_WAITER:
            del self.hints[0]


class PopWaiterRegistry(AsyncioActor):
    """Parked pops by queue and cohort. Wakes one pop per cohort and pushed
    partition, in line order."""

    def __init__(self) -> None:
        super().__init__()
        # queue name (None = the "any push" gate) -> cohort key -> cohort
        self._queues: dict[str | None, dict[Hashable, Cohort]] = {}
        self.counters: Counter[str] = Counter()  # woken, passed_on

    def register(self, waiter: Waiter) -> None:
        cohorts = self._queues.setdefault(waiter.queue, {})
        cohort = cohorts.get(waiter.key)
        if cohort is None:
            cohort = cohorts[waiter.key] = Cohort(waiter.partition)
        cohort.waiters[waiter] = None
        waiter.cohort = cohort

    def unregister(self, waiter: Waiter, pass_on: bool = False) -> None:
        """The pop left. `pass_on`: it holds a wake it did not use up; the next
        pop of its cohort gets it (with the hints it had)."""
        cohorts = self._queues.get(waiter.queue)
        cohort = cohorts.get(waiter.key) if cohorts is not None else None
        if cohorts is None or cohort is None or waiter not in cohort.waiters:
            return
        del cohort.waiters[waiter]
        if pass_on:
            woken: set[Waiter] = set()
            partitions: list[str | None] = [*waiter.hints] or [None]
            for partition in partitions:
                self._wake_one(cohort, partition, woken)
            self.counters["passed_on"] += len(woken)
        if not cohort.waiters:
            del cohorts[waiter.key]
            if not cohorts:
                del self._queues[waiter.queue]

    def wake(self, queue: str, partition: str | None = None) -> int:
        """A push to (queue, partition) committed. Returns how many pops were woken."""
        return self.wake_many([(queue, partition)])

    def wake_many(self, pushes: Iterable[tuple[str, str | None]]) -> int:
        """Pushes to these (queue, partition) pairs committed (partition None:
        some partition of the queue). Per cohort, one pop per distinct pair it
        could take; pops spanning queues, one per distinct pair. Returns how
        many pops were woken."""
        woken: set[Waiter] = set()
        by_queue: dict[str, dict[str | None, None]] = {}
        for queue, partition in pushes:
            by_queue.setdefault(queue, {})[partition or None] = None
        pairs = sum(len(parts) for parts in by_queue.values())
        for queue, parts in by_queue.items():
            for cohort in self._queues.get(queue, {}).values():
                for partition in parts:
                    if cohort.matches(partition):
                        self._wake_one(cohort, partition, woken)
        for cohort in self._queues.get(None, {}).values():
            for _ in range(pairs):
                if not self._wake_one(cohort, None, woken):
                    break  # every pop of it is woken already
        self.counters["woken"] += len(woken)
        return len(woken)

    @staticmethod
    def _wake_one(cohort: Cohort, partition: str | None, woken: set[Waiter]) -> bool:
        """Wake the longest-waiting pop of `cohort` not already woken (one busy
        re-checking only if no other is left) and send it to the back of the
        line. False when all are woken: the hint then rides with the first."""
        chosen = busy = None
        for waiter in cohort.waiters:
            if waiter.event.is_set() or waiter in woken:
                continue
            if not waiter.busy:
                chosen = waiter
                break
            if busy is None:
                busy = waiter
        chosen = chosen or busy
        if chosen is None:
            first = next(iter(cohort.waiters), None)
            if first is not None:
                first.hint(partition)
            return False
        chosen.hint(partition)
        chosen.event.set()
        woken.add(chosen)
        del cohort.waiters[chosen]
        cohort.waiters[chosen] = None
        return True

    def parked_count(self) -> int:
        return sum(len(c.waiters) for cohorts in self._queues.values() for c in cohorts.values())

    def stats(self) -> dict[str, int]:
        """Parked pops, and named queues with at least one parked pop."""
        queues = sum(1 for queue in self._queues if queue is not None)
        return {"parked": self.parked_count(), "queues": queues}

    def wake_stats(self) -> dict[str, int]:
        """Parked pops, their cohorts, pops woken by commits and wakes passed on."""
        return {"parked": self.parked_count(),
                "cohorts": sum(len(c) for c in self._queues.values()),
                "woken": self.counters["woken"], "passed_on": self.counters["passed_on"]}


def _tell(ref: ActorRef[Any], method: str, *args: Any) -> None:
    # A ProxyCall straight to the inbox: building an ActorProxy would
    # introspect the actor on every long poll.
    ref.tell(ProxyCall(attr_path=(method,), args=args, kwargs={}))


async def _wait_for_wake(event: asyncio.Event, timeout: float) -> bool:
    """True when woken, False when `timeout` seconds passed first."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def _answered_by_cohort(waiter: Waiter, since: float, deadline: float) -> float | None:
    """The start of an empty check of the waiter's cohort that started after
    `since` (waiting for one that is running, if it started after `since`), or
    None when the waiter must check itself."""
    cohort = waiter.cohort
    while cohort is not None and not waiter.event.is_set():
        if cohort.last_empty > since:
            return cohort.last_empty
        probe = cohort.probe
        if probe is None or cohort.probe_started <= since:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        await asyncio.wait([probe], timeout=remaining)
        # Empty: recorded in last_empty. Found something: the first pop past
        # here becomes the next probe, the others join it (more may be there).
    return None


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
    partition: str | None = None,
    scope: Hashable = (),
    more_after: Callable[[R], bool] = lambda result: False,
    counters: Counter[str] | None = None,
) -> R:
    """Run `attempt` until it returns something truthy or `deadline` passes.

    `attempt(hints)` does one pop and returns a falsy result when it found
    nothing; `hints` are partitions recently pushed to (possibly empty).
    `deadline` is a `time.monotonic()` value. `queue=None` parks on the
    "any push" gate (pops that span queues). Returns the first truthy result,
    or the last empty one at the deadline. `recheck_by()` may name a
    `time.monotonic()` moment the next attempt must not wait past (the end of
    a lease the last attempt found: nothing wakes a pop when a lease expires).

    `partition` and `scope` (with `queue`) name the pop's cohort: pops that
    would run the same claim. `more_after(result)`: the result may have left
    work for the next pop of the cohort (it is woken). `counters`, if given,
    counts `timer_rechecks` (timer fired), `shared_rechecks` (answered by a
    cohort member's check) and `attempts` (attempts run).
    """
    counts: Counter[str] = counters if counters is not None else Counter()
    counts["attempts"] += 1
    started_first = time.monotonic()
    result = await attempt([])
    if result or time.monotonic() >= deadline:
        return result

    waiter = Waiter(queue, partition, scope)
    # A tell, not an ask: the inbox is FIFO, so any wake sent after this
    # already finds the waiter, without making every pop wait for a reply.
    _tell(registry_ref, "register", waiter)
    unused_wake = False  # a wake taken, its attempt not finished
    # Start of the newest check that answered this pop (its own, or a cohort
    # member's): a re-check needs a check that started later.
    known_at = started_first
    try:
        empty_rechecks = 1  # k: the attempt above was the first empty one
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return result
            interval = backoff_interval_ms(
                empty_rechecks, initial_ms, threshold, multiplier, max_ms
            ) / 1000
            since = known_at  # a re-check needs news from after this
            due = recheck_by()  # set by this pop's own last attempt
            if due is not None and due <= known_at:
                due = None  # a cohort check after that lease end answered it already
            if due is not None and due - now < interval:
                interval = max(0.0, due - now)
                since = due  # a check before the lease ended proves nothing
            woken = await _wait_for_wake(waiter.event, min(interval, remaining))
            if woken:
                # Clear before draining, so a wake during the next attempt
                # makes the following wait return at once.
                waiter.event.clear()
                hints, waiter.hints = waiter.hints[:hint_count], waiter.hints[hint_count:]
                empty_rechecks = 0
                unused_wake = True
            else:
                if time.monotonic() >= deadline:
                    return result  # the clipped last sleep: time is up
                hints = []
                counts["timer_rechecks"] += 1
                answered = await _answered_by_cohort(waiter, since, deadline)
                if answered is not None:
                    counts["shared_rechecks"] += 1
                    known_at = answered
                    empty_rechecks += 1
                    continue
                if waiter.event.is_set():
                    continue  # woken meanwhile: the wait returns at once
            cohort = waiter.cohort
            started = time.monotonic()
            probe = cohort.start_check(started) if cohort is not None else None
            waiter.busy = True
            done = found = False
            try:
                counts["attempts"] += 1
                result = await attempt(hints)
                done, found = True, bool(result)
            finally:
                waiter.busy = False
                if cohort is not None:
                    cohort.end_check(probe, started, empty=done and not found)
                if not done and unused_wake:
                    waiter.hints = hints + waiter.hints  # passed on with the wake
            unused_wake = False
            known_at = started
            if found:
                if more_after(result):
                    # An auto-ack pop took a full batch: the next pop of the
                    # cohort looks for the rest at once.
                    waiter.hints = hints + waiter.hints
                    unused_wake = True
                return result
            empty_rechecks += 1
    finally:
        # Also on cancellation (the client went away): a tell needs no await,
        # so it cannot be interrupted by a second cancel.
        try:
            _tell(registry_ref, "unregister", waiter,
                  unused_wake or waiter.event.is_set())
        except ActorDeadError:
            pass  # registry already stopped (shutdown): nothing to clean up
