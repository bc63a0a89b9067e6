"""The ephemeral queues' ring logic (actors/ephemeral), driven as the broker drives it
(docs/ephemeral.md): the data path's calls go straight to the ``EphemeralQueues`` a running
keeper actor owns, and what time drives goes through the keeper. No HTTP, no database; time
is a fake clock the tests move, and the keeper's ``sweep`` runs what is due, as its timer
would."""
from __future__ import annotations

import asyncio
import time

import pytest

from actors.ephemeral import EphemeralKeeper, EphemeralQueues, QueueOptions
from actors.ephemeral.options import parse_patch
from actors.ephemeral.queues import ENTRY_OVERHEAD, STRUCTURE_CHARGE, MemoryFull
from actors.runtime import stop_all
from broker.core.errors import BadRequest

Q, G = "inbox", "workers"


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def msgs(*payloads: str) -> list[tuple[str, int]]:
    return [(p, len(p)) for p in payloads]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def kept(clock):
    """The queues and the proxy of the keeper actor that owns them, running."""
    queues = EphemeralQueues(1 << 30, clock=clock, incarnation="0123456789ab")
    proxy = EphemeralKeeper.start(queues).proxy()
    try:
        yield queues, proxy
    finally:
        await stop_all()


@pytest.fixture
def queues(kept) -> EphemeralQueues:
    return kept[0]


@pytest.fixture
def keeper(kept):
    return kept[1]


def configure(queues, **knobs) -> QueueOptions:
    return queues.configure(Q, QueueOptions(**knobs))


def payloads(taken) -> list[str]:
    return [text for _id, _part, text, _n in taken]


async def test_fifo_per_partition_and_ack_frees_memory(queues):
    assert queues.push(Q, "p", msgs("1", "2", "3")).pushed == 3
    taken = queues.take(Q, G, None, 2)
    assert payloads(taken) == ["1", "2"] and [n for *_, n in taken] == [1, 1]
    assert [part for _i, part, _t, _n in taken] == ['"p"', '"p"']
    figures = queues.figures()
    assert (figures["messages"], figures["bytes"]) == (3, 3)
    outcomes = queues.ack(Q, G, [(taken[1][0], "completed"), (taken[0][0], "completed")])
    assert outcomes == [("acked", False), ("acked", False)]
    figures = queues.figures()
    assert (figures["messages"], figures["bytes"]) == (1, 1)  # both done: freed
    assert payloads(queues.take(Q, G, None, 10)) == ["3"]


async def test_fan_out_groups_each_see_everything_and_hold_the_ring(queues):
    queues.available(Q, "a")  # both groups are known before the push
    queues.available(Q, "b")
    queues.push(Q, "p", msgs("x", "y"))
    a = queues.take(Q, "a", None, 10)
    queues.ack(Q, "a", [(m[0], "completed") for m in a])
    assert queues.figures()["messages"] == 2  # b has not read them yet
    b = queues.take(Q, "b", None, 10)
    assert payloads(a) == payloads(b) == ["x", "y"]
    queues.ack(Q, "b", [(m[0], "completed") for m in b])
    assert queues.figures()["messages"] == 0


async def test_competing_consumers_of_one_group_get_disjoint_batches(queues):
    queues.push(Q, "p", msgs(*"abcdef"))
    first = queues.take(Q, G, None, 2)
    second = queues.take(Q, G, None, 2)
    assert payloads(first) == ["a", "b"] and payloads(second) == ["c", "d"]
    depth = queues.depth(Q)
    assert (depth.groups[0].leased, depth.groups[0].pending) == (4, 2)


async def test_lease_expiry_redelivers_with_attempts_then_drops_at_the_limit(
        queues, keeper, clock):
    configure(queues, lease_seconds=5, retry_limit=1)
    queues.push(Q, "p", msgs("m"))
    assert [n for *_, n in queues.take(Q, G, None, 1)] == [1]
    assert queues.take(Q, G, None, 1) == []  # leased
    clock.t += 5
    assert await keeper.sweep() == 1
    again = queues.take(Q, G, None, 1)
    assert payloads(again) == ["m"] and again[0][3] == 2
    clock.t += 5
    await keeper.sweep()  # second delivery was the last (1 + retryLimit)
    assert queues.take(Q, G, None, 1) == []
    figures = queues.figures()
    assert figures["counts"]["dropped_retry_limit"] == 1 and figures["messages"] == 0


async def test_failed_and_retry_acks_redeliver_and_the_last_is_dropped(queues):
    configure(queues, retry_limit=1)
    queues.push(Q, "p", msgs("m", "n"))
    taken = queues.take(Q, G, None, 2)
    assert queues.ack(Q, G, [(taken[0][0], "failed")]) == [("redelivered", False)]
    again = queues.take(Q, G, None, 1)
    assert again[0][0] == taken[0][0] and again[0][3] == 2  # same id, attempts + 1
    assert queues.ack(Q, G, [(again[0][0], "retry")]) == [("acked", True)]
    assert queues.ack(Q, G, [(taken[1][0], "completed")]) == [("acked", False)]
    assert queues.ack(Q, G, [(taken[1][0], "completed")]) == [("unknown", False)]
    assert queues.figures()["counts"]["dropped_retry_limit"] == 1


async def test_auto_ack_moves_the_cursor_at_delivery(queues):
    queues.push(Q, "p", msgs("a", "b"))
    taken = queues.take(Q, G, None, 5, True)
    assert payloads(taken) == ["a", "b"]
    assert queues.figures()["messages"] == 0
    assert queues.ack(Q, G, [(taken[0][0], "completed")]) == [("unknown", False)]


async def test_reject_refuses_the_whole_push_and_drop_oldest_evicts(queues):
    configure(queues, max_length=3)
    queues.push(Q, "p", msgs("1", "2"))
    verdict = queues.push(Q, "p", msgs("3", "4"))
    assert verdict.status == "full" and verdict.pushed == 0
    assert queues.figures()["counts"]["rejected_full"] == 2
    configure(queues, max_length=3, policy="drop_oldest")
    assert queues.push(Q, "q", msgs("3", "4")).pushed == 2
    assert payloads(queues.take(Q, G, "p", 10, True)) == ["2"]
    assert payloads(queues.take(Q, G, "q", 10, True)) == ["3", "4"]
    assert queues.figures()["counts"]["dropped_length"] == 1


async def test_max_bytes_and_a_push_that_can_never_fit(queues):
    configure(queues, max_bytes=10, policy="drop_oldest")
    queues.push(Q, "p", msgs("aaaa", "bbbb"))
    queues.push(Q, "p", msgs("cccc"))
    assert payloads(queues.take(Q, G, None, 10, True)) == ["bbbb", "cccc"]
    assert queues.figures()["counts"]["dropped_bytes"] == 1
    assert queues.push(Q, "p", msgs("x" * 11)).status == "too_large"


async def test_the_global_budget_refuses_pushes_past_it(clock):
    # room for the queue, its group, its ring and the group's cursor, and two messages
    queues = EphemeralQueues(4 * STRUCTURE_CHARGE + 2 * (ENTRY_OVERHEAD + 4), clock=clock)
    EphemeralKeeper.start(queues)
    try:
        assert queues.take("a", G, None, 1, True) == []  # the queue and its group
        assert queues.push("a", "p", msgs("1234", "5678")).pushed == 2
        verdict = queues.push("a", "p", msgs("9"))
        assert verdict.status == "memory" and "EPHEMERAL_MAX_BYTES" in verdict.detail
        queues.take("a", G, None, 1, True)
        assert queues.push("a", "p", msgs("9")).pushed == 1
        assert queues.used() <= queues.budget
    finally:
        await stop_all()


async def test_made_up_names_are_charged_and_refused_past_the_budget(clock):
    queues = EphemeralQueues(3 * STRUCTURE_CHARGE, clock=clock)
    EphemeralKeeper.start(queues)
    try:
        assert queues.take("a", G, None, 1, False) == []  # queue + group: 2 charges
        with pytest.raises(MemoryFull):
            queues.take("b", G, None, 1, False)  # another queue and group: no room
        assert queues.push("a", "p", msgs("x")).status == "memory"  # a new ring
        assert queues.delete("a")
        assert queues.used() == STRUCTURE_CHARGE  # b, created before its group found no room
        assert queues.take("b", G, None, 1, False) == []
    finally:
        await stop_all()


async def test_ttl_drops_aged_messages_at_their_age(queues, keeper, clock):
    configure(queues, ttl_seconds=10)
    queues.push(Q, "p", msgs("old"))
    clock.t += 6
    queues.push(Q, "p", msgs("young"))
    clock.t += 4
    await keeper.sweep()
    assert payloads(queues.take(Q, G, None, 10, True)) == ["young"]
    assert queues.figures()["counts"]["dropped_ttl"] == 1


async def test_stale_and_unknown_ids(queues):
    queues.push(Q, "p", msgs("a"))
    old = queues.take(Q, G, None, 1)[0][0]
    assert queues.reset(Q) == 1
    queues.push(Q, "p", msgs("b"))
    new = queues.take(Q, G, None, 1)[0][0]
    assert new != old
    other_broker = "fedcba987654" + old[12:]
    outcomes = queues.ack(Q, G, [(old, "completed"), (other_broker, "completed"),
                                       ("not-an-id", "completed"), (new + "9", "completed"),
                                       (new, "completed")])
    assert [o for o, _ in outcomes] == ["stale", "stale", "unknown", "unknown", "acked"]
    assert queues.ack("other", G, [(new, "completed")]) == [("unknown", False)]


async def test_reset_keeps_options_and_delete_forgets_everything(queues):
    configure(queues, max_length=7)
    queues.push(Q, "p", msgs("a"))
    assert queues.reset(Q) == 1 and queues.reset("nope") == 0
    depth = queues.depth(Q)
    assert depth.options.max_length == 7 and depth.messages == 0
    assert queues.delete(Q) is True and queues.delete(Q) is False
    assert queues.depth(Q) is None


async def test_partitionless_pop_spans_partitions_in_order_per_partition(queues):
    queues.push(Q, "a", msgs("a1", "a2"))
    queues.push(Q, "b", msgs("b1", "b2"))
    got = payloads(queues.take(Q, G, None, 10, True))
    assert sorted(got) == ["a1", "a2", "b1", "b2"]
    assert got.index("a1") < got.index("a2") and got.index("b1") < got.index("b2")


async def test_a_new_group_starts_at_the_oldest_message_held(queues):
    queues.push(Q, "p", msgs("1", "2"))
    queues.take(Q, "early", None, 1, True)  # frees "1": the only group is done with it
    assert payloads(queues.take(Q, "late", None, 10, True)) == ["2"]


async def test_depth_figures(queues):
    queues.push(Q, "p", msgs("ab", "cd", "ef"))
    taken = queues.take(Q, G, None, 1)
    depth = queues.depth(Q)
    assert (depth.messages, depth.bytes, depth.declared) == (3, 6, False)
    assert depth.partitions[0] | {"oldestAgeMs": 0} == {
        "partition": "p", "messages": 3, "bytes": 6, "head": 0, "tail": 3, "oldestAgeMs": 0}
    group = depth.groups[0]
    assert (group.group, group.pending, group.leased) == (G, 2, 1)
    assert group.partitions == [{"partition": "p", "cursor": 1, "pending": 2, "leased": 1}]
    assert taken and depth.counts["popped"] == 1


async def test_a_push_wakes_one_parked_pop_per_group():
    queues = EphemeralQueues(1 << 20)
    a1, a2, b = (queues.park(Q, "a", None), queues.park(Q, "a", None),
                 queues.park(Q, "b", "other"))
    queues.push(Q, "p", msgs("x"))
    assert a1.future.done() and not a2.future.done() and not b.future.done()
    queues.push(Q, "other", msgs("y"))
    assert a2.future.done() and b.future.done()
    for waiter in (a1, a2, b):
        queues.unpark(Q, waiter)
    assert queues.gate.count() == 0


async def test_the_actors_timer_expires_a_lease_and_wakes_a_parked_pop():
    queues = EphemeralQueues(1 << 20)
    EphemeralKeeper.start(queues)
    try:
        queues.configure(Q, QueueOptions(lease_seconds=1))
        queues.push(Q, "p", msgs("m"))
        assert queues.take(Q, G, None, 1)
        waiter = queues.park(Q, G, None)
        started = time.monotonic()
        # The lease's one second is the semantics being tested: the timer, not a call, ends it.
        await asyncio.wait_for(waiter.future, 10)
        assert time.monotonic() - started >= 0.5
        queues.unpark(Q, waiter)
        assert queues.take(Q, G, None, 1)[0][3] == 2
    finally:
        await stop_all()


def test_options_are_a_closed_checked_list():
    assert parse_patch({"policy": "drop-oldest", "windowBuffer": {"ms": 5}}) == {
        "policy": "drop_oldest", "windowBuffer": {"ms": 5}}
    for bad in ({"ttl_second": 1}, {"maxLength": 0}, {"maxLength": True}, {"policy": "drop"},
                {"windowBuffer": {"ms": 1, "size": 2}}, {"leaseSeconds": 1.5}, []):
        with pytest.raises(BadRequest):
            parse_patch(bad)
