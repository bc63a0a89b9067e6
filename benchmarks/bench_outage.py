"""``outage``: the spool under a PostgreSQL outage, one broker.

One embedded PostgreSQL (skipped when PG_HOST is set) and one broker with
``DB_CONNECTION_TIMEOUT`` = ``--outage-db-timeout-ms``.  Registered in run.py
(``python3 dev.py bench outage``).

``--outage-producers`` producers, each on its own partition, push steadily (1-10 items per
request, client-chosen unique transactionIds, ``--outage-pause-ms`` between requests) and
record per item what the broker answered (``OUTAGE_STATUSES``).  After ``--outage-before-s``
PostgreSQL is crash-stopped for ``--outage-down-s``, started again, pushing continues
``--outage-after-s``, then the spool is polled until empty (at most ``--outage-drain-max-s``).
Invariant: every acknowledged id (queued / duplicate / buffered) in PostgreSQL exactly once,
nothing nobody pushed.  ``push_statuses`` and the status constants are shared with
bench_outage_ha.py, which also reads the ``--outage-db-timeout-ms``,
``--outage-request-timeout`` and ``--outage-drain-max-s`` options defined here.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import asyncpg
import httpx

from _harness import Broker, BrokerMeter, RawHTTPClient, fmt_broker, start_database
from _loadgen import JSON_HEADERS, PAD, fmt_ms, log, percentile, table

NAME = "outage"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--outage-producers", type=int, default=16, help="outage: producers")
    ap.add_argument("--outage-pause-ms", type=int, default=10,
                    help="outage: pause of each producer between two pushes")
    ap.add_argument("--outage-before-s", type=float, default=5.0,
                    help="outage: pushing before PostgreSQL is stopped")
    ap.add_argument("--outage-down-s", type=float, default=10.0,
                    help="outage: PostgreSQL down for this long")
    ap.add_argument("--outage-after-s", type=float, default=5.0,
                    help="outage: pushing after PostgreSQL is started again")
    ap.add_argument("--outage-db-timeout-ms", type=int, default=500,
                    help="outage: the broker's DB_CONNECTION_TIMEOUT")
    ap.add_argument("--outage-request-timeout", type=float, default=30.0,
                    help="outage: client timeout of one push (then counted as 'timeout')")
    ap.add_argument("--outage-drain-max-s", type=float, default=120.0,
                    help="outage: longest wait for the spool to drain")


OUTAGE_ACKED = ("queued", "duplicate", "buffered")
OUTAGE_STATUSES = ("queued", "duplicate", "buffered", "failed", "http_error", "conn_error",
                   "timeout")


async def push_statuses(client: RawHTTPClient, body: str, n: int, timeout: float,
                        first_error: dict[str, str]) -> list[str]:
    """POST one push of ``n`` items; what the broker answered for each item, one of
    OUTAGE_STATUSES (the first error of each kind is kept in ``first_error``)."""
    try:
        r = await asyncio.wait_for(
            client.post("/api/v1/push", content=body, headers=JSON_HEADERS), timeout)
    except TimeoutError:
        # (the connection that timed out is dropped; the next push opens one)
        return ["timeout"] * n
    except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
        first_error.setdefault("conn_error", repr(exc)[:200])
        return ["conn_error"] * n
    got = ["http_error"] * n
    try:
        items = r.json() if r.content else None
    except ValueError:
        items = None
    if isinstance(items, list) and len(items) == n:
        got = [x.get("status") if x.get("status") in OUTAGE_STATUSES else "http_error"
               for x in items]
    if r.status_code not in (200, 201) or "http_error" in got:
        first_error.setdefault(f"HTTP {r.status_code}", r.text[:200])
    return got


async def run(args: argparse.Namespace, failures: list[str]) -> dict:
    """16 producers push steadily; PostgreSQL is crash-stopped for a while and started again;
    afterwards every id the broker acknowledged must be in PostgreSQL exactly once."""
    db = start_database()
    if not db.can_restart:
        db.stop()
        log("outage: skipped, it stops PostgreSQL and needs the embedded one (PG_HOST is set)")
        return {"skipped": "needs the embedded PostgreSQL (PG_HOST is set)"}
    queue = f"bench-outage-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:8]
    producers = args.outage_producers
    status: dict[str, str] = {}      # transactionId -> what the broker answered
    period: dict[str, str] = {}      # transactionId -> before / outage / after (by send time)
    order: dict[int, list[str]] = {k: [] for k in range(producers)}  # acked, in send order
    requests = {"before": 0, "outage": 0, "after": 0}
    req_ms: dict[str, list[float]] = {"before": [], "outage": [], "after": []}
    first_error: dict[str, str] = {}
    stop = asyncio.Event()
    marks: dict[str, float] = {}
    spool_samples: list[tuple[float, int]] = []

    def now_period(t: float) -> str:
        if "pg_stop" not in marks or t < marks["pg_stop"]:
            return "before"
        if "pg_started" not in marks or t < marks["pg_started"]:
            return "outage"
        return "after"

    t = time.perf_counter()
    broker = Broker(db, DB_CONNECTION_TIMEOUT=str(args.outage_db_timeout_ms))
    log(f"{db.kind} PostgreSQL on {db.host}:{db.port}, broker on {broker.url} "
        f"(DB_CONNECTION_TIMEOUT={args.outage_db_timeout_ms}; started in "
        f"{time.perf_counter() - t:.1f}s)")
    meter = BrokerMeter(broker)
    try:
        async def producer(k: int) -> None:
            import random
            rng = random.Random(k)
            seq = 0
            async with RawHTTPClient(broker.url, 2) as client:
                while not stop.is_set():
                    n = rng.randint(1, 10)
                    txids = [f"{tag}-{k}-{seq + i}" for i in range(n)]
                    seq += n
                    body = json.dumps({"items": [
                        {"queue": queue, "partition": f"p{k}", "transactionId": tx,
                         "payload": {"k": k, "tx": tx, "pad": PAD}} for tx in txids]})
                    t_send = time.perf_counter()
                    per = now_period(t_send)
                    got = await push_statuses(client, body, n, args.outage_request_timeout,
                                              first_error)
                    requests[per] += 1
                    req_ms[per].append((time.perf_counter() - t_send) * 1000)
                    for tx, st in zip(txids, got):
                        status[tx], period[tx] = st, per
                        if st in OUTAGE_ACKED:
                            order[k].append(tx)
                    if args.outage_pause_ms:
                        await asyncio.sleep(args.outage_pause_ms / 1000)

        async def spool_pending(client: httpx.AsyncClient) -> int | None:
            """Pushes not in the messages table yet: spooled on the broker's disk, or uploaded
            into queen.staged and not merged."""
            try:
                body = (await client.get(broker.url + "/api/v1/system/maintenance")).json()
                return int(body["bufferedMessages"]) + int(body["staging"]["stagedEvents"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return None

        async def monitor() -> None:
            async with httpx.AsyncClient(timeout=5) as client:
                while not stop.is_set():
                    n = await spool_pending(client)
                    if n is not None:
                        spool_samples.append((time.perf_counter(), n))
                    await asyncio.sleep(0.25)

        marks["start"] = time.perf_counter()
        tasks = [asyncio.create_task(producer(k)) for k in range(producers)]
        mon = asyncio.create_task(monitor())
        await asyncio.sleep(args.outage_before_s)
        log(f"stopping PostgreSQL (immediate) for {args.outage_down_s:g} s "
            f"({sum(1 for _ in status)} items pushed so far)")
        marks["pg_stop"] = time.perf_counter()
        await db.stop_server()
        marks["pg_stopped"] = time.perf_counter()
        await asyncio.sleep(max(0.0, args.outage_down_s - (marks["pg_stopped"] - marks["pg_stop"])))
        log("starting PostgreSQL again")
        await db.start_server()
        marks["pg_started"] = time.perf_counter()
        await asyncio.sleep(args.outage_after_s)
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=args.outage_request_timeout + 5)
        for x in pending:
            x.cancel()
        if pending:
            failures.append(f"outage: {len(pending)} producers did not stop")
        marks["producers_stopped"] = time.perf_counter()
        await asyncio.wait([mon], timeout=10)
        log(f"producers stopped ({len(status)} items); waiting for the spool to drain")

        drained = False
        last = None
        async with httpx.AsyncClient(timeout=5) as client:
            deadline = time.perf_counter() + args.outage_drain_max_s
            while time.perf_counter() < deadline:
                last = await spool_pending(client)
                if last is not None:
                    spool_samples.append((time.perf_counter(), last))
                if last == 0:
                    drained = True
                    break
                await asyncio.sleep(0.1)
            marks["drained"] = time.perf_counter()
            health = (await client.get(broker.url + "/health")).json()
        if not drained:
            failures.append(f"outage: spool not drained within {args.outage_drain_max_s:g} s "
                            f"({last} messages still buffered)")
        # the first moment after the restart at which the spool was seen empty
        empty_after = next((ts for ts, n in spool_samples
                            if ts >= marks["pg_started"] and n == 0), None)

        conn = await asyncpg.connect(db.dsn, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT m.transaction_id, count(*) AS n, p.name AS partition, "
                "array_agg(m.seq ORDER BY m.seq) AS seqs "
                "FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 "
                "GROUP BY m.transaction_id, p.name", queue)
        finally:
            await conn.close()
    finally:
        meter.stop()
        broker.stop()
        db.stop()

    present: dict[str, int] = {}
    first_seq: dict[str, int] = {}
    for r in rows:
        present[r["transaction_id"]] = present.get(r["transaction_id"], 0) + r["n"]
        first_seq[r["transaction_id"]] = r["seqs"][0]
    acked = {tx for tx, st in status.items() if st in OUTAGE_ACKED}
    unacked = set(status) - acked
    missing = sorted(acked - present.keys())
    duplicated = sorted(tx for tx, n in present.items() if n > 1)
    unexpected = sorted(present.keys() - status.keys())
    unacked_present = sorted(unacked & present.keys())
    # informational: does each partition hold its acknowledged ids in send order?
    # An id "overtook" when it is stored ahead of an id the same producer sent before it.
    out_of_order: list[int] = []
    overtaking = 0
    overtaking_by_period = {"before": 0, "outage": 0, "after": 0}
    for k, txs in order.items():
        top = -1
        bad = 0
        for tx in txs:
            sq = first_seq.get(tx)
            if sq is None:
                continue
            if sq < top:
                bad += 1
                overtaking_by_period[period[tx]] += 1
            top = max(top, sq)
        if bad:
            out_of_order.append(k)
            overtaking += bad

    counts = {per: {st: 0 for st in OUTAGE_STATUSES} for per in ("before", "outage", "after")}
    for tx, st in status.items():
        counts[period[tx]][st] += 1
    total = {st: sum(counts[p][st] for p in counts) for st in OUTAGE_STATUSES}
    ok = not missing and not duplicated and not unexpected
    if missing or duplicated:
        failures.append(f"outage: {len(missing)} acknowledged ids missing, {len(duplicated)} "
                        f"duplicated in PostgreSQL (e.g. {(missing + duplicated)[:5]})")
    if unexpected:
        failures.append(f"outage: {len(unexpected)} ids in PostgreSQL nobody pushed")
    peak = max((n for _, n in spool_samples), default=0)
    result = {
        "queue": queue, "producers": producers, "pause_ms": args.outage_pause_ms,
        "db_connection_timeout_ms": args.outage_db_timeout_ms,
        "phases_s": {"before": marks["pg_stop"] - marks["start"],
                     "stop_call": marks["pg_stopped"] - marks["pg_stop"],
                     "down": marks["pg_started"] - marks["pg_stop"],
                     "after": marks["producers_stopped"] - marks["pg_started"]},
        "requests": requests,
        "request_ms": {p: {"p50": percentile(v, 50), "p99": percentile(v, 99),
                           "max": max(v) if v else None} for p, v in req_ms.items()},
        "items_pushed": len(status), "by_period": counts, "totals": total,
        "acknowledged": len(acked), "present": len(present),
        "acknowledged_present_once": len(acked) - len(missing)
        - len(set(duplicated) & acked),
        "missing": len(missing), "duplicated": len(duplicated), "unexpected": len(unexpected),
        "unacknowledged": len(unacked), "unacknowledged_present": len(unacked_present),
        "unacknowledged_absent": len(unacked) - len(unacked_present),
        "missing_ids": missing[:100], "duplicated_ids": duplicated[:100],
        "unacknowledged_present_ids": unacked_present[:100],
        "partitions_out_of_send_order": out_of_order,
        "acked_ids_stored_ahead_of_earlier_sent": overtaking,
        "acked_ids_stored_ahead_by_period": overtaking_by_period,
        "spool_peak": peak, "drained": drained,
        "drain_after_producers_stopped_s": marks["drained"] - marks["producers_stopped"]
        if drained else None,
        "spool_empty_after_pg_start_s": (empty_after - marks["pg_started"])
        if empty_after is not None else None,
        "spool_failed_count": (health.get("spool") or {}).get("failedCount"),
        "first_errors": first_error, "invariant_ok": ok,
        "broker": meter.figures(len(acked)),
    }
    print()
    rows_out = [[st] + [counts[p][st] for p in ("before", "outage", "after")] + [total[st]]
                for st in OUTAGE_STATUSES]
    rows_out.append(["requests"] + [requests[p] for p in ("before", "outage", "after")]
                    + [sum(requests.values())])
    rows_out.append(["request ms p50 / max"] + [
        f"{fmt_ms(result['request_ms'][p]['p50'])} / {fmt_ms(result['request_ms'][p]['max'])}"
        for p in ("before", "outage", "after")] + [""])
    ph = result["phases_s"]
    print(table(["items answered", f"before ({ph['before']:.1f}s)",
                 f"PG down ({ph['down']:.1f}s)", f"after ({ph['after']:.1f}s)", "total"],
                rows_out))
    drain = result["drain_after_producers_stopped_s"]
    empty = result["spool_empty_after_pg_start_s"]
    print(table(["outage: in PostgreSQL afterwards", "value"], [
        ["items pushed / acknowledged (queued+duplicate+buffered)",
         f"{len(status)} / {len(acked)}"],
        ["acknowledged present exactly once", result["acknowledged_present_once"]],
        ["acknowledged missing", len(missing)],
        ["duplicated (any id)", len(duplicated)],
        ["present but nobody pushed them", len(unexpected)],
        ["not acknowledged (failed/HTTP/conn error/timeout): present / absent",
         f"{len(unacked_present)} / {len(unacked) - len(unacked_present)}"],
        ["spool peak (spooled + staged messages)", peak],
        ["broker (whole run, per 1,000 acknowledged)", fmt_broker(result["broker"])],
        ["spool empty after PostgreSQL start (s)", "-" if empty is None else f"{empty:.2f}"],
        ["drain after producers stopped (s)", "-" if drain is None else f"{drain:.2f}"],
        ["info: partitions not in send order / ids stored ahead of earlier-sent ids",
         f"{len(out_of_order)} / {overtaking} (sent: " + ", ".join(
             f"{p} {n}" for p, n in overtaking_by_period.items()) + ")"],
        ["invariant", "OK" if ok else "FAILED"],
    ]))
    for k, v in first_error.items():
        print(f"  first {k}: {v}")
    return result


def summary_rows(res: dict) -> list[list[str]]:
    if res.get("skipped"):
        return [["outage: skipped", res["skipped"], "", ""]]
    drain = res["drain_after_producers_stopped_s"]
    return [["outage: PG down {:.0f}s, acked ids in PG once".format(res["phases_s"]["down"]),
             f"{res['acknowledged_present_once']}/{res['acknowledged']} "
             f"({res['totals']['buffered']} buffered)",
             f"missing {res['missing']}, dup {res['duplicated']}, "
             f"drain {'-' if drain is None else f'{drain:.1f}'} s",
             "OK" if res["invariant_ok"] else "INVARIANT FAILED"]]
