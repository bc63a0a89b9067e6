"""The pop-waiter registry: parked long-poll pops by queue and cohort, woken after a commit.

A pop that finds nothing parks (broker/service/long_poll.py runs its long poll): it
registers a `Waiter` here, re-checks on a backoff timer, and sooner when
`PopWaiterRegistry.wake()` reports a committed push to its queue. The registry only
keeps and wakes waiters; it never does database work.

No thundering herd. Parked pops that would run the same claim (same queue,
partition filter, namespace, task and consumer group) form a *cohort*. A push
to one partition can satisfy at most one pop of a cohort (a partition has one
leased batch per group at a time), so a committed push wakes, per cohort, one
parked pop per distinct partition it pushed to, the one that waited longest
(woken pops go to the back of the line, so none starves), and hands it the
partition as its hint. The others stay parked. A pop that leaves with a wake it
has not used passes it on (`unregister(pass_on=True)`): the next pop of its cohort
is woken with the hints it had. A cohort also keeps its members' shared re-check
record (the newest empty check, the check running now), which the long poll reads
to skip a timer re-check another member already made.

Wakes come from this broker's own commits (pushes, and acks that release a
lease) and, with a mesh, from the peers' (actors/hints.py sends and receives
both); without a mesh, a push through another broker is seen at the backoff
re-check.

Threading: the registry actor and every long poll run on the broker's one
event loop. A waiter's event, hints and cohort are plain objects both sides
touch without awaiting in between (like an `asyncio.Event`), so no message
round trip is spent per wake or per timer re-check.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable, Iterable

from actors.runtime import AsyncioActor

__all__ = ["Cohort", "PopWaiterRegistry", "Waiter"]

# Partition hints kept per woken pop (oldest dropped beyond this).
HINTS_PER_WAITER = 64


class Cohort:
    """Parked pops that run the same claim, and their shared re-check record.

    `waiters` is the line, longest-unwoken first. `last_empty` is the start
    time (time.monotonic) of the newest check by any member that found
    nothing; `probe` is the check running now (a future set to True when it
    found nothing), started at `probe_started`.
    """

    __slots__ = ("group", "last_empty", "partition", "probe", "probe_started", "waiters")

    def __init__(self, partition: str | None, group: str | None = None) -> None:
        self.partition = partition  # the members' partition filter (None: any)
        self.group = group  # the members' consumer group (None: not declared)
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

    __slots__ = ("busy", "closing", "cohort", "event", "group", "hints", "key", "partition",
                 "queue")

    def __init__(self, queue: str | None, partition: str | None = None,
                 scope: Hashable = (), group: str | None = None) -> None:
        self.queue = queue  # None: woken by a push to any queue
        self.partition = partition
        self.key = (partition, scope)  # the cohort within the queue
        # The consumer group the pop claims for (part of its scope): a released lease is
        # news only for its own group's pops. None: woken by every wake of its queue.
        self.group = group
        self.event = asyncio.Event()
        self.hints: list[str] = []
        self.busy = False  # running an attempt
        self.cohort: Cohort | None = None  # set by the registry when it registers
        self.closing = False  # the broker is stopping: answer now, as at the deadline

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
        self._closed = False

    def register(self, waiter: Waiter) -> None:
        if self._closed:
            waiter.closing = True
            waiter.event.set()
        cohorts = self._queues.setdefault(waiter.queue, {})
        cohort = cohorts.get(waiter.key)
        if cohort is None:
            cohort = cohorts[waiter.key] = Cohort(waiter.partition, waiter.group)
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

    def wake_many(self, pushes: Iterable[tuple[str, str | None]],
                  group: str | None = None) -> int:
        """Pushes to these (queue, partition) pairs committed (partition None:
        some partition of the queue). Per cohort, one pop per distinct pair it
        could take; pops spanning queues, one per distinct pair. ``group``: the
        pairs are leases of that consumer group released, which only its own
        pops can use (another group's lease and cursor did not move), so the
        cohorts of other groups sleep on. Returns how many pops were woken."""
        woken: set[Waiter] = set()
        by_queue: dict[str, dict[str | None, None]] = {}
        for queue, partition in pushes:
            by_queue.setdefault(queue, {})[partition or None] = None
        pairs = sum(len(parts) for parts in by_queue.values())
        for queue, parts in by_queue.items():
            for cohort in self._queues.get(queue, {}).values():
                if group is not None and cohort.group not in (None, group):
                    continue
                for partition in parts:
                    if cohort.matches(partition):
                        self._wake_one(cohort, partition, woken)
        for cohort in self._queues.get(None, {}).values():
            if group is not None and cohort.group not in (None, group):
                continue
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

    def close(self) -> int:
        """The broker is stopping: every parked pop (and any that parks from now on) is
        woken to answer what it has, as at its deadline, so the HTTP server's graceful
        stop does not wait out long polls (it would, up to its timeout, then drop them
        unanswered). Returns how many were parked."""
        self._closed = True
        parked = 0
        for cohorts in self._queues.values():
            for cohort in cohorts.values():
                for waiter in cohort.waiters:
                    waiter.closing = True
                    waiter.event.set()
                    parked += 1
        return parked

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
