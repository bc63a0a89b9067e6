"""The figures and the report of outage_recovery.py: what one scenario's pushes, deliveries,
``/health`` polls and stored rows add up to (``analyse``), its tables (``print_scenario``), and
a summary of each broker's log (``summarise_log``).  Imported by outage_recovery.py only.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from _loadgen import fmt_ms, percentile, table

ACKED = ("queued", "buffered")  # the answers that acknowledge a push


def summarise_log(text: str, i: int) -> dict:
    """Counts of what a broker logged at WARNING and above (digits folded, so repeated lines
    with different counts group together), and its order-exception / error / traceback lines."""
    kinds: Counter = Counter()
    notable: list[str] = []
    for line in text.splitlines():
        low = line.lower()
        if "order exception" in low or " error " in low or "traceback" in low \
                or "critical" in low or " 500" in line:
            if len(notable) < 20:
                notable.append(line[:300])
        m = re.match(r"\S+ \S+ (\w+)\s+(.*)", line)
        if m:
            kinds[(m.group(1), re.sub(r"\d+(\.\d+)?", "#", m.group(2))[:140])] += 1
    return {"broker": f"bench-{i}", "lines": len(text.splitlines()),
            "order_exception_lines": sum(1 for ln in text.splitlines()
                                         if "order exception" in ln.lower()),
            "error_lines": sum(n for (lvl, _), n in kinds.items() if lvl in ("ERROR", "CRITICAL")),
            "top": [f"{n}x {lvl} {msg}" for (lvl, msg), n in kinds.most_common(8)],
            "notable": notable}



def lat_summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
            "max_ms": max(values) if values else None}


def order_breaks(seq: list[str], index: dict[str, int]) -> int:
    return sum(1 for a, b in zip(seq, seq[1:]) if index[b] < index[a])


def analyse(kind, down_s, args, queue, pushes, recv, recv_order, failed_ack, cstats,
            first_errors, health, final, marks, rows, leftovers, drained, load_start,
            load_end) -> dict:
    P = args.producers
    t_out, t_ret = marks["outage"], marks["return"]
    rec: dict[str, tuple] = {}  # tx -> (k, n, t_send, t_answer, status, broker)
    for k in range(P):
        for n, (ts, ta, st, b) in enumerate(pushes[k]):
            rec[f"k{k}-{n}"] = (k, n, ts, ta, st, b)
    acked = {tx for tx, r in rec.items() if r[4] in ACKED}

    def period(ts: float) -> str:
        return "before" if ts < t_out else "outage" if ts < t_ret else "after"
    periods = ("before", "outage", "after")
    bounds = {"before": (marks["start"], t_out), "outage": (t_out, t_ret),
              "after": (t_ret, marks["stop"])}
    by_period: dict[str, Counter] = {p: Counter() for p in periods}
    req_ms: dict[str, list[float]] = {p: [] for p in periods}
    for _, _, ts, ta, st, _ in rec.values():
        by_period[period(ts)][st] += 1
        req_ms[period(ts)].append((ta - ts) * 1000)
    statuses = sorted({st for c in by_period.values() for st in c},
                      key=lambda s: (s not in ACKED, ACKED.index(s) if s in ACKED else 0, s))
    sends = [r[2] for r in rec.values()]
    load_s = (max(sends) - min(sends)) if sends else 0.0
    rates = {p: sum(by_period[p].values()) / max(1e-9, bounds[p][1] - bounds[p][0])
             for p in periods}

    # -- back to queued: the send time of the earliest push (sent after the return) after
    # which no push answered buffered (and, stricter, after which every answer was queued)
    after = sorted((r[2], r[4]) for r in rec.values() if r[2] >= t_ret)

    def back_after(bad) -> float | None:
        last_bad = max((r[2] for r in rec.values() if bad(r[4])), default=None)
        cands = [ts for ts, _ in after if last_bad is None or ts > last_bad]
        return (cands[0] - t_ret) if cands else None
    back_no_buffered = back_after(lambda s: s == "buffered")
    back_all_queued = back_after(lambda s: s != "queued")
    buffered_after = sum(1 for _, st in after if st == "buffered")

    # -- the drain, from GET /health polls
    samples = [(t, s) for t, s in health if t >= t_out]

    def staged(s):  # stagedEvents is the staging table's count: the same on every broker
        vals = [x[1] for x in s if x is not None and x[1] is not None]
        return max(vals) if vals else None

    def merged_sum(s):
        return sum(x[3] or 0 for x in s if x is not None)
    staged_peak, t_staged_peak = 0, None
    for t, s in samples:
        v = staged(s)
        if v is not None and v > staged_peak:
            staged_peak, t_staged_peak = v, t
    pending_peak = max((sum(x[0] or 0 for x in s if x is not None) for _, s in samples),
                       default=0)
    rate_peak = max((sum(x[2] or 0 for x in s if x is not None) for _, s in samples), default=0)
    t_empty = next((t for t, s in samples if t >= t_ret and all(
        x is not None and x[0] == 0 and x[1] == 0 for x in s)), None)
    # mergedEvents summed over brokers: last full poll before the outage, first at empty
    full = [(t, s) for t, s in health if all(x is not None for x in s)]
    m0 = next((merged_sum(s) for t, s in reversed(full) if t < t_out), 0)
    m1 = next((merged_sum(s) for t, s in full if t_empty is not None and t >= t_empty),
              merged_sum(full[-1][1]) if full else 0)
    empty_s = (t_empty - t_ret) if t_empty is not None else None
    # merging, from mergedEvents summed over the brokers: from the last poll before the first
    # merged event to the empty poll, and the peak over ~1 s between polls
    series = [(t, merged_sum(s)) for t, s in full if t >= t_ret and
              (t_empty is None or t <= t_empty)]
    t_merge0 = next((series[i - 1][0] for i in range(1, len(series))
                     if series[i][1] > series[0][1]), None)
    peak_1s, j = 0.0, 0
    for t, m in series:
        while j + 1 < len(series) and series[j + 1][0] <= t - 1.0:
            j += 1
        if t - series[j][0] >= 1.0:
            peak_1s = max(peak_1s, (m - series[j][1]) / (t - series[j][0]))
    drain = {
        "staged_peak": staged_peak,
        "staged_peak_at_s_after_return": (t_staged_peak - t_ret) if t_staged_peak else None,
        "spool_pending_peak_sum": pending_peak,
        "merge_rate_peak_sum_per_s": rate_peak,
        "empty_s_after_return": empty_s,
        "empty_s_after_staged_peak": (t_empty - t_staged_peak)
        if t_empty is not None and t_staged_peak else None,
        "merged_events": m1 - m0,
        "merged_per_s_return_to_empty": (m1 - m0) / empty_s if empty_s else None,
        "first_merge_s_after_return": (t_merge0 - t_ret) if t_merge0 is not None else None,
        "merged_per_s_first_merge_to_empty": (m1 - m0) / (t_empty - t_merge0)
        if t_empty is not None and t_merge0 is not None and t_empty > t_merge0 else None,
        "merged_per_s_peak_1s": peak_1s,
        "staged_peak_per_s_to_empty": staged_peak / (t_empty - t_staged_peak)
        if t_empty is not None and t_staged_peak and t_empty > t_staged_peak else None,
    }

    # -- delivery latency: first receive time - answer time
    groups = {"before the outage": lambda ts: ts < t_out,
              "during the outage": lambda ts: t_out <= ts < t_ret,
              "first 10 s after the return": lambda ts: t_ret <= ts < t_ret + 10,
              "later": lambda ts: ts >= t_ret + 10}
    latency = {}
    for name, sel in groups.items():
        latency[name] = lat_summary([(recv[tx][0] - rec[tx][3]) * 1000 for tx in acked
                                     if sel(rec[tx][2]) and tx in recv])

    # -- lost, duplicated, order
    stored_count: Counter = Counter(r["transaction_id"] for r in rows)
    stored_order: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        stored_order[r["partition"]].append(r["transaction_id"])
    lost = sorted(acked - recv.keys() - stored_count.keys())
    undelivered = sorted((acked & stored_count.keys()) - recv.keys())
    received_not_stored = sorted((acked & recv.keys()) - stored_count.keys())
    dup_stored = sorted(tx for tx, c in stored_count.items() if c > 1)
    dup_recv = sorted(tx for tx, ts in recv.items() if len(ts) > 1)
    dup_recv_after_failed_ack = [tx for tx in dup_recv if tx in failed_ack]
    dup_recv_unexplained = [tx for tx in dup_recv if tx not in failed_ack]
    unexpected = sorted((stored_count.keys() | recv.keys()) - rec.keys())
    unacked_stored = sum(1 for tx in stored_count if tx in rec and tx not in acked)
    index = {tx: r[1] for tx, r in rec.items()}
    viol_stored = viol_recv = 0
    viol_parts: set[str] = set()
    examples: list[str] = []

    def describe(tx: str) -> str:
        k, n, ts, ta, st, b = rec[tx]
        return f"{tx} ({st} via bench-{b}, sent {ts - t_ret:+.2f} s from the return)"
    for part in sorted(set(stored_order) | set(recv_order)):
        s = [tx for tx in stored_order.get(part, []) if tx in acked]
        seen, first = set(), []
        for tx in recv_order.get(part, []):
            if tx in acked and tx not in seen:
                seen.add(tx)
                first.append(tx)
        for name, seq in (("stored", s), ("received", first)):
            nb = order_breaks(seq, index)
            if nb:
                viol_parts.add(part)
                for a, b in zip(seq, seq[1:]):
                    if index[b] < index[a] and len(examples) < 6:
                        examples.append(f"{name} {part}: {describe(a)} before {describe(b)}")
            if name == "stored":
                viol_stored += nb
            else:
                viol_recv += nb
    exc = [x[4] if x is not None else None for x in final]
    order_exceptions = None if any(e is None for e in exc) else sum(exc)

    failures = []
    if lost:
        failures.append(f"{len(lost)} acknowledged pushes lost (e.g. {lost[:5]})")
    if undelivered:
        failures.append(f"{len(undelivered)} acknowledged pushes stored but never delivered "
                        f"to the group (e.g. {undelivered[:5]})")
    if dup_stored or dup_recv_unexplained:
        failures.append(f"{len(dup_stored)} stored twice, {len(dup_recv_unexplained)} received "
                        f"twice (e.g. {(dup_stored + dup_recv_unexplained)[:5]})")
    if viol_stored or viol_recv:
        failures.append(f"order violations: {viol_stored} stored, {viol_recv} received, in "
                        f"{len(viol_parts)} partitions")
    if unexpected:
        failures.append(f"{len(unexpected)} ids nobody pushed (e.g. {unexpected[:5]})")
    if not drained:
        failures.append("not drained within the cap")
    return {
        "scenario": kind if kind == "failover" else f"stop{down_s:g}", "queue": queue,
        "producers": P, "consumers": args.consumers, "target_rate": args.rate,
        "phases_s": {"before": t_out - marks["start"], "outage": t_ret - t_out,
                     "pg_stop_call": marks["pg_stopped"] - t_out,
                     "return_call": t_ret - marks["return_call"],
                     "after": marks["stop"] - t_ret,
                     "producers_stop": marks["producers_stopped"] - marks["stop"],
                     "drain_wait": marks["drained"] - marks["producers_stopped"]},
        "pushes": len(rec), "acknowledged": len(acked),
        "achieved_rate": len(rec) / load_s if load_s else None,
        "rate_by_period": rates,
        "answers": {p: dict(by_period[p]) for p in periods}, "statuses": statuses,
        "request_ms": {p: {"p50": percentile(v, 50), "p99": percentile(v, 99),
                           "max": max(v) if v else None} for p, v in req_ms.items()},
        "back_to_queued_s": back_no_buffered, "back_to_all_queued_s": back_all_queued,
        "buffered_after_return": buffered_after,
        "drain": drain, "delivery_latency": latency,
        "lost": len(lost), "undelivered": len(undelivered),
        "received_not_stored": len(received_not_stored),
        "duplicated_stored": len(dup_stored), "duplicated_received": len(dup_recv),
        "duplicated_received_after_failed_ack": len(dup_recv_after_failed_ack),
        "unexpected": len(unexpected), "unacknowledged_stored": unacked_stored,
        "order_violations_stored": viol_stored, "order_violations_received": viol_recv,
        "order_violation_partitions": sorted(viol_parts), "order_examples": examples,
        "order_exceptions": order_exceptions, "order_exceptions_per_broker": exc,
        "leftovers": leftovers, "drained": drained, "consumer_counters": dict(cstats),
        "first_errors": first_errors, "load_avg_start": load_start, "load_avg_end": load_end,
        "lost_ids": lost[:50], "duplicated_ids": (dup_stored + dup_recv)[:50],
        "health_timeline": [
            [round(t - t_ret, 2), [None if x is None else list(x[:4]) for x in s]]
            for t, s in health[::max(1, round(0.5 / args.health_interval_s))]],
        "failures": failures,
    }


def group_figures(layout, pushes, recv_by, order_by, pops_by, failed_ack, rows, marks
                  ) -> list[dict]:
    """Per consumer group (``layout``: (group, consumers, batch)): deliveries per second and
    messages per pop by period; per-partition starvation; delivery latency of pushes sent in
    the 10 s after the return; lost, duplicated and out-of-order deliveries."""
    t_out, t_ret, t_stop = marks["outage"], marks["return"], marks["stop"]
    t_end = marks.get("drained", t_stop)
    periods = {"before": (marks["start"], t_out), "outage": (t_out, t_ret),
               "after, first 10 s": (t_ret, min(t_ret + 10, t_stop)),
               "after, 10 s on": (min(t_ret + 10, t_stop), t_stop),
               "drain (producers stopped)": (t_stop, t_end)}
    rec: dict[str, tuple] = {}  # tx -> (partition, n, t_send, t_answer, status)
    queued_by_part: dict[str, list[tuple[str, float]]] = defaultdict(list)  # push order
    for k, ps in enumerate(pushes):
        for n, (ts, ta, st, _b) in enumerate(ps):
            rec[f"k{k}-{n}"] = (f"k{k}", n, ts, ta, st)
            if st == "queued":  # stored when answered: claimable from then on
                queued_by_part[f"k{k}"].append((f"k{k}-{n}", ta))
    acked = {tx for tx, r in rec.items() if r[4] in ACKED}
    stored = {r["transaction_id"] for r in rows}
    index = {tx: r[1] for tx, r in rec.items()}
    out = []
    for group, consumers, batch in layout:
        recv, pops = recv_by[group], sorted(pops_by[group])
        by_period = {}
        for name, (a, b) in periods.items():
            inside = [m for t, _, m in pops if a <= t < b]
            by_period[name] = {
                "seconds": b - a, "pops": len(inside), "deliveries": sum(inside),
                "deliveries_per_s": sum(inside) / (b - a) if b > a else None,
                "messages_per_pop": sum(inside) / len(inside) if inside else None}
        # starvation: for each partition, the claims (pop times) of the group; between two
        # claims (or from the start / until the end), the partition waited with a backlog
        # from when its oldest queued push not delivered before the later claim was
        # answered (a partition's pushes are answered and delivered in push order)
        claims: dict[str, list[float]] = defaultdict(list)
        for t, part, _ in pops:
            claims[part].append(t)
        worst = {"all": (0.0, None, None), "from the return": (0.0, None, None)}
        for part, queued in queued_by_part.items():
            times = [*claims.get(part, []), t_end]
            first = [min(recv[tx]) if tx in recv else float("inf") for tx, _ in queued]
            i, prev = 0, marks["start"]
            for c in times:
                while i < len(queued) and first[i] < c:
                    i += 1  # delivered by an earlier claim
                if i < len(queued) and queued[i][1] < c:
                    since = max(prev, queued[i][1])
                    for key, floor in (("all", since), ("from the return", max(since, t_ret))):
                        if c - floor > worst[key][0]:
                            worst[key] = (c - floor, part, floor - t_ret)
                prev = c
        after = [tx for tx in acked if t_ret <= rec[tx][2] < t_ret + 10]
        lat = lat_summary([(min(recv[tx]) - rec[tx][3]) * 1000 for tx in after if tx in recv])
        lost = sorted(acked - recv.keys() - stored)
        undelivered = sorted((acked & stored) - recv.keys())
        dup = [tx for tx, ts in recv.items() if len(ts) > 1 and tx not in failed_ack]
        viol = 0
        for seq in order_by[group].values():
            seen: set[str] = set()
            first_seen = [tx for tx in seq if tx in acked and not (tx in seen or seen.add(tx))]
            viol += order_breaks(first_seen, index)
        failures = []
        if lost or undelivered:
            failures.append(f"{len(lost)} lost, {len(undelivered)} stored but not delivered")
        if dup:
            failures.append(f"{len(dup)} received twice (e.g. {dup[:5]})")
        if viol:
            failures.append(f"{viol} received out of order")
        out.append({
            "group": group, "consumers": consumers, "batch": batch, "periods": by_period,
            "starvation_s": {k: {"seconds": v[0], "partition": v[1],
                                 "since_s_after_return": v[2]} for k, v in worst.items()},
            "latency_first_10s_after_return": lat,
            "lost": len(lost), "undelivered": len(undelivered), "duplicated": len(dup),
            "order_violations": viol, "failures": failures})
    return out


def print_groups(groups: list[dict], name: str) -> None:
    periods = list(groups[0]["periods"]) if groups else []
    heads = [f"{name}: deliveries/s (messages per pop)"] + [
        f"{p} ({groups[0]['periods'][p]['seconds']:.1f} s)" for p in periods]
    def cell(f: dict) -> str:
        per_pop = "-" if f["messages_per_pop"] is None else f"{f['messages_per_pop']:.1f}"
        return f"{fmt_n(f['deliveries_per_s'])} ({per_pop})"
    rows = [[f"{g['group']} ({g['consumers']} x batch {g['batch']})"]
            + [cell(g["periods"][p]) for p in periods] for g in groups]
    print(table(heads, rows))
    rows = []
    for g in groups:
        st, lat = g["starvation_s"], g["latency_first_10s_after_return"]
        rows.append([g["group"],
                     " ".join((fmt_s(st["all"]["seconds"]), f"({st['all']['partition']})")),
                     " ".join((fmt_s(st["from the return"]["seconds"]),
                               f"({st['from the return']['partition']}, from "
                               f"{fmt_s(st['from the return']['since_s_after_return'])} s)")),
                     lat["n"], fmt_ms(lat["p50_ms"]), fmt_ms(lat["p99_ms"]), fmt_ms(lat["max_ms"]),
                     f"{g['lost']}/{g['duplicated']}/{g['order_violations']}"])
    print(table([f"{name}: group", "longest unclaimed with a backlog s (partition)",
                 "the same from the return", "pushes in 10 s after return", "p50 ms",
                 "p99 ms", "max ms", "lost/dup/order"], rows))


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def fmt_n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def print_scenario(r: dict) -> None:
    name, ph = r["scenario"], r["phases_s"]
    periods = ("before", "outage", "after")
    heads = [f"{name}: pushes answered"] + [f"{p} ({ph[p]:.1f} s)" for p in periods] + ["total"]
    rows = [[st] + [r["answers"][p].get(st, 0) for p in periods]
            + [sum(r["answers"][p].get(st, 0) for p in periods)] for st in r["statuses"]]
    rows.append(["msg/s answered"] + [fmt_n(r["rate_by_period"][p]) for p in periods]
                + [fmt_n(r["achieved_rate"])])
    rows.append(["request ms p50 / p99 / max"] + [
        " / ".join(fmt_ms(r["request_ms"][p][q]) for q in ("p50", "p99", "max"))
        for p in periods] + [""])
    print(table(heads, rows))
    d = r["drain"]
    out = [
        ["target / achieved msg/s", f"{r['target_rate']:,} / {fmt_n(r['achieved_rate'])}"],
        ["PostgreSQL back after (stop call to return) s; return call took s",
         f"{ph['outage']:.2f}; {ph['return_call']:.2f}"],
        ["back to queued: s from the return until no push answers buffered",
         fmt_s(r["back_to_queued_s"]) if r["back_to_queued_s"] is not None
         else "never (still buffered at the end)"],
        ["  until every answer is queued (no other status either)",
         fmt_s(r["back_to_all_queued_s"]) if r["back_to_all_queued_s"] is not None else "never"],
        ["  pushes answered buffered after the return", r["buffered_after_return"]],
        ["spool pendingCount peak (sum) / staged events peak (at s after return)",
         f"{d['spool_pending_peak_sum']:,} / {d['staged_peak']:,} "
         f"({fmt_s(d['staged_peak_at_s_after_return'])})"],
        ["peak merge rate, summed over brokers (ev/s, 10 s window)",
         fmt_n(d["merge_rate_peak_sum_per_s"])],
        ["spools + staging empty: s after the return / after the staged peak",
         f"{fmt_s(d['empty_s_after_return'])} / {fmt_s(d['empty_s_after_staged_peak'])}"],
        ["events merged (mergedEvents, sum); merging began at s after the return",
         f"{d['merged_events']:,}; {fmt_s(d['first_merge_s_after_return'])}"],
        ["merged/s: first merge->empty / return->empty / peak over 1 s",
         f"{fmt_n(d['merged_per_s_first_merge_to_empty'])} / "
         f"{fmt_n(d['merged_per_s_return_to_empty'])} / {fmt_n(d['merged_per_s_peak_1s'])}"],
        ["staged peak / (empty - peak time), ev/s", fmt_n(d["staged_peak_per_s_to_empty"])],
        ["acknowledged / lost / stored not delivered", f"{r['acknowledged']:,} / {r['lost']} / "
                                                         f"{r['undelivered']}"],
        ["duplicated: stored twice / received twice (after a failed ack)",
         f"{r['duplicated_stored']} / {r['duplicated_received']} "
         f"({r['duplicated_received_after_failed_ack']})"],
        ["order violations: stored / received (partitions)",
         f"{r['order_violations_stored']} / {r['order_violations_received']} "
         f"({len(r['order_violation_partitions'])})"],
        ["spool.orderExceptions (sum over brokers)",
         "n/a" if r["order_exceptions"] is None else r["order_exceptions"]],
        ["not acknowledged but stored; ids nobody pushed",
         f"{r['unacknowledged_stored']}; {r['unexpected']}"],
        ["queen.staged / queen.spool_backlog rows afterwards",
         f"{r['leftovers']['staged']} / {r['leftovers']['spool_backlog']}"],
        ["drained (s after producers stopped)",
         f"{'yes' if r['drained'] else 'NO'} ({ph['drain_wait']:.1f})"],
        ["load average 1 min at start / end",
         f"{r['load_avg_start'][0]:.2f} / {r['load_avg_end'][0]:.2f}"],
    ]
    print(table([f"{name}: recovery", "value"], out))
    if r.get("groups"):
        print_groups(r["groups"], name)
    lat = [[g, v["n"], fmt_ms(v["p50_ms"]), fmt_ms(v["p99_ms"]), fmt_ms(v["max_ms"])]
           for g, v in r["delivery_latency"].items()]
    print(table([f"{name}: delivery latency (receive - answer), pushes sent",
                 "n", "p50 ms", "p99 ms", "max ms"], lat))
    if r["consumer_counters"]:
        print("  consumers: " + ", ".join(f"{k} {v}" for k, v in
                                          sorted(r["consumer_counters"].items())))
    print("  marks: " + ", ".join(f"{k} {v}" for k, v in r["marks_wall"].items()))
    for ls in r["leases_held_at_end"]:
        print(f"  lease held at the end: {ls['partition']} cursor {ls['cursor_seq']} lease "
              f"{ls['lease_id']} acquired {ls['lease_acquired_at']} expires "
              f"{ls['lease_expires_at']} (db now {ls['db_now']}), handed to a consumer: "
              f"{ls['lease_seen_by_a_consumer']}")
    for e in r["order_examples"]:
        print(f"  out of order: {e}")
    for k, v in r["first_errors"].items():
        print(f"  first {k}: {v}")
    for lg in r.get("broker_logs", []):
        print(f"  {lg['broker']} log: {lg['lines']} lines, {lg['error_lines']} ERROR, "
              f"{lg['order_exception_lines']} order exception lines")
        for line in lg["top"][:5]:
            print(f"      {line}")
    for f in r["failures"]:
        print(f"  FAILED: {f}")
