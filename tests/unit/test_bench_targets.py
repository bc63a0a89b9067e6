"""The targets table of ``python3 dev.py bench`` (benchmarks/_targets.py): every
target gets one row whose verdict follows its threshold, whose ratio is the figure the target
bounds, and a benchmark that did not run or crashed is shown as such, never as met."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks._targets import TARGETS, peak_rss, target_rows


def fig(cpu: float, rss: float) -> dict:
    return {"broker_cpu_ms": cpu * 10, "broker_cpu_ms_per_1000": cpu, "broker_rss_mb": rss,
            "broker_peak_rss_mb": rss}


def throughput(ratios: dict[int, float], p50: float = 10.0, p99: float = 20.0) -> dict:
    return {"results": [{"batch": b, "broker_msgs_per_s": 1000 * r, "raw_msgs_per_s": 1000.0,
                         "ratio": r, "broker": fig(50, 80),
                         "request_ms": {"p50": p50, "p99": p99}} for b, r in ratios.items()]}


def all_results(**over: dict | None) -> dict[str, dict | None]:
    res: dict[str, dict | None] = {
        "push": throughput({1: 0.7, 100: 0.7}),
        "pop": throughput({1: 0.5, 100: 0.65}),
        "wake": {"latency_from_push_response_ms": {"p50": 2.0, "p99": 4.0},
                 "broker": fig(900, 70)},
        "wake_ha": {"mesh": {"latency_from_push_response_ms": {"p50": 3.0, "p99": 8.0},
                             "broker": fig(900, 72)}},
        "herd": {"push_rtt_ms": {"p50": 5.0, "p99": 15.0}, "statuses": {"queued": 200},
                 "broker": fig(9000, 95)},
        "partitions": {
            "push": [{"partitions": p, "batch": b, "msgs_per_s": 1000.0, "ratio_to_16": r,
                      "broker": fig(50, 80)}
                     for p, r in ((16, 1.0), (1000, 0.95), (10000, 0.85)) for b in (1, 100)],
            "wildcard": [{"partitions_pending": p, "partitions_served": p, "never_served": 0,
                          "last_served_after_s": 3.0, "broker": fig(60, 85)}
                         for p in (1000, 10000)]},
        "fanout": {"results": [{"groups": g, "broker": fig(c, 90),
                                "cpu_per_delivery_vs_1_group": c / 60}
                               for g, c in ((1, 60.0), (5, 62.0), (10, 66.0))]},
        "ephemeral": {"push": {"ratio": 6.0, "ephemeral_msgs_per_s": 6000.0,
                               "durable_msgs_per_s": 1000.0, "broker": fig(30, 70)}},
        "client_paths": {
            "push": [{"variant": v, "msgs_per_s": 1000.0 * r, "ratio_to_json": r,
                      "broker": fig(40, 80)} for v, r in (("json", 1.0), ("binary", 1.6),
                                                          ("frames", 1.55))],
            "pop": [{"variant": v, "msgs_per_s": 1000.0 * r, "ratio_to_json": r,
                     "broker": fig(40, 80)} for v, r in (("json", 1.0), ("frames", 1.35))],
            "drain": {"autopilot_vs_best": 1.1, "best_hand_tuned": "batch 500",
                      "results": [{"label": "autopilot", "elapsed_s": 1.1},
                                  {"label": "batch 500", "elapsed_s": 1.0}]}},
    }
    res.update(over)
    return res


def verdicts(rows: list[list[str]]) -> dict[str, str]:
    return {r[0]: r[3] for r in rows}


def test_every_target_has_a_row_and_all_met_when_the_figures_are_inside():
    rows = target_rows(all_results())
    v = verdicts(rows)
    for label, _, _ in TARGETS:
        assert v[label] == "met", (label, rows)
    rss = [r for r in rows if r[0].startswith("broker RSS")]
    assert len(rss) == len(all_results()) and all(r[3] == "met" for r in rss)


def test_a_client_path_slower_than_json_or_not_served_is_not_met():
    res = all_results()
    paths = res["client_paths"]
    assert paths is not None
    paths["push"][1]["ratio_to_json"] = 0.85
    paths["pop"][1] = {"variant": "frames", "not_served": "not served (JSON answer)"}
    paths["drain"]["autopilot_vs_best"] = 1.25
    rows = {r[0]: r for r in target_rows(res)}
    assert rows["push 100, binary QPB1 >= 1.5 x JSON msg/s"][2:] == ["0.85", "NOT met"]
    assert rows["pop + ack 100, framed QPF1 >= 1.3 x JSON msg/s"][3] == "NOT met"
    assert rows["consume() drain: autopilot time <= 1.2 x best hand-tuned"][2:] == [
        "1.25", "NOT met"]


def test_missed_targets_are_not_met_with_the_ratio_they_missed_by():
    res = all_results(push=throughput({1: 0.33, 100: 0.38}, p50=34.0, p99=144.0))
    res["herd"] = {"push_rtt_ms": {"p50": 11.0, "p99": 167.0},
                   "statuses": {"queued": 195, "buffered": 5}, "broker": fig(9000, 120)}
    rows = {r[0]: r for r in target_rows(res)}
    assert rows["push, 100 items per request >= 0.60 x raw"][2:] == ["0.38", "NOT met"]
    assert rows["push, 1 item per request >= 0.65 x raw"][2:] == ["0.33", "NOT met"]
    assert rows["push 100: request p99 <= 3 x p50"][2:] == ["4.24", "NOT met"]
    assert rows["2,000 parked long polls: push p99 < 20 ms"][2:] == ["8.35", "NOT met"]
    assert rows["2,000 parked long polls: no pool timeouts (every push queued)"][3] == "NOT met"
    assert rows["broker RSS <= 100 MB: herd"][1:] == ["peak 120 MB", "1.20", "NOT met"]


def test_an_unserved_partition_and_a_costly_fanout_are_not_met():
    res = all_results()
    res["partitions"]["wildcard"][1].update(partitions_served=9990, never_served=10)
    res["fanout"]["results"][2].update(cpu_per_delivery_vs_1_group=1.5)
    v = verdicts(target_rows(res))
    assert v["every partition with pending messages served by wildcard pops"] == "NOT met"
    assert v["fan-out: broker CPU per delivery, 10 groups <= 1.2 x 1 group"] == "NOT met"


def test_a_benchmark_not_run_or_crashed_is_never_met():
    res = all_results(wake=None)
    del res["fanout"]
    rows = {r[0]: r for r in target_rows(res)}
    assert rows["wake, one broker: p99 < 5 ms"][3] == "not run"
    assert rows["fan-out: broker CPU per delivery, 10 groups <= 1.2 x 1 group"][3] == "not run"
    assert rows["broker RSS <= 100 MB: wake"][3] == "not run"
    assert "broker RSS <= 100 MB: fanout" not in rows


def test_a_result_without_the_figure_is_not_met():
    res = all_results(wake={"latency_from_push_response_ms": {"p50": None, "p99": None}})
    assert verdicts(target_rows(res))["wake, one broker: p99 < 5 ms"] == "NOT met"


def test_peak_rss_is_the_largest_anywhere_in_the_result():
    assert peak_rss({"a": [fig(1, 40), {"b": fig(1, 97.5)}], "broker": fig(1, 60)}) == 97.5
    assert peak_rss({"nothing": 1}) is None


@given(p50=st.floats(0.1, 100), p99=st.floats(0.1, 1000))
def test_wake_verdict_and_ratio_follow_the_5_ms_limit(p50: float, p99: float):
    res = all_results(wake={"latency_from_push_response_ms": {"p50": p50, "p99": p99}})
    row = next(r for r in target_rows(res) if r[0] == "wake, one broker: p99 < 5 ms")
    assert row[2] == f"{p99 / 5:.2f}"
    assert row[3] == ("met" if p99 < 5 else "NOT met")
