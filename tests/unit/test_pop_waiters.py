"""Invariants of the pop-waiter registry (actors/pop_waiters.py) and the long poll
(broker/service/long_poll.py).

No HTTP and no database: `attempt` is a fake that records its calls.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.pop_waiters import HINTS_PER_WAITER, PopWaiterRegistry, Waiter
from broker.service.long_poll import backoff_interval_ms, long_poll
from tests.waiting import wait_until_async

DEFAULTS = {"initial_ms": 100, "threshold": 3, "multiplier": 2.0, "max_ms": 1000}
# A timer so long that a test finishing well within WAKE_BOUND_S proves a wake did it: a wake
# answers in milliseconds, so the bound is wide enough for a loaded machine and still far
# below the timer.
SLOW_TIMER = {"initial_ms": 60_000, "threshold": 3, "multiplier": 2.0, "max_ms": 60_000}
WAKE_BOUND_S = 10


class FakeAttempt:
    """Returns the queued results in turn (then falsy); records hints passed."""

    def __init__(self, *results: object) -> None:
        self.results = list(results)
        self.calls: list[list[str]] = []
        self.called = asyncio.Event()

    async def __call__(self, hints: list[str]) -> object:
        self.calls.append(hints)
        self.called.set()
        return self.results.pop(0) if self.results else []


@pytest.fixture
async def registry():
    ref = PopWaiterRegistry.start()
    yield ref
    await ref.stop(block=False)


async def wait_parked(registry, count: int) -> None:
    async def parked() -> bool:
        return await registry.proxy().parked_count() == count
    await wait_until_async(parked, 5, f"{count} parked pops")


# --- backoff schedule -----------------------------------------------------


def test_backoff_documented_sequence():
    intervals = [backoff_interval_ms(k, **DEFAULTS) for k in range(1, 10)]
    assert intervals == [100, 100, 100, 200, 400, 800, 1000, 1000, 1000]


def test_backoff_is_initial_up_to_threshold_monotone_and_capped():
    intervals = [backoff_interval_ms(k, **DEFAULTS) for k in range(1, 2000)]
    assert intervals[:3] == [100, 100, 100]
    assert all(a <= b for a, b in zip(intervals, intervals[1:]))
    assert max(intervals) == 1000  # also no overflow for very long parks


# --- registry messages ------------------------------------------------------


async def test_wake_sets_only_waiters_of_that_queue_and_the_any_queue_gate(registry):
    on_a, on_b, on_any = Waiter("a"), Waiter("b"), Waiter(None)
    for waiter in (on_a, on_b, on_any):
        registry.proxy().register(waiter)
    assert await registry.proxy().wake("a", "p1") == 2
    assert on_a.event.is_set() and on_any.event.is_set()
    assert not on_b.event.is_set()
    assert await registry.proxy().stats() == {"parked": 3, "queues": 2}


async def test_wake_many_wakes_each_waiter_once(registry):
    on_a, on_b = Waiter("a"), Waiter("b")
    registry.proxy().register(on_a)
    registry.proxy().register(on_b)
    woken = await registry.proxy().wake_many([("a", "p1"), ("a", "p2"), ("b", None)])
    assert woken == 2
    assert on_a.hints == ["p1", "p2"]  # the second pair rides with the only pop there is
    assert on_b.hints == []


async def test_hints_are_deduplicated_fifo(registry):
    waiter = Waiter("q")
    registry.proxy().register(waiter)
    for partition in ["p1", "p2", "p1", "p3", "", None]:  # empty ones: no hint
        await registry.proxy().wake("q", partition)
    assert waiter.hints == ["p1", "p2", "p3"]


async def test_hints_are_bounded_and_drop_the_oldest(registry):
    waiter = Waiter("q")
    registry.proxy().register(waiter)
    extra = 6
    await registry.proxy().wake_many(
        [("q", f"p{i}") for i in range(HINTS_PER_WAITER + extra)]
    )
    assert HINTS_PER_WAITER == 64
    assert waiter.hints == [f"p{i}" for i in range(extra, HINTS_PER_WAITER + extra)]


async def test_no_hint_is_stored_for_a_queue_nobody_polls(registry):
    assert await registry.proxy().wake("unpolled", "p1") == 0
    waiter = Waiter("unpolled")
    registry.proxy().register(waiter)
    await registry.proxy().parked_count()  # the register was handled
    assert waiter.hints == [] and not waiter.event.is_set()
    assert await registry.proxy().stats() == {"parked": 1, "queues": 1}


# --- no thundering herd: one pop per cohort and pushed partition --------------


async def test_a_push_wakes_one_parked_pop_per_partition_longest_waiting_first(registry):
    waiters = [Waiter("q", scope=("g",)) for _ in range(10)]
    for waiter in waiters:
        registry.proxy().register(waiter)
    assert await registry.proxy().wake("q", "p1") == 1
    assert [w.event.is_set() for w in waiters] == [True] + [False] * 9
    assert waiters[0].hints == ["p1"]
    # Three partitions in one commit: three more pops, the next in line.
    assert await registry.proxy().wake_many([("q", "p2"), ("q", "p3"), ("q", "p2"),
                                             ("q", "p4")]) == 3
    assert [w.event.is_set() for w in waiters] == [True] * 4 + [False] * 6
    assert [w.hints for w in waiters[1:4]] == [["p2"], ["p3"], ["p4"]]
    # A woken pop that found nothing waits again behind the others: no pop starves.
    waiters[0].event.clear()
    for expected in waiters[4:]:
        await registry.proxy().wake("q", "p9")
        assert expected.event.is_set()
    assert await registry.proxy().wake("q", "p9") == 1 and waiters[0].event.is_set()
    assert await registry.proxy().wake("q", "p9") == 0  # every pop is woken already
    assert (await registry.proxy().wake_stats())["woken"] == 11  # waiters[0] twice


async def test_each_consumer_group_and_partition_filter_is_its_own_cohort(registry):
    g1 = [Waiter("q", scope=("g1",)) for _ in range(3)]
    g2 = [Waiter("q", scope=("g2",)) for _ in range(3)]
    on_p1 = Waiter("q", "p1", scope=("g1",))
    on_p2 = Waiter("q", "p2", scope=("g1",))
    for waiter in (*g1, *g2, on_p1, on_p2):
        registry.proxy().register(waiter)
    assert await registry.proxy().wake("q", "p1") == 3  # one of g1, one of g2, the p1 pop
    assert g1[0].event.is_set() and g2[0].event.is_set() and on_p1.event.is_set()
    assert not on_p2.event.is_set()
    assert sum(w.event.is_set() for w in (*g1, *g2)) == 2
    assert (await registry.proxy().wake_stats())["cohorts"] == 4


async def test_a_group_wake_skips_the_cohorts_of_other_groups(registry):
    g1 = Waiter("q", scope=("g1",), group="g1")
    g2 = Waiter("q", scope=("g2",), group="g2")
    undeclared = Waiter("q", scope=("g3",))
    any_queue_g2 = Waiter(None, scope=("g2",), group="g2")
    for waiter in (g1, g2, undeclared, any_queue_g2):
        registry.proxy().register(waiter)
    assert await registry.proxy().wake_many([("q", "p1")], "g1") == 2  # g1's and undeclared
    assert g1.event.is_set() and undeclared.event.is_set()
    assert not g2.event.is_set() and not any_queue_g2.event.is_set()
    assert await registry.proxy().wake_many([("q", "p1")]) == 2  # a push: every group
    assert g2.event.is_set() and any_queue_g2.event.is_set()


# --- long_poll --------------------------------------------------------------


async def test_found_on_first_attempt_returns_without_parking(registry):
    attempt = FakeAttempt(["msg"])
    result = await long_poll(registry, "q", attempt, time.monotonic() + 5, **DEFAULTS)
    assert result == ["msg"]
    assert attempt.calls == [[]]
    assert await registry.proxy().parked_count() == 0


async def test_wake_makes_a_parked_poll_recheck_long_before_the_timer(registry):
    attempt = FakeAttempt([], ["msg"])
    started = time.monotonic()
    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, started + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    await registry.proxy().wake("q", "p7")
    assert await asyncio.wait_for(poll, timeout=WAKE_BOUND_S) == ["msg"]
    assert time.monotonic() - started < WAKE_BOUND_S  # the 60 s timer never fired
    assert attempt.calls == [[], ["p7"]]  # the woken attempt got the hint
    await wait_parked(registry, 0)


async def test_wake_on_another_queue_does_not_wake_it(registry):
    attempt = FakeAttempt()
    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    assert await registry.proxy().wake("other", "p1") == 0
    await asyncio.sleep(0.05)
    assert attempt.calls == [[]]  # still parked, no re-check
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll


async def test_any_queue_waiter_is_woken_by_a_push_to_any_queue(registry):
    attempt = FakeAttempt([], ["msg"])
    poll = asyncio.create_task(
        long_poll(registry, None, attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    assert await registry.proxy().wake("whatever", "p1") == 1
    assert await asyncio.wait_for(poll, timeout=WAKE_BOUND_S) == ["msg"]
    assert attempt.calls == [[], []]  # no per-queue mailbox for discovery pops


class FakeClock:
    """``time.monotonic`` for the long poll, moved on only by the fake wait below."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def test_deadline_clips_the_last_sleep_and_returns_the_empty_result(registry, monkeypatch):
    # On a fake clock, so the schedule is exact whatever the machine's load: every wait
    # times out after exactly the timeout it was given.
    import broker.service.long_poll as polling

    clock = FakeClock()
    waits: list[int] = []

    async def timer_fires(event: asyncio.Event, timeout: float) -> bool:
        waits.append(round(timeout * 1000))
        clock.now += timeout
        return False

    monkeypatch.setattr(polling, "time", clock)
    monkeypatch.setattr(polling, "_wait_for_wake", timer_fires)
    attempt = FakeAttempt()
    deadline = clock.now + 0.35
    result = await long_poll(registry, "q", attempt, deadline, **DEFAULTS)
    assert result == []
    # Re-checks after 0.1, 0.2 and 0.3 s; the last sleep is clipped to the 50 ms left, and
    # the poll returns at the deadline without another attempt.
    assert waits == [100, 100, 100, 50]
    assert len(attempt.calls) == 4
    assert clock.now == pytest.approx(deadline)
    await wait_parked(registry, 0)


async def test_deadline_answers_long_before_the_next_timer(registry):
    # On the real clock: the next re-check is a minute away, so a poll that slept it out
    # instead of stopping at its deadline would answer ~60 s late. The bound is generous
    # (a loaded machine delays the loop by far less) and still catches that.
    attempt = FakeAttempt()
    deadline = time.monotonic() + 0.3
    result = await long_poll(registry, "q", attempt, deadline, **SLOW_TIMER)
    finished = time.monotonic()
    assert result == []
    assert deadline <= finished < deadline + WAKE_BOUND_S
    await wait_parked(registry, 0)


async def test_cancelling_the_poll_unparks_it_and_stops_attempts(registry):
    attempt = FakeAttempt()
    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    assert await registry.proxy().parked_count() == 0  # no polling needed: FIFO inbox
    await registry.proxy().wake("q", "p1")
    await asyncio.sleep(0.05)
    assert attempt.calls == [[]]
    assert await registry.proxy().stats() == {"parked": 0, "queues": 0}


async def test_a_wake_during_an_attempt_is_not_lost(registry):
    release = asyncio.Event()
    calls: list[list[str]] = []

    async def attempt(hints: list[str]) -> list[str]:
        calls.append(hints)
        if len(calls) == 2:  # the woken re-check: a second push lands meanwhile
            await registry.proxy().wake("q", "p2")
            await release.wait()
        return ["msg"] if len(calls) == 3 else []

    poll = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER)
    )
    await wait_parked(registry, 1)
    await registry.proxy().wake("q", "p1")
    await wait_until_async(lambda: len(calls) >= 2, 5, "the woken re-check")
    release.set()
    assert await asyncio.wait_for(poll, timeout=WAKE_BOUND_S) == ["msg"]
    assert calls == [[], ["p1"], ["p2"]]


async def test_backoff_counter_resets_after_a_wake(registry, monkeypatch):
    # Replace the wait itself: record each timeout and answer "timer fired"
    # at once, except the 5th wait, which answers "woken".
    import broker.service.long_poll as polling

    waits: list[int] = []

    async def fake_wait(event: asyncio.Event, timeout: float) -> bool:
        waits.append(round(timeout * 1000))
        return len(waits) == 5

    monkeypatch.setattr(polling, "_wait_for_wake", fake_wait)
    attempt = FakeAttempt(*[[]] * 7, ["msg"])
    result = await long_poll(registry, "q", attempt, time.monotonic() + 30, **DEFAULTS)
    assert result == ["msg"]
    # k = 1..5 on the timer, then woken: k restarts at 1.
    assert waits == [100, 100, 100, 200, 400, 100, 100]


# --- long polls of one cohort: no herd, nothing lost, shared timer re-checks ---------


class Store:
    """Messages per partition; an attempt takes one (the first hinted, else any) and
    counts itself: the fake claim query."""

    def __init__(self) -> None:
        self.messages: dict[str, list[str]] = {}
        self.claims = 0
        self.gate: asyncio.Event | None = None  # set: attempts block until it is set

    def push(self, partition: str, *messages: str) -> None:
        self.messages.setdefault(partition, []).extend(messages)

    async def attempt(self, hints: list[str]) -> list[str]:
        self.claims += 1
        if self.gate is not None:
            await self.gate.wait()
        for partition in [*hints, *self.messages]:
            if self.messages.get(partition):
                return [self.messages[partition].pop(0)]
        return []


def polls(registry, store: Store, n: int, timer: dict = SLOW_TIMER, **kw) -> list[asyncio.Task]:
    deadline = time.monotonic() + 120
    return [asyncio.create_task(long_poll(registry, "q", store.attempt, deadline,
                                          scope=("g",), **timer, **kw)) for _ in range(n)]


async def test_one_push_to_many_parked_pops_runs_one_claim_and_the_rest_keep_waiting(registry):
    store = Store()
    tasks = polls(registry, store, 50)
    await wait_parked(registry, 50)
    assert store.claims == 50  # each pop's first look
    store.push("p1", "m1")
    await registry.proxy().wake("q", "p1")
    done, _ = await asyncio.wait(tasks, timeout=WAKE_BOUND_S, return_when=asyncio.FIRST_COMPLETED)
    assert [t.result() for t in done] == [["m1"]]
    await wait_parked(registry, 49)
    assert store.claims == 51  # one claim for the push, not one per parked pop
    # Later messages reach the others, each exactly once.
    for i in range(2, 51):
        store.push(f"p{i}", f"m{i}")
    await registry.proxy().wake_many([("q", f"p{i}") for i in range(2, 51)])
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=WAKE_BOUND_S)
    assert sorted(r[0] for r in results) == sorted(f"m{i}" for i in range(1, 51))
    assert store.claims == 100


async def test_cancelled_mid_claim_after_a_wake_wakes_the_next_pop(registry):
    store = Store()
    hung = asyncio.Event()
    release = asyncio.Event()
    calls: list[list[str]] = []

    async def stuck_attempt(hints: list[str]) -> list[str]:
        calls.append(hints)
        if hints:  # the woken claim: its client goes away while it runs
            hung.set()
            await release.wait()
        return []

    deadline = time.monotonic() + 120
    doomed = asyncio.create_task(long_poll(registry, "q", stuck_attempt, deadline,
                                           scope=("g",), **SLOW_TIMER))
    await wait_parked(registry, 1)
    others = polls(registry, store, 2)
    await wait_parked(registry, 3)
    store.push("p1", "m1")
    await registry.proxy().wake("q", "p1")  # the doomed pop waited longest: it is woken
    await asyncio.wait_for(hung.wait(), WAKE_BOUND_S)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    done, pending = await asyncio.wait(others, timeout=WAKE_BOUND_S,
                                       return_when=asyncio.FIRST_COMPLETED)
    assert [t.result() for t in done] == [["m1"]]  # the wake reached the next pop
    assert (await registry.proxy().wake_stats())["passed_on"] == 1
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def test_a_full_auto_ack_batch_wakes_the_next_pop_for_the_rest(registry):
    store = Store()
    tasks = polls(registry, store, 3, more_after=lambda result: True)
    await wait_parked(registry, 3)
    store.push("p1", "m1", "m2", "m3")
    await registry.proxy().wake("q", "p1")  # one wake; each result says "maybe more"
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=WAKE_BOUND_S)
    assert sorted(r[0] for r in results) == ["m1", "m2", "m3"]


async def test_timer_rechecks_of_one_cohort_are_shared(registry):
    from collections import Counter

    store = Store()
    counts: Counter[str] = Counter()
    fast = {"initial_ms": 20, "threshold": 3, "multiplier": 1.0, "max_ms": 20}
    tasks = polls(registry, store, 30, timer=fast, counters=counts)
    await wait_parked(registry, 30)
    claims, rechecks = store.claims, counts["timer_rechecks"]
    await wait_until_async(lambda: counts["timer_rechecks"] - rechecks >= 300, 30,
                           "ten timer re-checks per parked pop")
    timer, claimed = counts["timer_rechecks"] - rechecks, store.claims - claims
    # Unshared, every timer re-check would be a claim; shared, about one per interval.
    assert claimed * 3 <= timer, (claimed, timer)
    assert counts["shared_rechecks"] > 0
    # Nothing announced, a message still turns up at the next shared re-check.
    store.push("p7", "quiet")
    done, pending = await asyncio.wait(tasks, timeout=WAKE_BOUND_S,
                                       return_when=asyncio.FIRST_COMPLETED)
    assert [t.result() for t in done] == [["quiet"]]
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def test_a_slow_cohort_check_is_joined_not_repeated(registry):
    # A loaded database: every claim takes 100 ms while timers fire every 10 ms. Pops whose
    # timer fires during a running check wait for it instead of adding their own.
    from collections import Counter

    in_flight, peak = 0, 0
    counts: Counter[str] = Counter()

    async def slow_attempt(hints: list[str]) -> list[str]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.1)
        finally:
            in_flight -= 1
        return []

    fast = {"initial_ms": 10, "threshold": 3, "multiplier": 1.0, "max_ms": 10}
    deadline = time.monotonic() + 120
    tasks = [asyncio.create_task(long_poll(registry, "q", slow_attempt, deadline, scope=("g",),
                                           counters=counts, **fast)) for _ in range(20)]
    await wait_parked(registry, 20)
    await wait_until_async(lambda: in_flight == 0, 10, "the first looks done")
    peak, start = 0, counts["timer_rechecks"]
    await wait_until_async(lambda: counts["timer_rechecks"] - start >= 200, 30,
                           "ten timer re-checks per pop")
    assert peak <= 2, peak  # unshared: up to 20 claims at once
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_lease_end_answered_by_the_cohort_is_not_rechecked_again(registry):
    # Every pop was told a lease ends at `due`; one check after it answers them all, and
    # then they wait on their (slow) timers instead of re-checking the same lease end.
    from collections import Counter

    counts: Counter[str] = Counter()
    store = Store()
    due = time.monotonic() + 0.2
    deadline = time.monotonic() + 120
    tasks = [asyncio.create_task(long_poll(registry, "q", store.attempt, deadline, scope=("g",),
                                           counters=counts, recheck_by=lambda: due,
                                           **SLOW_TIMER)) for _ in range(10)]
    await wait_parked(registry, 10)
    await wait_until_async(lambda: counts["timer_rechecks"] >= 10, 10, "the lease-end re-checks")
    # One more loop turn for every pop; a pop still aiming at the old lease end would spin.
    for _ in range(50):
        await asyncio.sleep(0)
    assert counts["timer_rechecks"] == 10
    assert store.claims - 10 <= 2  # one check after the lease end (and one at most besides)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_close_answers_parked_polls_and_later_ones_without_a_look(registry):
    """A stopping broker (PopWaiterRegistry.close): a parked poll returns its last (empty)
    result without another look, and a poll that parks afterwards returns at once; both
    had two minutes and an 8-second timer left."""
    attempt = FakeAttempt()
    parked = asyncio.create_task(
        long_poll(registry, "q", attempt, time.monotonic() + 120, **SLOW_TIMER))
    await wait_parked(registry, 1)
    assert await registry.proxy().close() == 1
    assert await asyncio.wait_for(parked, 10) == []
    assert attempt.calls == [[]]  # the first look only: closing is no reason to look
    late = FakeAttempt()
    assert await asyncio.wait_for(
        long_poll(registry, "q", late, time.monotonic() + 120, **SLOW_TIMER), 10) == []
    assert late.calls == [[]]
    await wait_parked(registry, 0)
