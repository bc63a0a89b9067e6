"""Invariants of the hot-list (actors/hotlist.py), docs/behaviour.md §2 and §14 invariants 33-38.

No database: tests play the pop route, passing verdicts by hand. Time is
injected (`now=` / a fake clock), nothing sleeps.
"""

from __future__ import annotations

import pytest

from actors.hotlist import (
    DEFERRED,
    EMPTY,
    LEASED,
    REQUEUE,
    TOOK,
    TOOK_AUTOACK,
    HotList,
    Take,
)

Q, G = "orders", "workers"


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def hl(clock) -> HotList:
    return HotList(reseed_ms=30_000, jitter_ms=0, clock=clock)


def seeded(hl: HotList, *partitions: str, queue: str = Q, group: str = G) -> HotList:
    """Open the group's ring the way a pop does: cold take, then the seed it asks for."""
    assert hl.take(queue, group, 10) == Take(True, [])
    hl.seed(queue, group, partitions)
    return hl


def names(take: Take) -> list[str]:
    return [p for p, _ in take.entries]


def take_all(hl: HotList, queue: str = Q, group: str = G) -> Take:
    return hl.take(queue, group, 1000)


# --- rings and marks --------------------------------------------------------


def test_marks_for_a_queue_without_rings_are_dropped(hl):
    assert hl.mark(Q, "p1") is False
    assert hl.stats() == {"rings": 0, "ready": 0, "wheel": 0, "inflight": 0}
    seeded(hl)
    assert names(take_all(hl)) == []  # the earlier mark left nothing behind


def test_marks_reach_only_groups_with_a_ring(hl):
    seeded(hl, group="g1")
    assert hl.mark(Q, "p1") is True
    assert hl.stats()["rings"] == 1
    assert names(take_all(hl, group="g1")) == ["p1"]
    # g2 polls later: its cold take asks for a seed, nothing served yet.
    assert hl.take(Q, "g2", 10) == Take(True, [])


def test_mark_reaches_every_group_ring_of_the_queue(hl):
    seeded(hl, group="g1")
    seeded(hl, group="g2")
    seeded(hl, queue="other")
    assert hl.mark(Q, "p1") is True
    assert names(take_all(hl, group="g1")) == ["p1"]
    assert names(take_all(hl, group="g2")) == ["p1"]
    assert names(take_all(hl, queue="other")) == []


def test_invariant_33_no_second_ring_entry(hl):
    seeded(hl)
    assert hl.mark(Q, "p1") is True  # empty -> pending
    for _ in range(100):
        assert hl.mark(Q, "p1") is False  # already pending: epoch bump only
    assert hl.stats()["ready"] == 1
    assert names(take_all(hl)) == ["p1"]


def test_mark_while_inflight_or_wheel_does_not_duplicate(hl, clock):
    seeded(hl, "a", "b")
    t = take_all(hl)
    assert hl.mark(Q, "a") is False  # INFLIGHT
    hl.check_in(Q, G, [("b", t.entries[1][1], TOOK, 30.0)])
    assert hl.mark(Q, "b") is False  # WHEEL
    assert hl.stats() == {"rings": 1, "ready": 0, "wheel": 1, "inflight": 1}


def test_mark_many_returns_transitions_once(hl):
    seeded(hl, "old")
    got = hl.mark_many([(Q, "old"), (Q, "new"), (Q, "new"), ("nobody", "x")])
    assert got == [(Q, "new")]


def test_fifo_fairness_across_partitions(hl):
    seeded(hl)
    for p in ["a", "b", "c", "d"]:
        hl.mark(Q, p)
    first = hl.take(Q, G, 2)
    assert names(first) == ["a", "b"]
    # a delivered (autoAck) goes to the tail, behind c and d.
    hl.check_in(Q, G, [("a", first.entries[0][1], TOOK_AUTOACK, None),
                       ("b", first.entries[1][1], REQUEUE, None)])
    assert names(take_all(hl)) == ["c", "d", "a", "b"]


def test_take_marks_inflight_and_snapshots_epochs(hl):
    seeded(hl)
    hl.mark(Q, "a")
    hl.mark(Q, "a")
    hl.mark(Q, "a")
    t = take_all(hl)
    assert t.entries == [("a", 2)]
    assert hl.stats()["inflight"] == 1
    assert take_all(hl).entries == []  # INFLIGHT entries are not handed out twice


# --- invariant 34: epoch compare-and-clear ----------------------------------


def test_invariant_34_empty_with_unchanged_epoch_clears(hl):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    assert hl.check_in(Q, G, [(p, epoch, EMPTY, None)]) is False
    assert hl.stats() == {"rings": 1, "ready": 0, "wheel": 0, "inflight": 0}
    assert hl.mark(Q, "p1") is True  # IDLE again: the next push is a transition


def test_invariant_34_empty_after_a_racing_push_keeps_the_candidate(hl):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    assert hl.mark(Q, "p1") is False  # push committed while the claim ran
    assert hl.check_in(Q, G, [(p, epoch, EMPTY, None)]) is True
    assert names(take_all(hl)) == ["p1"]


def test_racing_ack_release_keeps_an_inflight_candidate(hl):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    assert hl.ack_released(Q, G, "p1") is False  # INFLIGHT: epoch bump
    hl.check_in(Q, G, [(p, epoch, EMPTY, None)])
    assert names(take_all(hl)) == ["p1"]


# --- check-in touches only INFLIGHT entries ---------------------------------


def test_check_in_ignores_entries_no_longer_inflight(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, TOOK, 30.0)])  # -> WHEEL
    # A duplicate / late check-in for the same take changes nothing.
    assert hl.check_in(Q, G, [(p, epoch, EMPTY, None)]) is False
    assert hl.stats()["wheel"] == 1
    # Promoted to READY by an ack: a stale check-in leaves it READY.
    assert hl.ack_released(Q, G, "p1") is True
    hl.check_in(Q, G, [(p, epoch, EMPTY, None)])
    assert names(take_all(hl)) == ["p1"]


def test_check_in_for_unknown_partition_or_ring_is_ignored(hl):
    seeded(hl)
    assert hl.check_in(Q, G, [("ghost", 0, EMPTY, None)]) is False
    assert hl.check_in("nope", G, [("ghost", 0, REQUEUE, None)]) is False
    assert hl.stats()["rings"] == 1


def test_unknown_verdict_is_rejected_before_any_change(hl):
    seeded(hl, "a", "b")
    t = take_all(hl)
    with pytest.raises(ValueError):
        hl.check_in(Q, G, [("a", t.entries[0][1], EMPTY, None), ("b", 0, "bogus", None)])
    assert hl.stats()["inflight"] == 2


# --- the wheel: took / leased / deferred --------------------------------------


def test_took_revisits_after_lease_plus_padding(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, TOOK, 30.0)])
    clock.t += 30.29
    assert take_all(hl).entries == []
    clock.t += 0.02
    assert names(take_all(hl)) == ["p1"]


def test_own_ack_pulls_a_took_entry_back_early(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, TOOK, 30.0)])
    assert hl.ack_released(Q, G, "p1") is True
    assert names(take_all(hl)) == ["p1"]
    assert hl.stats()["wheel"] == 0


def test_invariant_36_leased_is_never_cleared_and_revisited_after_expiry(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    until = clock.t + 0.3
    hl.check_in(Q, G, [(p, epoch, LEASED, until)])
    assert hl.stats()["wheel"] == 1
    # Looked at again first 250 ms after the verdict, doubling while it stays leased, and
    # never later than the lease's end + 300 ms.
    clock.t += 0.249
    assert take_all(hl).entries == []
    clock.t += 0.001
    (p, epoch), = take_all(hl).entries
    assert p == "p1"
    hl.check_in(Q, G, [(p, epoch, LEASED, until)])  # 500 ms now, but the lease ends sooner
    clock.t = until + 0.299
    assert take_all(hl).entries == []
    clock.t = until + 0.3
    (p, epoch), = take_all(hl).entries
    # Still leased (the holder extended it): back to the wheel, still not cleared.
    hl.check_in(Q, G, [(p, epoch, LEASED, clock.t + 5)])
    assert hl.stats() == {"rings": 1, "ready": 0, "wheel": 1, "inflight": 0}


def test_a_leased_partition_is_looked_at_again_backing_off_until_it_is_taken(hl, clock):
    """A lease ended through another broker (or expired) reaches no ring here, so a leased
    partition is tried again after 250 ms, 500 ms, 1 s, ... 5 s, not only at the lease's
    end; a claim that takes it starts the backoff over."""
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    for wait in [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]:
        hl.check_in(Q, G, [(p, epoch, LEASED, clock.t + 300)])
        clock.t += wait - 0.001
        assert take_all(hl).entries == [], wait
        clock.t += 0.001
        (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, TOOK, 0.0)])
    clock.t += 0.3  # the lease's end (0 s here) + 300 ms
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, LEASED, clock.t + 300)])
    clock.t += 0.25
    assert names(take_all(hl)) == ["p1"]


def test_invariant_36_leased_revisited_at_once_when_ack_releases(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, LEASED, clock.t + 300)])
    assert take_all(hl).entries == []
    assert hl.ack_released(Q, G, "p1") is True  # caller wakes parked pops
    assert names(take_all(hl)) == ["p1"]


def test_ack_released_without_an_entry_is_a_no_op(hl):
    assert hl.ack_released(Q, G, "p1") is False  # no ring
    seeded(hl, "p1")
    assert hl.ack_released(Q, G, "p1") is False  # READY
    assert hl.ack_released(Q, G, "p2") is False  # IDLE
    assert hl.stats()["ready"] == 1


def test_deferred_with_due_time(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, DEFERRED, 5.0)])
    clock.t += 4.9
    assert take_all(hl).entries == []
    clock.t += 0.1
    assert names(take_all(hl)) == ["p1"]


def test_deferred_without_due_time_backs_off_within_bounds(hl, clock):
    seeded(hl, "p1")
    for delay in [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]:
        (p, epoch), = take_all(hl).entries
        start = clock.t
        hl.check_in(Q, G, [(p, epoch, DEFERRED, None)])
        clock.t = start + delay - 0.001
        assert take_all(hl).entries == []
        clock.t = start + delay
    # A delivery resets the backoff.
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, TOOK_AUTOACK, None)])
    (p, epoch), = take_all(hl).entries
    hl.check_in(Q, G, [(p, epoch, DEFERRED, None)])
    clock.t += 0.05
    assert names(take_all(hl)) == ["p1"]


def test_wheel_entries_promote_in_due_order(hl, clock):
    seeded(hl, "a", "b", "c")
    t = take_all(hl)
    e = dict(t.entries)
    hl.check_in(Q, G, [("a", e["a"], DEFERRED, 3.0),
                       ("b", e["b"], DEFERRED, 1.0),
                       ("c", e["c"], DEFERRED, 2.0)])
    clock.t += 3.0
    assert names(take_all(hl)) == ["b", "c", "a"]


def test_many_early_promotions_keep_the_wheel_bounded(hl, clock):
    seeded(hl, "p1")
    for _ in range(1000):
        (p, epoch), = take_all(hl).entries
        hl.check_in(Q, G, [(p, epoch, TOOK, 60.0)])
        hl.ack_released(Q, G, "p1")
    ring = hl._rings[Q][G]
    assert len(ring.wheel) <= 130


# --- seeding: invariants 35 and 37 --------------------------------------------


def test_invariant_37_cold_ring_asks_for_a_seed_before_serving(hl):
    # Pushed before the group ever polled: no ring, mark dropped.
    assert hl.mark(Q, "early") is False
    t = hl.take(Q, G, 10)
    assert t == Take(needs_seed=True, entries=[])
    # The caller scans PostgreSQL and reports what it found.
    assert hl.seed(Q, G, ["early"]) is True
    t = hl.take(Q, G, 10)
    assert t.needs_seed is False
    assert names(t) == ["early"]


def test_seed_is_asked_of_one_caller_at_a_time(hl, clock):
    assert hl.take(Q, G, 10).needs_seed is True
    assert hl.take(Q, G, 10) == Take(False, [])  # someone is seeding: park
    hl.seed_aborted(Q, G)  # the scan failed
    assert hl.take(Q, G, 10).needs_seed is True
    # The seeder vanished without reporting: another caller is asked later.
    clock.t += hl.seed_claim_s
    assert hl.take(Q, G, 10).needs_seed is True


def test_marks_during_a_cold_seed_are_served_after_it(hl):
    assert hl.take(Q, G, 10).needs_seed is True
    hl.mark(Q, "during")  # the ring exists now
    assert hl.seed(Q, G, []) is True  # ready entries exist: wake pops
    assert names(take_all(hl)) == ["during"]


def test_invariant_35_wrongly_cleared_partition_found_at_reseed_while_ring_busy(hl, clock):
    seeded(hl, "lost", "busy")
    t = take_all(hl)
    e = dict(t.entries)
    # A wrong clear (e.g. a missed mark): "lost" has messages but goes IDLE.
    hl.check_in(Q, G, [("lost", e["lost"], EMPTY, None),
                       ("busy", e["busy"], TOOK_AUTOACK, None)])
    clock.t += 29.9
    t = take_all(hl)
    assert t.needs_seed is False
    assert names(t) == ["busy"]
    hl.check_in(Q, G, [("busy", t.entries[0][1], TOOK_AUTOACK, None)])
    clock.t += 0.1  # reseed floor reached; the ring is non-empty
    t = take_all(hl)
    assert t.needs_seed is True
    assert names(t) == ["busy"]  # served as well
    assert hl.seed(Q, G, ["lost", "busy"]) is True
    assert names(take_all(hl)) == ["lost"]
    # The reseed clock restarted.
    assert hl.take(Q, G, 10).needs_seed is False


def test_reseed_floor_includes_a_fixed_per_group_jitter(clock):
    hl = HotList(reseed_ms=30_000, jitter_ms=15_000, clock=clock)
    seeded(hl)
    jitter = hl._rings[Q][G].jitter
    assert 0 <= jitter < 15.0
    clock.t += 30.0 + jitter - 0.01
    assert hl.take(Q, G, 1).needs_seed is False
    clock.t += 0.02  # past the floor (clear of float rounding at the boundary)
    assert hl.take(Q, G, 1).needs_seed is True
    hl.seed(Q, G, [])
    assert hl._rings[Q][G].jitter == jitter


def test_seed_keeps_ready_and_wheel_entries(hl, clock):
    seeded(hl, "r", "w")
    t = take_all(hl)
    e = dict(t.entries)
    hl.check_in(Q, G, [("r", e["r"], REQUEUE, None), ("w", e["w"], TOOK, 30.0)])
    assert hl.seed(Q, G, ["r", "w"]) is False  # nothing newly READY
    assert hl.stats() == {"rings": 1, "ready": 1, "wheel": 1, "inflight": 0}


def test_seed_reclaims_stranded_inflight_only_after_grace(hl, clock):
    seeded(hl, "p1")
    (p, epoch), = take_all(hl).entries  # this pop will vanish
    clock.t += 10
    assert hl.seed(Q, G, ["p1"]) is False  # taken recently: leave it
    assert hl.stats()["inflight"] == 1
    clock.t += 50
    assert hl.seed(Q, G, []) is True  # stranded: back to READY even if unlisted
    (p2, epoch2), = take_all(hl).entries
    assert p2 == "p1" and epoch2 != epoch
    # The vanished pop's late check-in now looks like a race: not cleared
    # (at worst a false positive; the second pop's check-in is then ignored).
    hl.check_in(Q, G, [(p, epoch, EMPTY, None)])
    assert hl.stats() == {"rings": 1, "ready": 1, "wheel": 0, "inflight": 0}



def test_database_back_gives_back_inflight_and_wheel_entries_at_once(hl, clock):
    seeded(hl, "p1", "p2", "p3", "p4")
    e = dict(hl.take(Q, G, 3).entries)  # p1..p3; the pops holding p1, p2 hang on the database
    hl.check_in(Q, G, [("p3", e["p3"], TOOK, 30.0)])
    clock.t += 5  # long before stranded_after_s or the reseed floor
    assert hl.reconcile(clock.t) == 3
    assert hl.stats() == {"rings": 1, "ready": 4, "wheel": 0, "inflight": 0}
    t = take_all(hl)
    assert t.needs_seed  # the ring reseeds on its next take
    assert names(t) == ["p4", "p1", "p2", "p3"]  # READY first, then the reclaimed
    assert dict(t.entries)["p1"] != e["p1"]  # a late check-in of the lost pop sees a race


def test_database_back_leaves_candidates_taken_after_the_return(hl, clock):
    seeded(hl, "p1", "p2")
    back = clock.t
    clock.t += 0.01
    hl.take(Q, G, 1)  # p1: taken by a pop after the database came back
    assert hl.reconcile(back) == 0
    assert hl.stats()["inflight"] == 1


def test_database_back_keeps_a_cold_ring_cold(hl):
    assert hl.take(Q, G, 10) == Take(True, [])  # asked to seed; the scan failed
    hl.seed_aborted(Q, G)
    assert hl.reconcile() == 0
    assert hl.take(Q, G, 10) == Take(True, [])


# --- invariant 38: dirty-hint coalescing --------------------------------------


def test_invariant_38_many_local_marks_one_dirty_hint(hl):
    seeded(hl)
    for _ in range(1000):
        hl.mark(Q, "p1")
    hl.mark(Q, "p2")
    assert hl.pending_dirty() == 2
    assert hl.drain_dirty() == [(Q, "p1"), (Q, "p2")]
    assert hl.pending_dirty() == 0
    hl.mark(Q, "p1")  # next flush window
    assert hl.drain_dirty() == [(Q, "p1")]


def test_local_marks_are_hinted_even_without_local_rings(hl):
    # Consumers may poll through a peer broker: the hint must still go out.
    assert hl.mark(Q, "p1") is False
    assert hl.drain_dirty() == [(Q, "p1")]


def test_remote_marks_are_never_rebroadcast(hl):
    seeded(hl)
    assert hl.mark(Q, "p1", remote=True) is True  # same effect locally
    assert hl.mark_many([(Q, "p2")], remote=True) == [(Q, "p2")]
    assert hl.pending_dirty() == 0
    assert names(take_all(hl)) == ["p1", "p2"]


def test_drain_dirty_in_batches_oldest_first(hl):
    for i in range(5):
        hl.mark(Q, f"p{i}")
    assert hl.drain_dirty(2) == [(Q, "p0"), (Q, "p1")]
    assert hl.drain_dirty(10) == [(Q, "p2"), (Q, "p3"), (Q, "p4")]
    assert hl.drain_dirty(1) == []


def test_dirty_set_is_bounded(clock):
    hl = HotList(jitter_ms=0, max_dirty=3, clock=clock)
    for i in range(10):
        hl.mark(Q, f"p{i}")
    assert hl.pending_dirty() == 3
    assert hl.drain_dirty() == [(Q, "p0"), (Q, "p1"), (Q, "p2")]


def test_dirty_tracking_can_be_off(clock):
    hl = HotList(jitter_ms=0, track_dirty=False, clock=clock)
    hl.mark(Q, "p1")
    assert hl.pending_dirty() == 0


# --- forget_queue ---------------------------------------------------------------


def test_forget_queue_drops_its_rings_only(hl):
    seeded(hl, "a", group="g1")
    seeded(hl, "b", group="g2")
    seeded(hl, "c", queue="other")
    t = take_all(hl, group="g1")
    hl.forget_queue(Q)
    assert hl.stats() == {"rings": 1, "ready": 1, "wheel": 0, "inflight": 0}
    assert hl.check_in(Q, "g1", [("a", t.entries[0][1], REQUEUE, None)]) is False
    assert hl.mark(Q, "a") is False  # no ring any more
    # A new poll starts cold again.
    assert hl.take(Q, "g1", 10) == Take(True, [])


def test_forget_queue_drops_queued_dirty_hints(hl):
    hl.mark(Q, "a")
    hl.mark("other", "b")
    hl.forget_queue(Q)
    assert hl.drain_dirty() == [("other", "b")]


# --- through the actor's proxy (what the broker runs) -----------------------------


@pytest.fixture
async def actor():
    ref = HotList.start(reseed_ms=30_000, jitter_ms=0)
    yield ref
    await ref.stop(block=False)


async def test_actor_full_pop_cycle(actor):
    hot = actor.proxy()
    assert await hot.mark(Q, "early") is False
    t = await hot.take(Q, G, 10)
    assert t == Take(True, [])
    assert await hot.seed(Q, G, ["early"]) is True
    assert await hot.mark(Q, "late") is True
    t = await hot.take(Q, G, 10)
    assert names(t) == ["early", "late"]
    e = dict(t.entries)
    await hot.mark(Q, "late")  # races the claim
    assert await hot.check_in(Q, G, [("early", e["early"], EMPTY, None),
                                     ("late", e["late"], EMPTY, None)]) is True
    assert await hot.stats() == {"rings": 1, "ready": 1, "wheel": 0, "inflight": 0}
    assert await hot.drain_dirty(10) == [(Q, "early"), (Q, "late")]


async def test_actor_lease_and_ack_and_tell(actor):
    hot = actor.proxy()
    await hot.take(Q, G, 10)
    await hot.seed(Q, G, ["p1"])
    (p, epoch), = (await hot.take(Q, G, 10)).entries
    await hot.check_in(Q, G, [(p, epoch, TOOK, 60.0)])
    assert (await hot.take(Q, G, 10)).entries == []
    assert await hot.ack_released(Q, G, "p1") is True
    assert names(await hot.take(Q, G, 10)) == ["p1"]
    # A fire-and-forget call (not awaited) lands before a later ask: FIFO inbox.
    hot.mark_many([(Q, "x"), (Q, "y")], remote=True)
    assert (await hot.stats())["ready"] == 2  # p1 is INFLIGHT
    assert await hot.pending_dirty() == 0  # remote marks and seeds queue no hints
    await hot.forget_queue(Q)
    assert await hot.stats() == {"rings": 0, "ready": 0, "wheel": 0, "inflight": 0}


def test_rings_of_groups_that_stopped_polling_are_dropped(clock):
    """A ring nobody took from for idle_ring_s is forgotten (memory stays bounded by
    the groups that poll); the group's next poll starts cold and asks for a seed."""
    hl = HotList(jitter_ms=0, idle_ring_s=600, clock=clock)
    seeded(hl, "p1")
    hl.take(Q, "other", 1)  # a second group of the same queue keeps polling
    clock.t += 601
    hl.take(Q, "other", 1)
    assert G not in hl._rings[Q] and "other" in hl._rings[Q]
    assert hl.take(Q, G, 1) == Take(True, [])
