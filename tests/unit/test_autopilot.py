"""actors/autopilot.py: the pop-sizing rule on a fake clock (docs/wire-contract.md §5.8)."""
from __future__ import annotations

from actors.autopilot import (
    MAX_BATCH,
    MAX_PARTITIONS,
    SAFETY,
    START_BATCH,
    WAIT_MAX_MS,
    WAIT_MIN_MS,
    Ask,
    Autopilot,
)
from actors.hotlist import HotList


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


FREE = Ask(None, None)


def test_pinned_knobs_are_never_changed():
    pilot = Autopilot(Clock())
    d = pilot.decide("q", "g", Ask(7, 3), ready=50)
    assert (d.batch, d.partitions, d.batch_chosen, d.partitions_chosen) == (7, 3, False, False)
    d = pilot.decide("q", "g", Ask(None, 1), ready=50)
    assert d.partitions == 1 and not d.partitions_chosen and d.batch_chosen
    d = pilot.decide("q", "g", Ask(9, None), ready=50)
    assert d.batch == 9 and not d.batch_chosen and d.partitions_chosen


def test_starts_small_and_grows_only_once_the_pace_is_known():
    clock = Clock()
    pilot = Autopilot(clock)
    assert pilot.decide("q", "g", FREE, ready=1).batch == START_BATCH
    pilot.took("q", "g", ["p"], START_BATCH, 30.0, full=True)
    assert pilot.decide("q", "g", FREE, ready=1).batch == START_BATCH  # no pace yet
    clock.t += 0.01
    pilot.released("q", "g", "p")
    batches = []
    for _ in range(12):
        b = pilot.decide("q", "g", FREE, ready=1).batch
        batches.append(b)
        pilot.took("q", "g", ["p"], b, 30.0, full=True)
        clock.t += 0.01
        pilot.released("q", "g", "p")
    assert batches[:2] == [START_BATCH, 2 * START_BATCH]
    assert batches == sorted(batches) and batches[-1] == MAX_BATCH


def test_batch_never_exceeds_what_the_consumer_finishes_within_its_lease():
    clock = Clock()
    pilot = Autopilot(clock)
    lease_s, per_message_s = 2.0, 0.25
    for _ in range(10):
        b = pilot.decide("q", "g", FREE, ready=1).batch
        pilot.took("q", "g", ["p"], b, lease_s, full=True)
        clock.t += b * per_message_s
        pilot.released("q", "g", "p")
        assert pilot.decide("q", "g", FREE, ready=1).batch <= lease_s / per_message_s * SAFETY


def test_a_lease_that_runs_out_shrinks_the_batch():
    clock = Clock()
    pilot = Autopilot(clock)
    pilot.took("q", "g", ["p"], 4, 1.0, full=True)
    clock.t += 0.004
    pilot.released("q", "g", "p")  # fast: 1000/s
    pilot.took("q", "g", ["p"], 8, 1.0, full=True)
    clock.t += 5.0  # never acked: the lease ran out
    assert pilot.decide("q", "g", FREE, ready=1).batch <= 1


def test_auto_ack_pops_have_no_lease_to_overrun():
    clock = Clock()
    pilot = Autopilot(clock)
    pilot.took("q", "g", ["p"], 4, 1.0, full=True)
    clock.t += 4.0
    pilot.released("q", "g", "p")  # 1 message a second
    assert pilot.decide("q", "g", FREE, ready=1).batch == 1
    assert pilot.decide("q", "g", Ask(None, None, auto_ack=True), ready=1).batch >= 1


def test_partitions_are_the_groups_fair_share_of_the_ready_ones():
    clock = Clock()
    pilot = Autopilot(clock)
    assert pilot.decide("q", "g", FREE, ready=0).partitions == 1
    assert pilot.decide("q", "g", FREE, ready=3).partitions == 3
    assert pilot.decide("q", "g", FREE, ready=100).partitions == START_BATCH  # <= batch
    pilot.took("q", "g", ["a"], 1, 30.0, full=False)  # another consumer holds a lease
    assert pilot.decide("q", "g", FREE, ready=3).partitions == 2
    assert MAX_PARTITIONS >= START_BATCH


def test_wait_advice_follows_the_arrival_rate():
    clock = Clock()
    pilot = Autopilot(clock)
    assert pilot.wait_ms("q") == WAIT_MAX_MS  # nothing pushed yet
    for _ in range(40):
        clock.t += 0.5
        pilot.pushed("q", 50)  # 100 per second
    assert pilot.wait_ms("q") == WAIT_MIN_MS
    clock.t += 60  # pushes stopped
    assert pilot.wait_ms("q") == WAIT_MAX_MS


def test_hotlist_sizes_from_its_ring_and_feeds_the_pilot():
    clock = Clock()
    hl = HotList(clock=clock, jitter_ms=0)
    hl.take("q", "g", 1)
    hl.seed("q", "g", ["a", "b", "c"])
    sized = hl.take_sized("q", "g", FREE, extra=0)
    assert sized.decision.partitions == 3 and len(sized.take.entries) == 3
    hl.check_in("q", "g", [(p, e, "took", 5.0) for p, e in sized.take.entries],
                took=(["a", "b", "c"], 3, 30.0, False))
    assert hl.pilot.stats()["leases"] == 3
    clock.t += 1
    hl.ack_released("q", "g", "a")  # the lease's partitions finish together
    assert hl.pilot.stats()["leases"] == 0
    hl.mark("q", "a")
    hl.forget_queue("q")
    assert hl.pilot.stats() == {"groups": 0, "leases": 0}
