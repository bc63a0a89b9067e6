"""The ephemeral queues' ring logic (actors/ephemeral), driven through the keeper actor's
messages (docs/ephemeral.md). No HTTP, no database; time is a fake clock the tests move,
and ``sweep()`` runs what is due, as the actor's timer would."""
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
async def keeper(clock):
    queues = EphemeralQueues(1 << 30, clock=clock, incarnation="0123456789ab")
    proxy = EphemeralKeeper.start(queues).proxy()
    try:
        yield proxy
    finally:
        await stop_all()


async def configure(keeper, **knobs) -> QueueOptions:
    return await keeper.configure(Q, QueueOptions(**knobs))


def payloads(taken) -> list[str]:
    return [text for _id, _part, text, _n in taken]


async def test_fifo_per_partition_and_ack_frees_memory(keeper):
    assert (await keeper.push(Q, "p", msgs("1", "2", "3"))).pushed == 3
    taken = await keeper.take(Q, G, None, 2)
    assert payloads(taken) == ["1", "2"] and [n for *_, n in taken] == [1, 1]
    assert [part for _i, part, _t, _n in taken] == ['"p"', '"p"']
    figures = await keeper.figures()
    assert (figures["messages"], figures["bytes"]) == (3, 3)
    outcomes = await keeper.ack(Q, G, [(taken[1][0], "completed"), (taken[0][0], "completed")])
    assert outcomes == [("acked", False), ("acked", False)]
    figures = await keeper.figures()
    assert (figures["messages"], figures["bytes"]) == (1, 1)  # both done: freed
    assert payloads(await keeper.take(Q, G, None, 10)) == ["3"]


async def test_fan_out_groups_each_see_everything_and_hold_the_ring(keeper):
    await keeper.available(Q, "a")  # both groups are known before the push
    await keeper.available(Q, "b")
    await keeper.push(Q, "p", msgs("x", "y"))
    a = await keeper.take(Q, "a", None, 10)
    await keeper.ack(Q, "a", [(m[0], "completed") for m in a])
    assert (await keeper.figures())["messages"] == 2  # b has not read them yet
    b = await keeper.take(Q, "b", None, 10)
    assert payloads(a) == payloads(b) == ["x", "y"]
    await keeper.ack(Q, "b", [(m[0], "completed") for m in b])
    assert (await keeper.figures())["messages"] == 0


async def test_competing_consumers_of_one_group_get_disjoint_batches(keeper):
    await keeper.push(Q, "p", msgs(*"abcdef"))
    first = await keeper.take(Q, G, None, 2)
    second = await keeper.take(Q, G, None, 2)
    assert payloads(first) == ["a", "b"] and payloads(second) == ["c", "d"]
    depth = await keeper.depth(Q)
    assert (depth.groups[0].leased, depth.groups[0].pending) == (4, 2)


async def test_lease_expiry_redelivers_with_attempts_then_drops_at_the_limit(keeper, clock):
    await configure(keeper, lease_seconds=5, retry_limit=1)
    await keeper.push(Q, "p", msgs("m"))
    assert [n for *_, n in await keeper.take(Q, G, None, 1)] == [1]
    assert await keeper.take(Q, G, None, 1) == []  # leased
    clock.t += 5
    assert await keeper.sweep() == 1
    again = await keeper.take(Q, G, None, 1)
    assert payloads(again) == ["m"] and again[0][3] == 2
    clock.t += 5
    await keeper.sweep()  # second delivery was the last (1 + retryLimit)
    assert await keeper.take(Q, G, None, 1) == []
    figures = await keeper.figures()
    assert figures["counts"]["dropped_retry_limit"] == 1 and figures["messages"] == 0


async def test_failed_and_retry_acks_redeliver_and_the_last_is_dropped(keeper):
    await configure(keeper, retry_limit=1)
    await keeper.push(Q, "p", msgs("m", "n"))
    taken = await keeper.take(Q, G, None, 2)
    assert await keeper.ack(Q, G, [(taken[0][0], "failed")]) == [("redelivered", False)]
    again = await keeper.take(Q, G, None, 1)
    assert again[0][0] == taken[0][0] and again[0][3] == 2  # same id, attempts + 1
    assert await keeper.ack(Q, G, [(again[0][0], "retry")]) == [("acked", True)]
    assert await keeper.ack(Q, G, [(taken[1][0], "completed")]) == [("acked", False)]
    assert await keeper.ack(Q, G, [(taken[1][0], "completed")]) == [("unknown", False)]
    assert (await keeper.figures())["counts"]["dropped_retry_limit"] == 1


async def test_auto_ack_moves_the_cursor_at_delivery(keeper):
    await keeper.push(Q, "p", msgs("a", "b"))
    taken = await keeper.take(Q, G, None, 5, True)
    assert payloads(taken) == ["a", "b"]
    assert (await keeper.figures())["messages"] == 0
    assert await keeper.ack(Q, G, [(taken[0][0], "completed")]) == [("unknown", False)]


async def test_reject_refuses_the_whole_push_and_drop_oldest_evicts(keeper):
    await configure(keeper, max_length=3)
    await keeper.push(Q, "p", msgs("1", "2"))
    verdict = await keeper.push(Q, "p", msgs("3", "4"))
    assert verdict.status == "full" and verdict.pushed == 0
    assert (await keeper.figures())["counts"]["rejected_full"] == 2
    await configure(keeper, max_length=3, policy="drop_oldest")
    assert (await keeper.push(Q, "q", msgs("3", "4"))).pushed == 2
    assert payloads(await keeper.take(Q, G, "p", 10, True)) == ["2"]
    assert payloads(await keeper.take(Q, G, "q", 10, True)) == ["3", "4"]
    assert (await keeper.figures())["counts"]["dropped_length"] == 1


async def test_max_bytes_and_a_push_that_can_never_fit(keeper):
    await configure(keeper, max_bytes=10, policy="drop_oldest")
    await keeper.push(Q, "p", msgs("aaaa", "bbbb"))
    await keeper.push(Q, "p", msgs("cccc"))
    assert payloads(await keeper.take(Q, G, None, 10, True)) == ["bbbb", "cccc"]
    assert (await keeper.figures())["counts"]["dropped_bytes"] == 1
    assert (await keeper.push(Q, "p", msgs("x" * 11))).status == "too_large"


async def test_the_global_budget_refuses_pushes_past_it(clock):
    # room for the queue, its group, its ring and the group's cursor, and two messages
    queues = EphemeralQueues(4 * STRUCTURE_CHARGE + 2 * (ENTRY_OVERHEAD + 4), clock=clock)
    keeper = EphemeralKeeper.start(queues).proxy()
    try:
        assert await keeper.take("a", G, None, 1, True) == []  # the queue and its group
        assert (await keeper.push("a", "p", msgs("1234", "5678"))).pushed == 2
        verdict = await keeper.push("a", "p", msgs("9"))
        assert verdict.status == "memory" and "EPHEMERAL_MAX_BYTES" in verdict.detail
        await keeper.take("a", G, None, 1, True)
        assert (await keeper.push("a", "p", msgs("9"))).pushed == 1
        assert queues.used() <= queues.budget
    finally:
        await stop_all()


async def test_made_up_names_are_charged_and_refused_past_the_budget(clock):
    queues = EphemeralQueues(3 * STRUCTURE_CHARGE, clock=clock)
    keeper = EphemeralKeeper.start(queues).proxy()
    try:
        assert await keeper.take("a", G, None, 1, False) == []  # queue + group: 2 charges
        with pytest.raises(MemoryFull):
            await keeper.take("b", G, None, 1, False)  # another queue and group: no room
        assert (await keeper.push("a", "p", msgs("x"))).status == "memory"  # a new ring
        assert await keeper.delete("a")
        assert queues.used() == STRUCTURE_CHARGE  # b, created before its group found no room
        assert await keeper.take("b", G, None, 1, False) == []
    finally:
        await stop_all()


async def test_ttl_drops_aged_messages_at_their_age(keeper, clock):
    await configure(keeper, ttl_seconds=10)
    await keeper.push(Q, "p", msgs("old"))
    clock.t += 6
    await keeper.push(Q, "p", msgs("young"))
    clock.t += 4
    await keeper.sweep()
    assert payloads(await keeper.take(Q, G, None, 10, True)) == ["young"]
    assert (await keeper.figures())["counts"]["dropped_ttl"] == 1


async def test_stale_and_unknown_ids(keeper):
    await keeper.push(Q, "p", msgs("a"))
    old = (await keeper.take(Q, G, None, 1))[0][0]
    assert await keeper.reset(Q) == 1
    await keeper.push(Q, "p", msgs("b"))
    new = (await keeper.take(Q, G, None, 1))[0][0]
    assert new != old
    other_broker = "fedcba987654" + old[12:]
    outcomes = await keeper.ack(Q, G, [(old, "completed"), (other_broker, "completed"),
                                       ("not-an-id", "completed"), (new + "9", "completed"),
                                       (new, "completed")])
    assert [o for o, _ in outcomes] == ["stale", "stale", "unknown", "unknown", "acked"]
    assert await keeper.ack("other", G, [(new, "completed")]) == [("unknown", False)]


async def test_reset_keeps_options_and_delete_forgets_everything(keeper):
    await configure(keeper, max_length=7)
    await keeper.push(Q, "p", msgs("a"))
    assert await keeper.reset(Q) == 1 and await keeper.reset("nope") == 0
    depth = await keeper.depth(Q)
    assert depth.options.max_length == 7 and depth.messages == 0
    assert await keeper.delete(Q) is True and await keeper.delete(Q) is False
    assert await keeper.depth(Q) is None


async def test_partitionless_pop_spans_partitions_in_order_per_partition(keeper):
    await keeper.push(Q, "a", msgs("a1", "a2"))
    await keeper.push(Q, "b", msgs("b1", "b2"))
    got = payloads(await keeper.take(Q, G, None, 10, True))
    assert sorted(got) == ["a1", "a2", "b1", "b2"]
    assert got.index("a1") < got.index("a2") and got.index("b1") < got.index("b2")


async def test_a_new_group_starts_at_the_oldest_message_held(keeper):
    await keeper.push(Q, "p", msgs("1", "2"))
    await keeper.take(Q, "early", None, 1, True)  # frees "1": the only group is done with it
    assert payloads(await keeper.take(Q, "late", None, 10, True)) == ["2"]


async def test_depth_figures(keeper):
    await keeper.push(Q, "p", msgs("ab", "cd", "ef"))
    taken = await keeper.take(Q, G, None, 1)
    depth = await keeper.depth(Q)
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
    keeper = EphemeralKeeper.start(queues).proxy()
    try:
        await keeper.configure(Q, QueueOptions(lease_seconds=1))
        await keeper.push(Q, "p", msgs("m"))
        assert await keeper.take(Q, G, None, 1)
        waiter = queues.park(Q, G, None)
        started = time.monotonic()
        # The lease's one second is the semantics being tested: the timer, not a call, ends it.
        await asyncio.wait_for(waiter.future, 10)
        assert time.monotonic() - started >= 0.5
        queues.unpark(Q, waiter)
        assert (await keeper.take(Q, G, None, 1))[0][3] == 2
    finally:
        await stop_all()


def test_options_are_a_closed_checked_list():
    assert parse_patch({"policy": "drop-oldest", "windowBuffer": {"ms": 5}}) == {
        "policy": "drop_oldest", "windowBuffer": {"ms": 5}}
    for bad in ({"ttl_second": 1}, {"maxLength": 0}, {"maxLength": True}, {"policy": "drop"},
                {"windowBuffer": {"ms": 1, "size": 2}}, {"leaseSeconds": 1.5}, []):
        with pytest.raises(BadRequest):
            parse_patch(bad)
