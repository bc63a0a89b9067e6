"""A pop's long poll (docs/behaviour.md §1.3-§1.5): look, and when nothing was found, park
in the pop-waiter registry (actors/pop_waiters.py) and look again when woken or when the
backoff timer fires, until something is found or the deadline passes.

A parked pop holds no database connection: `long_poll()` runs in the HTTP handler's
task and only talks to the registry through messages, so the registry actor never does
database work. What one look does is the caller's (service/pop.py: the claim); this
module only decides when to look.

Wakes. A committed push (or a released lease) wakes, per cohort, one parked pop per
distinct partition (actors/pop_waiters.py), which looks at once with that partition as
its hint. A wake is never dropped on the way: a pop that leaves (answered, deadline,
client gone) with a wake it has not used, or in the middle of the look a wake started,
passes the wake on to the next pop of its cohort; so does a look whose result may have
left more for the next pop (an auto-ack pop that took a full batch: no lease stops the
next pop).

Timer re-checks are shared per cohort. A parked pop whose timer fires skips its look
when a pop of its cohort started an empty look later than the one this pop last learnt
from (or than the lease end it waited for), and joins such a look while it runs. So a
cohort of thousands of parked pops issues about one timer query per re-check interval,
not one per pop (and a slow query is joined, not repeated, so a loaded database is not
loaded more), while a change nobody announces (a push through an unmeshed broker, a
lease running out) is still seen by the cohort's next look, within one interval.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from pykka import ActorDeadError, ActorRef
from pykka.messages import ProxyCall

from actors.pop_waiters import PopWaiterRegistry, Waiter

__all__ = ["backoff_interval_ms", "long_poll"]

R = TypeVar("R")


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
    group: str | None = None,
    more_after: Callable[[R], bool] = lambda result: False,
    counters: Counter[str] | None = None,
) -> R:
    """Run `attempt` until it returns something truthy or `deadline` passes.

    `attempt(hints)` does one look and returns what it found, or something falsy
    (None) when it found nothing; `hints` are partitions recently pushed to (possibly
    empty). `deadline` is a `time.monotonic()` value. `queue=None` parks on the
    "any push" gate (pops that span queues). Returns the first truthy result,
    or the last falsy one at the deadline. `recheck_by()`, read before each wait, may
    name a `time.monotonic()` moment the next look must not wait past (the end of
    a lease the last look found: nothing wakes a pop when a lease expires).

    `partition` and `scope` (with `queue`) name the pop's cohort: pops that
    would run the same claim. `group`: the consumer group in the scope (a lease
    another group released wakes none of its pops). `more_after(result)`: the result may have left
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

    waiter = Waiter(queue, partition, scope, group)
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
            if waiter.closing:  # the broker is stopping (PopWaiterRegistry.close)
                return result
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
