"""``outage_ha``: per-partition order across three brokers' spools through two PostgreSQL stops.

One embedded PostgreSQL (skipped when PG_HOST is set) and ``--outage-ha-brokers`` brokers
without the mesh, each with its own spool.  Registered in run.py
(``python3 dev.py bench outage_ha``).

``--outage-ha-producers`` sequential producers, producer *i* owning partition ``k<i>`` and
sending its *n*-th message to broker *(i+n) % brokers*; PostgreSQL up and down along
``--outage-ha-timeline``; then the spools drain (``/health`` ``spool.pendingCount`` 0 on every
broker and ``spool.staging.stagedEvents`` 0, at most ``--outage-drain-max-s``), the queue is read
from PostgreSQL in ``seq`` order and consumed by ``--outage-ha-groups`` consumer groups over HTTP.  Invariant: every acknowledged
id stored exactly once, nothing nobody pushed, and 0 order violations, in the table and in
every group's deliveries.  Uses bench_outage.py's ``push_statuses`` and its
``--outage-db-timeout-ms``, ``--outage-request-timeout`` and ``--outage-drain-max-s``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
import uuid

import asyncpg
import httpx

from _harness import (
    STORED_IN_SEQ_ORDER,
    BrokerMeter,
    RawHTTPClient,
    fmt_broker,
    start_brokers,
    start_database,
)
from _loadgen import JSON_HEADERS, PAD, fmt_ms, log, percentile, table
from bench_outage import OUTAGE_ACKED, OUTAGE_STATUSES, push_statuses

NAME = "outage_ha"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--outage-ha-timeline", default=[5.0, 8.0, 5.0, 5.0, 5.0],
                    type=lambda v: [float(x) for x in v.split(",")], metavar="S,S,...",
                    help="outage_ha: seconds PostgreSQL is up, down, up, down, up, ...")
    ap.add_argument("--outage-ha-brokers", type=int, default=3, help="outage_ha: brokers")
    ap.add_argument("--outage-ha-producers", type=int, default=16,
                    help="outage_ha: sequential producers, one partition each")
    ap.add_argument("--outage-ha-groups", type=int, default=2,
                    help="outage_ha: consumer groups reading everything afterwards (0: none)")


def ha_period_names(timeline: list[float]) -> list[str]:
    """before, down 1, after 1, down 2, after 2, ... for a normal/down/normal/... timeline."""
    names = ["before"]
    for i in range(1, len(timeline), 2):
        names += [f"down {i // 2 + 1}", f"after {i // 2 + 1}"]
    return names


async def spool_pending_all(client: httpx.AsyncClient, urls: list[str]) -> list[dict | None]:
    """Each broker's ``spool`` section of ``GET /health`` (None when it did not answer); the
    body comes with 503 while PostgreSQL is down, and is read all the same."""
    async def one(url: str) -> dict | None:
        try:
            spool = (await client.get(url + "/health")).json().get("spool")
            return spool if isinstance(spool, dict) else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
    return list(await asyncio.gather(*(one(u) for u in urls)))


def order_breaks(stored: list[str], index: dict[str, int]) -> list[tuple[str, str]]:
    """Adjacent pairs of ``stored`` whose send indexes go backwards."""
    return [(a, b) for a, b in zip(stored, stored[1:]) if index[b] < index[a]]


async def consume_group(url: str, queue: str, partition: str, group: str,
                        deadline: float) -> tuple[list[str], int]:
    """Every transactionId one consumer group gets from one partition over HTTP (pop batch 500,
    then ack the batch), in delivery order; and the number of failed answers.  A pop answered
    503 (the broker's "database unavailable, retry later": with DB_CONNECTION_TIMEOUT=500 a
    pool acquire under load can time out after PostgreSQL is back) is retried after 0.5 s, as
    a client honouring Retry-After would, until the deadline, and so is an ack answered 503;
    any other non-200 answer stops the partition."""
    seen: list[str] = []
    errors = 0
    async with RawHTTPClient(url, 1) as client:
        while time.perf_counter() < deadline:
            r = await client.get(f"/api/v1/pop/queue/{queue}/partition/{partition}"
                                 f"?consumerGroup={group}&batch=500&wait=false")
            if r.status_code == 503:
                log(f"consume {group} {partition}: pop HTTP 503 ({r.text[:120]}), retrying")
                await asyncio.sleep(0.5)
                continue
            if r.status_code not in (200, 204):
                errors += 1
                log(f"consume {group} {partition}: pop HTTP {r.status_code}: {r.text[:200]}")
                break
            messages = (r.json().get("messages") or []) if r.content else []
            if not messages:
                break
            seen += [m["transactionId"] for m in messages]
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"} for m in messages]
            body = json.dumps({"acknowledgments": acks, "consumerGroup": group})
            a = await client.post("/api/v1/ack/batch", headers=JSON_HEADERS, content=body)
            while a.status_code == 503 and time.perf_counter() < deadline:
                await asyncio.sleep(0.5)  # the same ack again (the lease is still ours)
                a = await client.post("/api/v1/ack/batch", headers=JSON_HEADERS, content=body)
            if a.status_code != 200:
                errors += 1
                log(f"consume {group} {partition}: ack HTTP {a.status_code}: {a.text[:200]}")
                break
    return seen, errors


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    """Three brokers (no mesh) on one PostgreSQL, sequential producers spreading each
    partition's pushes round-robin over them, PostgreSQL crash-stopped twice: afterwards every
    acknowledged id is in PostgreSQL once and each partition is stored in send order."""
    db = start_database()
    if not db.can_restart:
        db.stop()
        log("outage_ha: skipped, it stops PostgreSQL and needs the embedded one (PG_HOST is set)")
        return {"skipped": "needs the embedded PostgreSQL (PG_HOST is set)"}
    timeline = args.outage_ha_timeline
    periods = ha_period_names(timeline)
    nb, producers = args.outage_ha_brokers, args.outage_ha_producers
    queue = f"bench-outage-ha-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:8]
    index: dict[str, int] = {}       # transactionId -> its producer's send index
    status: dict[str, str] = {}      # transactionId -> what the broker answered
    period: dict[str, str] = {}      # transactionId -> period it was sent in
    via: dict[str, int] = {}         # transactionId -> broker it was sent to
    req_ms: dict[str, list[float]] = {p: [] for p in periods}
    first_error: dict[str, str] = {}
    starts: list[float] = []         # perf_counter of each phase start (len(timeline) + 1)
    # (round start, pendingCount per broker, replayedEvents per broker) from GET /health
    samples: list[tuple[float, list[int | None], list[int | None]]] = []
    staged: list[int | None] = []  # stagedEvents, one per sample
    stop, stop_monitor = asyncio.Event(), asyncio.Event()

    def now_period(t: float) -> str:
        i = 0
        while i + 1 < len(starts) and t >= starts[i + 1]:
            i += 1
        return periods[min(i, len(periods) - 1)]

    t = time.perf_counter()
    # No mesh: the brokers are told how long the database settles after its restart.
    brokers = start_brokers(db, nb, mesh=False,
                            DB_CONNECTION_TIMEOUT=str(args.outage_db_timeout_ms),
                            FILE_BUFFER_SETTLE_MS=str(args.outage_db_timeout_ms + 300))
    urls = [b.url for b in brokers]
    log(f"{db.kind} PostgreSQL on {db.host}:{db.port}, {nb} brokers (no mesh, "
        f"DB_CONNECTION_TIMEOUT={args.outage_db_timeout_ms}) on {', '.join(urls)} "
        f"(started in {time.perf_counter() - t:.1f}s)")
    meter = BrokerMeter(brokers)
    try:
        async def producer(k: int) -> None:
            clients = [RawHTTPClient(u, 1) for u in urls]
            try:
                n = 0
                while not stop.is_set():
                    tx = f"{tag}-k{k}-{n:06d}"
                    b = (k + n) % nb
                    body = json.dumps({"items": [
                        {"queue": queue, "partition": f"k{k}", "transactionId": tx,
                         "payload": {"k": k, "n": n, "pad": PAD}}]})
                    t_send = time.perf_counter()
                    per = now_period(t_send)
                    got = await push_statuses(clients[b], body, 1, args.outage_request_timeout,
                                              first_error)
                    req_ms[per].append((time.perf_counter() - t_send) * 1000)
                    index[tx], status[tx], period[tx], via[tx] = n, got[0], per, b
                    n += 1
            finally:
                for c in clients:
                    await c.aclose()

        async def monitor() -> None:
            async with httpx.AsyncClient(timeout=5) as client:
                while not stop_monitor.is_set():
                    t0 = time.perf_counter()
                    spools = await spool_pending_all(client, urls)
                    samples.append((t0, [s.get("pendingCount") if s else None for s in spools],
                                    [s.get("replayedEvents") if s else None for s in spools]))
                    # uploaded spool files wait in queen.staged until merged: the same
                    # count on every broker, so any one that answered tells it
                    staged.append(next(((s.get("staging") or {}).get("stagedEvents")
                                        for s in spools if s), None))
                    await asyncio.sleep(0.1)

        starts.append(time.perf_counter())
        tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
        mon = asyncio.create_task(monitor())
        for i, seconds in enumerate(timeline):
            if i:
                starts.append(time.perf_counter())
                if i % 2:
                    log(f"stopping PostgreSQL (immediate) for {seconds:g} s "
                        f"({len(status)} pushes answered so far)")
                    await db.stop_server()
                else:
                    log("starting PostgreSQL again")
                    await db.start_server()
            await asyncio.sleep(max(0.0, starts[-1] + seconds - time.perf_counter()))
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=args.outage_request_timeout + 5)
        for x in pending:
            x.cancel()
        if pending:
            failures.append(f"outage_ha: {len(pending)} producers did not stop")
        t_stopped = time.perf_counter()
        log(f"producers stopped ({len(status)} pushes); waiting for the {nb} spools to drain")
        drained = False
        deadline = t_stopped + args.outage_drain_max_s
        while time.perf_counter() < deadline:
            if (samples and samples[-1][0] >= t_stopped and samples[-1][1] == [0] * nb
                    and staged and staged[-1] == 0):
                drained = True
                break
            await asyncio.sleep(0.05)
        t_drained = time.perf_counter()
        stop_monitor.set()
        await asyncio.wait([mon], timeout=10)
        async with httpx.AsyncClient(timeout=5) as client:
            final = await spool_pending_all(client, urls)
        if not drained:
            failures.append(f"outage_ha: spools not drained within {args.outage_drain_max_s:g} s "
                            f"(pendingCount {samples[-1][1] if samples else '?'}, "
                            f"staged {staged[-1] if staged else '?'})")

        conn = await asyncpg.connect(db.dsn, timeout=10)
        try:
            rows = await conn.fetch(STORED_IN_SEQ_ORDER, queue)
            backlog_rows = None
            if await conn.fetchval("SELECT to_regclass('queen.spool_backlog') IS NOT NULL"):
                backlog_rows = await conn.fetchval("SELECT count(*) FROM queen.spool_backlog")
        finally:
            await conn.close()

        consumed: dict[str, dict] = {}
        if args.outage_ha_groups and drained:
            t_c = time.perf_counter()
            cdeadline = t_c + 30  # (a group cut short reports its missing ids)
            for g in range(args.outage_ha_groups):
                group = f"g{g + 1}"
                got = await asyncio.gather(*(
                    consume_group(urls[(g + k) % nb], queue, f"k{k}", group, cdeadline)
                    for k in range(producers)))
                consumed[group] = {"seen": {k: s for k, (s, _) in enumerate(got)},
                                   "errors": sum(e for _, e in got)}
            log(f"consumed with {args.outage_ha_groups} groups in "
                f"{time.perf_counter() - t_c:.1f}s")
    finally:
        meter.stop()
        for b in brokers:
            b.stop()
        db.stop()

    # -- what PostgreSQL holds, against what each producer was told --------------------------
    stored: dict[int, list[str]] = {k: [] for k in range(producers)}
    count: dict[str, int] = {}
    wrong_partition = []
    for r in rows:
        tx = r["transaction_id"]
        count[tx] = count.get(tx, 0) + 1
        k = int(r["partition"][1:]) if r["partition"][1:].isdigit() else -1
        if tx not in index or k not in stored or not tx.startswith(f"{tag}-k{k}-"):
            if tx in index:
                wrong_partition.append(tx)
            continue
        stored[k].append(tx)
    acked = {tx for tx, st in status.items() if st in OUTAGE_ACKED}
    unacked = set(status) - acked
    missing = sorted(acked - count.keys())
    duplicated = sorted(tx for tx, n in count.items() if n > 1)
    unexpected = sorted(count.keys() - status.keys())
    unacked_present = sorted(unacked & count.keys())
    # missing ids that are each partition's last acknowledged ones (a replay not finished yet),
    # as opposed to holes (lost)
    missing_set, tail = set(missing), 0
    for k in range(producers):
        mine = sorted((tx for tx in acked if tx.startswith(f"{tag}-k{k}-")), key=index.get)
        while mine and mine[-1] in missing_set:
            mine.pop()
            tail += 1
    breaks: dict[int, list[tuple[str, str]]] = {}       # acknowledged ids only
    breaks_all: dict[int, list[tuple[str, str]]] = {}   # every stored id
    for k in range(producers):
        b = order_breaks([tx for tx in stored[k] if tx in acked], index)
        if b:
            breaks[k] = b
        b = order_breaks(stored[k], index)
        if b:
            breaks_all[k] = b
    violations = sum(len(v) for v in breaks.values())
    violations_all = sum(len(v) for v in breaks_all.values())

    def describe(pair: tuple[str, str]) -> str:
        return " before ".join(f"{tx} ({status[tx]} via broker {via[tx]}, {period[tx]})"
                               for tx in pair)

    examples = [describe(p) for k in sorted(breaks) for p in breaks[k][:3]][:20]

    # -- consumer groups ----------------------------------------------------------------------
    group_res: dict[str, dict] = {}
    for group, c in consumed.items():
        deliveries = sum(len(s) for s in c["seen"].values())
        seen_ids = [tx for s in c["seen"].values() for tx in s]
        dup = len(seen_ids) - len(set(seen_ids))
        g_missing = len(acked - set(seen_ids))
        g_breaks = sum(len(order_breaks([tx for tx in s if tx in index], index))
                       for s in c["seen"].values())
        group_res[group] = {"deliveries": deliveries, "missing_acked": g_missing,
                            "duplicate_deliveries": dup, "order_violations": g_breaks,
                            "errors": c["errors"]}
        if g_missing or dup or g_breaks or c["errors"]:
            failures.append(f"outage_ha: group {group} missed {g_missing} acknowledged ids, got "
                            f"{dup} twice, {g_breaks} out of send order, {c['errors']} errors")

    # -- drain times: first poll round after each PostgreSQL start with every spool empty -----
    drains: list[float | None] = []
    for i in range(2, len(starts), 2):
        until = starts[i + 1] if i + 1 < len(starts) else math.inf
        hit = next((ts for ts, pend, _ in samples
                    if starts[i] <= ts < until and pend == [0] * nb), None)
        drains.append(None if hit is None else hit - starts[i])
    # every ~0.5 s: (seconds since the start, pendingCount per broker), for the JSON
    # and replayedEvents summed (pendingCount only drops when a whole spool file is replayed;
    # replayedEvents counts every committed chunk, so it shows the replay rate)
    timeline_pts, last_t = [], -math.inf
    for ts, pend, rep in samples:
        if ts - last_t >= 0.5:
            timeline_pts.append([round(ts - starts[0], 2), pend, sum(x or 0 for x in rep)])
            last_t = ts
    peaks = [max((p[j] for _, p, _ in samples if p[j] is not None), default=0)
             for j in range(nb)]

    def replayed_at(t: float) -> int:
        """replayedEvents summed over the brokers, at the last poll round before ``t`` (a
        broker that missed a round counts with its previous answer)."""
        last = [0] * nb
        for ts, _, rep in samples:
            if ts > t:
                break
            last = [x if x is not None else y for x, y in zip(rep, last)]
        return sum(last)

    bounds = starts + [t_stopped, math.inf]
    replayed = {p: replayed_at(bounds[i + 1]) - replayed_at(bounds[i])
                for i, p in enumerate(periods)}
    replayed["final drain"] = replayed_at(math.inf) - replayed_at(t_stopped)
    exc = [s.get("orderExceptions") if s else None for s in final]
    order_exceptions = None if any(x is None for x in exc) else sum(exc)

    counts = {per: {st: 0 for st in OUTAGE_STATUSES} for per in periods}
    for tx, st in status.items():
        counts[period[tx]][st] += 1
    total = {st: sum(counts[p][st] for p in periods) for st in OUTAGE_STATUSES}
    ok = not missing and not duplicated and not unexpected and not violations \
        and not wrong_partition
    if missing or duplicated:
        failures.append(f"outage_ha: {len(missing)} acknowledged ids missing, {len(duplicated)} "
                        f"duplicated in PostgreSQL (e.g. {(missing + duplicated)[:5]})")
    if unexpected or wrong_partition:
        failures.append(f"outage_ha: {len(unexpected)} ids in PostgreSQL nobody pushed, "
                        f"{len(wrong_partition)} in the wrong partition")
    if violations:
        failures.append(f"outage_ha: {violations} adjacent pairs out of send order in "
                        f"{len(breaks)} partitions (e.g. {examples[:3]})")
    durations = [b - a for a, b in zip(starts, starts[1:] + [t_stopped])]
    result = {
        "queue": queue, "brokers": nb, "producers": producers, "mesh": False,
        "db_connection_timeout_ms": args.outage_db_timeout_ms,
        "timeline_s": timeline, "periods": periods,
        "period_s": dict(zip(periods, durations)),
        "request_ms": {p: {"p50": percentile(v, 50), "p99": percentile(v, 99),
                           "max": max(v) if v else None} for p, v in req_ms.items()},
        "pushes": len(status), "by_period": counts, "totals": total,
        "acknowledged": len(acked), "present": len(count),
        "acknowledged_present_once": len(acked) - len(missing) - len(set(duplicated) & acked),
        "missing": len(missing), "missing_at_partition_tails": tail,
        "duplicated": len(duplicated), "unexpected": len(unexpected),
        "wrong_partition": len(wrong_partition),
        "unacknowledged": len(unacked), "unacknowledged_present": len(unacked_present),
        "order_violations": violations, "order_violation_partitions": sorted(breaks),
        "order_violations_incl_unacknowledged": violations_all,
        "order_violation_examples": examples,
        "missing_ids": missing[:100], "duplicated_ids": duplicated[:100],
        "unexpected_ids": unexpected[:100], "wrong_partition_ids": wrong_partition[:100],
        "drain_after_pg_start_s": drains, "drained": drained,
        "drain_after_producers_stopped_s": (t_drained - t_stopped) if drained else None,
        "spool_peak_per_broker": peaks, "spool_timeline": timeline_pts,
        "spool_replayed_by_period": replayed,
        "order_exceptions": order_exceptions,
        "order_exceptions_per_broker": exc,
        "spool_failed_count": [s.get("failedCount") if s else None for s in final],
        "spool_backlog_rows_after": backlog_rows,
        "groups": group_res, "first_errors": first_error, "invariant_ok": ok and not any(
            g["missing_acked"] or g["duplicate_deliveries"] or g["order_violations"]
            or g["errors"] for g in group_res.values()),
        "broker": meter.figures(len(acked)),
    }
    print()
    rows_out = [[st] + [counts[p][st] for p in periods] + [total[st]] for st in OUTAGE_STATUSES]
    rows_out.append(["request ms p50 / max"] + [
        f"{fmt_ms(result['request_ms'][p]['p50'])} / {fmt_ms(result['request_ms'][p]['max'])}"
        for p in periods] + [""])
    print(table(["pushes answered"] + [f"{p} ({d:.1f}s)" for p, d in
                                       zip(periods, durations)] + ["total"], rows_out))
    fmt_s = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    out = [
        ["pushes / acknowledged (queued+duplicate+buffered)", f"{len(status)} / {len(acked)}"],
        ["acknowledged present exactly once", result["acknowledged_present_once"]],
        ["acknowledged missing (of which each partition's last ones / holes)",
         f"{len(missing)} ({tail} / {len(missing) - tail})"],
        ["duplicated (any id)", len(duplicated)],
        ["present but nobody pushed them / in the wrong partition",
         f"{len(unexpected)} / {len(wrong_partition)}"],
        ["not acknowledged: present / absent",
         f"{len(unacked_present)} / {len(unacked) - len(unacked_present)}"],
        ["order violations (adjacent stored pairs not in send order) / partitions",
         f"{violations} / {len(breaks)}"],
        ["  the same, counting unacknowledged ids too", violations_all],
        ["spool peak per broker (pendingCount)", " / ".join(map(str, peaks))],
        ["spool events replayed (replayedEvents): " + " / ".join(
            p for p in replayed if p.startswith("after") or p == "final drain"),
         " / ".join(str(n) for p, n in replayed.items()
                    if p.startswith("after") or p == "final drain")],
    ]
    for i, d in enumerate(drains):
        out.append([f"all spools empty after PostgreSQL start {i + 1} (s)",
                    fmt_s(d) if d is not None else "not empty before the next stop"
                    if i + 1 < len(drains) else "not within the drain cap"])
    out += [["drain after producers stopped (s)", fmt_s(result["drain_after_producers_stopped_s"])],
            ["spool.orderExceptions (sum over brokers)",
             "n/a" if order_exceptions is None else order_exceptions],
            ["queen.spool_backlog rows afterwards",
             "n/a" if backlog_rows is None else backlog_rows],
            [f"{nb} brokers (whole run, per 1,000 acknowledged)", fmt_broker(result["broker"])]]
    for group, g in group_res.items():
        out.append([f"group {group}: deliveries / missing / twice / out of order / errors",
                    f"{g['deliveries']} / {g['missing_acked']} / {g['duplicate_deliveries']} / "
                    f"{g['order_violations']} / {g['errors']}"])
    out.append(["invariant (0 missing, 0 duplicated, 0 order violations)",
                "OK" if result["invariant_ok"] else "FAILED"])
    print(table([f"outage_ha: {nb} brokers, in PostgreSQL afterwards", "value"], out))
    if not drained and missing:
        print(f"  the spools did not drain: the missing ids may still have been waiting in them "
              f"when the brokers were stopped (pendingCount {samples[-1][1] if samples else '?'})")
    for e in examples[:5]:
        print(f"  out of order: {e}")
    for k, v in first_error.items():
        print(f"  first {k}: {v}")
    return result


def summary_rows(res: dict) -> list[list[str]]:
    if res.get("skipped"):
        return [["outage_ha: skipped", res["skipped"], "", ""]]
    drains = "/".join("-" if d is None else f"{d:.1f}" for d in res["drain_after_pg_start_s"])
    exc = res["order_exceptions"]
    return [[f"outage_ha: {res['brokers']} brokers, PG down "
             + "+".join(f"{s:g}" for s in res["timeline_s"][1::2]) + " s, acked in PG once",
             f"{res['acknowledged_present_once']}/{res['acknowledged']} "
             f"({res['totals']['buffered']} buffered)",
             f"missing {res['missing']}, dup {res['duplicated']}, order violations "
             f"{res['order_violations']}, order exceptions {'n/a' if exc is None else exc}, "
             f"drains {drains} s",
             "OK" if res["invariant_ok"] else "INVARIANT FAILED"]]
