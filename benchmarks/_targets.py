"""The targets the broker is held to, as one table: target, measured, ratio, met / NOT met.

``target_rows(results)`` takes each benchmark's result (``{name: result}``, ``None`` or absent
for one that crashed or was not run) and answers one row per target.  The ratio column is the
figure the target bounds: for a relative target the ratio itself (broker / raw, p99 / p50,
10 groups / 1 group, 10,000 partitions / 16), for an absolute limit measured / limit (so below
or at 1.00 is inside it).  A missed target never changes run.py's exit status; only
invariant failures do.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

RSS_LIMIT_MB = 100.0

Row = list[str]
Check = Callable[[dict], tuple[str, float | None, bool] | None]


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _batch(res: dict, batch: int) -> dict | None:
    return next((r for r in res.get("results", []) if r["batch"] == batch), None)


def _vs_raw(batch: int, floor: float) -> Check:
    def check(res: dict) -> tuple[str, float | None, bool] | None:
        r = _batch(res, batch)
        if r is None or r["ratio"] is None:
            return None
        return (f"{r['broker_msgs_per_s']:,.0f} msg/s, raw {r['raw_msgs_per_s']:,.0f}",
                r["ratio"], r["ratio"] >= floor)
    return check


def _push_tail(res: dict) -> tuple[str, float | None, bool] | None:
    r = _batch(res, 100)
    lat = (r or {}).get("request_ms") or {}
    if not lat.get("p50") or lat.get("p99") is None:
        return None
    x = lat["p99"] / lat["p50"]
    return f"p50 {lat['p50']:.1f} / p99 {lat['p99']:.1f} ms", x, x <= 3.0


def _p99_below(limit_ms: float, pick: Callable[[dict], dict | None]) -> Check:
    def check(res: dict) -> tuple[str, float | None, bool] | None:
        stats = pick(res) or {}
        p99 = stats.get("p99")
        if p99 is None:
            return None
        text = f"p50 {stats['p50']:.1f} / p99 {p99:.1f} ms"
        if "parked_seen" in res:  # herd: how many were parked when the pushes ran
            text += f" ({res['parked_seen']:,} parked)"
        return text, p99 / limit_ms, p99 < limit_ms
    return check


def _herd_queued(res: dict) -> tuple[str, float | None, bool] | None:
    statuses = res.get("statuses") or {}
    pushes = sum(statuses.values())
    if not pushes:
        return None
    queued = statuses.get("queued", 0)
    return (", ".join(f"{k} {v}" for k, v in sorted(statuses.items())), queued / pushes,
            queued == pushes)


def _largest(entries: list[dict], key: str) -> list[dict]:
    top = max((e[key] for e in entries), default=None)
    return [e for e in entries if e[key] == top]


def _partitions_push(batch: int) -> Check:
    def check(res: dict) -> tuple[str, float | None, bool] | None:
        rows = [r for r in res.get("push", []) if r["batch"] == batch and r["partitions"] != 16]
        r = next(iter(_largest(rows, "partitions")), None)
        if r is None or r.get("ratio_to_16") is None:
            return None
        base = next((x for x in res.get("push", []) if x["batch"] == batch
                     and x["partitions"] == 16), None)
        text = f"{r['msgs_per_s']:,.0f} msg/s at {r['partitions']:,} partitions"
        cpu = (r.get("broker") or {}).get("broker_cpu_ms_per_1000")
        cpu16 = ((base or {}).get("broker") or {}).get("broker_cpu_ms_per_1000")
        if cpu is not None and cpu16 is not None:
            text += f"; broker CPU {cpu:.0f} vs {cpu16:.0f} ms/1k at 16"
        return text, r["ratio_to_16"], r["ratio_to_16"] >= 0.8
    return check


def _served(res: dict) -> tuple[str, float | None, bool] | None:
    rows = res.get("wildcard") or []
    if not rows:
        return None
    served = sum(r["partitions_served"] for r in rows)
    pending = sum(r["partitions_pending"] for r in rows)
    text = "; ".join(
        f"{r['partitions_served']:,}/{r['partitions_pending']:,} served, last after "
        + ("-" if r["last_served_after_s"] is None else f"{r['last_served_after_s']:.1f} s")
        for r in rows)
    return text, served / pending if pending else None, served == pending


def _fanout(res: dict) -> tuple[str, float | None, bool] | None:
    rows = [r for r in res.get("results", []) if r["groups"] != 1]
    r = next(iter(_largest(rows, "groups")), None)
    one = next((x for x in res.get("results", []) if x["groups"] == 1), None)
    if r is None or one is None or r.get("cpu_per_delivery_vs_1_group") is None:
        return None
    x = r["cpu_per_delivery_vs_1_group"]
    return (f"{r['broker']['broker_cpu_ms_per_1000']:.1f} vs "
            f"{one['broker']['broker_cpu_ms_per_1000']:.1f} ms CPU/1k deliveries "
            f"({r['groups']} groups vs 1)", x, x <= 1.2)


def _vs_json(kind: str, variant: str, floor: float) -> Check:
    """client_paths: a fast path's msg/s over the JSON path's of the same run (``kind``: push,
    pop); a framed pop the broker answered with JSON is "not served", not met."""
    def check(res: dict) -> tuple[str, float | None, bool] | None:
        rows = {r["variant"]: r for r in res.get(kind, [])}
        r, base = rows.get(variant), rows.get("json")
        if r is None or base is None:
            return None
        if r.get("not_served"):  # e.g. "not served (JSON answer)"
            return r["not_served"], None, False
        if r.get("ratio_to_json") is None:
            return None
        return (f"{r['msgs_per_s']:,.0f} msg/s, JSON {base['msgs_per_s']:,.0f}",
                r["ratio_to_json"], r["ratio_to_json"] >= floor)
    return check


def _drain_autopilot(res: dict) -> tuple[str, float | None, bool] | None:
    d = res.get("drain") or {}
    x = d.get("autopilot_vs_best")
    if x is None:
        return None
    auto = d["results"][0]["elapsed_s"]
    best = next(r for r in d["results"] if r["label"] == d["best_hand_tuned"])
    return (f"{auto:.2f} s vs {best['elapsed_s']:.2f} s ({best['label']})", x, x <= 1.2)


def _ephemeral_push(res: dict) -> tuple[str, float | None, bool] | None:
    push = res.get("push") or {}
    x = push.get("ratio")
    if x is None:
        return None
    return (f"{push['ephemeral_msgs_per_s']:,.0f} msg/s, durable "
            f"{push['durable_msgs_per_s']:,.0f}", x, x >= 5.0)


TARGETS: list[tuple[str, str, Check]] = [
    ("push, 100 items per request >= 0.60 x raw", "push", _vs_raw(100, 0.60)),
    ("push, 1 item per request >= 0.65 x raw", "push", _vs_raw(1, 0.65)),
    ("pop + ack, batch 100 >= 0.60 x raw", "pop", _vs_raw(100, 0.60)),
    ("push 100: request p99 <= 3 x p50", "push", _push_tail),
    ("wake, one broker: p99 < 5 ms", "wake",
     _p99_below(5.0, lambda r: r.get("latency_from_push_response_ms"))),
    ("wake across the mesh: p99 < 10 ms", "wake_ha",
     _p99_below(10.0, lambda r: (r.get("mesh") or {}).get("latency_from_push_response_ms"))),
    ("2,000 parked long polls: push p99 < 20 ms", "herd",
     _p99_below(20.0, lambda r: r.get("push_rtt_ms"))),
    ("2,000 parked long polls: no pool timeouts (every push queued)", "herd", _herd_queued),
    ("10,000 partitions: push 1 item >= 0.8 x 16 partitions", "partitions", _partitions_push(1)),
    ("10,000 partitions: push 100 items >= 0.8 x 16 partitions", "partitions",
     _partitions_push(100)),
    ("every partition with pending messages served by wildcard pops", "partitions", _served),
    ("fan-out: broker CPU per delivery, 10 groups <= 1.2 x 1 group", "fanout", _fanout),
    ("push 100, binary QPB1 >= 1.5 x JSON msg/s", "client_paths",
     _vs_json("push", "binary", 1.5)),
    ("push 100, framed+zstd QPB1 >= 1.5 x JSON msg/s", "client_paths",
     _vs_json("push", "frames", 1.5)),
    ("pop + ack 100, framed QPF1 >= 1.3 x JSON msg/s", "client_paths",
     _vs_json("pop", "frames", 1.3)),
    ("consume() drain: autopilot time <= 1.2 x best hand-tuned", "client_paths",
     _drain_autopilot),
    ("ephemeral push, 1 message per request >= 5 x durable push", "ephemeral",
     _ephemeral_push),
]


def peak_rss(res: Any) -> float | None:
    """The largest ``broker_peak_rss_mb`` anywhere in a benchmark's result."""
    def walk(x: Any) -> Iterator[float]:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "broker_peak_rss_mb" and isinstance(v, int | float):
                    yield float(v)
                else:
                    yield from walk(v)
        elif isinstance(x, list):
            for v in x:
                yield from walk(v)
    return max(walk(res), default=None)


def target_rows(results: dict[str, dict | None]) -> list[Row]:
    rows: list[Row] = []
    for label, name, check in TARGETS:
        res = results.get(name)
        if res is None:
            rows.append([label, f"({name} not run or crashed)", "-", "not run"])
            continue
        got = check(res)
        if got is None:
            rows.append([label, f"({name}: no figure)", "-", "NOT met"])
            continue
        measured, x, met = got
        rows.append([label, measured, _ratio(x), _verdict(met)])
    for name, res in results.items():
        rss = peak_rss(res) if res is not None else None
        label = f"broker RSS <= {RSS_LIMIT_MB:.0f} MB: {name}"
        if rss is None:
            rows.append([label, "(no figure)", "-", "not run" if res is None else "NOT met"])
            continue
        rows.append([label, f"peak {rss:.0f} MB", _ratio(rss / RSS_LIMIT_MB),
                     _verdict(rss <= RSS_LIMIT_MB)])
    return rows


HEADERS = ["target", "measured", "ratio", "verdict"]
