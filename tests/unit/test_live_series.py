"""actors/live_series.py without HTTP: per-second deltas of the counters, missing seconds
read as zero, the depth history per queue."""
from __future__ import annotations

from actors.live_series import LiveSeries


def make(totals: dict, depths: dict | None = None) -> LiveSeries:
    async def read_depths():
        if depths is None:
            raise ConnectionError("database down")
        return dict(depths)
    return LiveSeries(lambda: dict(totals), read_depths)


def test_each_second_holds_the_counters_growth():
    totals = {"pushed": 0, "popped": 0, "acked": 0}
    s = make(totals)
    s.sample(now=100.2)                      # the first sample only sets the baseline
    totals.update(pushed=5, popped=2)
    s.sample(now=101.1)
    totals.update(pushed=6, popped=2, acked=2)
    s.sample(now=101.9)                      # same second: added to it
    totals.update(pushed=10)
    s.sample(now=103.0)                      # second 102 had no sample
    assert s.throughput_series(4, now=104.5) == [
        (100, 0, 0, 0), (101, 6, 2, 2), (102, 0, 0, 0), (103, 4, 0, 0)]


def test_a_counter_that_goes_down_never_gives_a_negative_rate():
    totals = {"pushed": 9, "popped": 0, "acked": 0}
    s = make(totals)
    s.sample(now=10.0)
    totals["pushed"] = 3
    s.sample(now=11.0)
    assert s.throughput_series(1, now=12.0) == [(11, 0, 0, 0)]


async def test_depth_history_per_queue_and_a_failed_read_is_a_gap():
    depths = {"a": 3}
    s = make({"pushed": 0, "popped": 0, "acked": 0}, depths)
    await s.sample_depth()
    depths.update(a=1, b=4)
    await s.sample_depth()
    assert [d for _, d in s.depth_series("a")] == [3, 1]
    assert [d for _, d in s.depth_series("b")] == [None, 4]
    down = make({"pushed": 0, "popped": 0, "acked": 0}, None)
    await down.sample_depth()
    assert down.depth_series("a") == [] and down.depth_failures == 1


def test_depth_history_keeps_its_figures_when_old_samples_fall_off():
    """Samples store only what changed; the figures stay right once the sample that
    carried a queue's last change has been dropped."""
    from actors.live_series import DEPTH_POINTS
    s = make({"pushed": 0, "popped": 0, "acked": 0}, {})
    s.record_depths(0.0, {"idle": 5, "busy": 0, "gone": 1})
    for i in range(1, DEPTH_POINTS + 10):
        s.record_depths(float(i), {"idle": 5, "busy": i})
    assert len(s.depth) == DEPTH_POINTS
    assert {v for _, v in s.depth_series("idle")} == {5}
    assert [v for _, v in s.depth_series("busy")][-3:] == [DEPTH_POINTS + 7, DEPTH_POINTS + 8,
                                                            DEPTH_POINTS + 9]
    assert {v for _, v in s.depth_series("gone")} == {None}
    assert all(len(changes) <= 1 for _, changes in list(s.depth)[1:]), "only changes are kept"
