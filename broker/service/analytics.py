"""The status and analytics answers in the shapes Queen's dashboard reads:
bucket rule, rates, and the assembly of the collector's rows (Sanic-free); the reads of
the collector's tables behind routes/ops/analytics.py and routes/ops/status.py."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.core.times import iso_milli
from broker.service.context import BrokerContext
from broker.store import analytics, ops


def bucket_minutes(since: dt.datetime, until: dt.datetime) -> int:
    """The range -> bucket rule: 1 up to an hour, 5 up to 6 h, 15 up to a day,
    60 up to a week, else 360."""
    span = round((until - since).total_seconds() / 60)
    for limit, minutes in ((60, 1), (360, 5), (1440, 15), (10080, 60)):
        if span <= limit:
            return minutes
    return 360


def iso_s(ts: dt.datetime | None) -> str | None:
    """Fixed-width whole-second UTC stamps (bucket keys sort as strings)."""
    return None if ts is None else ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rate(count: float, minutes: int) -> float:
    return round(float(count) / (minutes * 60), 2)


def _round(value: Any, digits: int = 0) -> Any:
    if value is None:
        return None
    return int(round(value)) if digits == 0 else round(float(value), digits)


def _avg_lag(lag_sum: float, lag_count: int) -> float:
    return float(lag_sum) / lag_count if lag_count else 0.0


def _int(value: Any) -> int:
    return int(value or 0)


def counters(summary: Any) -> dict[str, float]:
    c = summary["counters"] if summary is not None else {}
    return {k: float(v) for k, v in (c or {}).items()}


def _system_fields(s: Any) -> dict:
    return {"queenCpuUserPct": _round(s["cpu_user"] / 100, 2)
            if s and s["cpu_user"] is not None else None,
            "queenCpuSysPct": _round(s["cpu_sys"] / 100, 2)
            if s and s["cpu_sys"] is not None else None,
            "queenRssMb": _round(s["rss"] / 2**20, 1) if s and s["rss"] is not None else None,
            "dbPoolActive": _round(s["pool_active"], 1) if s else None,
            "dbPoolIdle": _round(s["pool_idle"], 1) if s else None,
            "dbPoolSize": _round(s["pool_size"], 1) if s else None}


def _worker_fields(w: Any) -> dict:
    """The cluster-wide fields of a throughput entry (null when W has no row)."""
    if w is None:
        return {"avgEventLoopLagMs": None, "maxEventLoopLagMs": None, "minFreeSlots": None,
                "dbErrors": None, "dlqCount": None}
    return {"avgEventLoopLagMs": _round(w["loop_lag_avg"]),
            "maxEventLoopLagMs": _round(w["loop_lag_max"]),
            "minFreeSlots": _round(w["free_slots_min"]),
            "dbErrors": _int(w["db_errors"]), "dlqCount": _int(w["dlq"])}


async def status(ctx: BrokerContext, *, since, until, queue, namespace, task) -> dict:
    minutes = bucket_minutes(since, until)
    s = await analytics.status(ctx.store, minutes=minutes, since=since, until=until, queue=queue,
                               namespace=namespace, task=task)
    system = {r["ts"]: r for r in s["system"]}
    workers = {r["ts"]: r for r in s["workerSeries"]}
    throughput = []
    if not s["scoped"]:
        for w in s["workerSeries"]:
            ingested, processed, popped = (_int(w["push_messages"]), _int(w["ack_messages"]),
                                           _int(w["pop_messages"]))
            throughput.append({
                "timestamp": iso_s(w["ts"]), "ingested": ingested, "processed": processed,
                "popMessages": popped, "ingestedPerSecond": rate(ingested, minutes),
                "processedPerSecond": rate(processed, minutes),
                "popPerSecond": rate(popped, minutes),
                "avgLagMs": _avg_lag(w["lag_sum_ms"], _int(w["lag_count"])),
                "maxLagMs": _round(w["max_lag_ms"]), "ackFailed": _int(w["ack_failed"]),
                **_worker_fields(w), **_system_fields(system.get(w["ts"]))})
    else:
        names = s["names"] or set()
        folded: dict[dt.datetime, dict[str, Any]] = {}
        for r in s["queueSeries"]:
            if r["queue_name"] not in names:
                continue
            f = folded.setdefault(r["ts"], {"push": 0, "ack": 0, "pop": 0, "failed": 0,
                                            "lag_sum": 0.0, "lag_count": 0, "lag_max": 0.0})
            f["push"] += r["push_messages"]
            f["ack"] += r["ack_success"] + r["ack_failed"]
            f["pop"] += r["pop_messages"]
            f["failed"] += r["ack_failed"]
            f["lag_sum"] += r["lag_sum_ms"]
            f["lag_count"] += r["lag_count"]
            f["lag_max"] = max(f["lag_max"], r["lag_max_ms"])
        for ts in sorted(folded, reverse=True):
            f = folded[ts]
            throughput.append({
                "timestamp": iso_s(ts), "ingested": f["push"], "processed": f["ack"],
                "popMessages": f["pop"], "ingestedPerSecond": rate(f["push"], minutes),
                "processedPerSecond": rate(f["ack"], minutes),
                "popPerSecond": rate(f["pop"], minutes),
                "avgLagMs": _avg_lag(f["lag_sum"], f["lag_count"]),
                "maxLagMs": _round(f["lag_max"]), "ackFailed": f["failed"],
                **_worker_fields(workers.get(ts)), **_system_fields(system.get(ts))})
    t = counters(s["summary"])
    life_pushed, life_popped = t.get("ops.push_messages", 0.0), t.get("ops.pop_messages", 0.0)
    requests = {"push": int(t.get("ops.push_requests", 0)), "pop": int(t.get("ops.pop_requests", 0)),
                "ack": int(t.get("ops.ack_requests", 0))}
    acked = t.get("ops.ack_success", 0.0) + t.get("ops.ack_failed", 0.0)
    totals, leases, dlq = s["totals"], s["leases"], s["dlq"]
    age = s["summary"]["age"] if s["summary"] is not None else None
    return {
        "timeRange": None, "bucketMinutes": minutes, "pointCount": len(throughput),
        "throughput": throughput,
        "queues": [{"id": str(q["id"]), "name": q["name"], "namespace": q["namespace"],
                    "task": q["task"], "partitions": _int(q["partitions"]),
                    "totalConsumed": _int(q["consumed"])} for q in s["queues"]],
        "messages": {
            "total": _int(totals["total"]), "pending": _int(totals["pending"]),
            "processing": _int(totals["processing"]), "completed": _int(totals["completed"]),
            "failed": int(t.get("ops.ack_failed", 0)), "deadLetter": _int(totals["dead_letter"]),
            "lifetimePushed": int(life_pushed),
            "lifetimePending": int(max(0, life_pushed - life_popped)),
            "requests": requests,
            "batchEfficiency": {
                "push": round(life_pushed / requests["push"], 2) if requests["push"] else 0.0,
                "pop": round(life_popped / requests["pop"], 2) if requests["pop"] else 0.0,
                "ack": round(acked / requests["ack"], 2) if requests["ack"] else 0.0}},
        "leases": {"active": _int(leases["active"]),
                   "partitionsWithLeases": _int(leases["partitions"]),
                   "partitionsLocked": _int(leases["partitions"]),
                   "totalBatchSize": _int(leases["batch_size"]),
                   "totalAcked": _int(leases["acked"])},
        "deadLetterQueue": {"totalMessages": _int(dlq["total"]),
                            "affectedPartitions": _int(dlq["partitions"]),
                            "inRange": _int(dlq["in_range"]),
                            "topErrors": [{"error": r["error"], "count": r["n"]}
                                          for r in s["topErrors"]]},
        "workers": [{"hostname": w["hostname"], "workerId": w["pid"],
                     "workerName": w["worker_name"],
                     "avgEventLoopLagMs": w["loop_lag_avg"],
                     "maxEventLoopLagMs": w["loop_lag_max"], "freeSlots": w["free_slots"],
                     "dbConnections": w["db_connections"], "jobQueueSize": w["job_queue"],
                     "messagesProcessed": _int(w["processed"])} for w in s["workers"]],
        "errors": {"dbErrors": int(t.get("ops.db_errors", 0)),
                   "ackFailed": int(t.get("ops.ack_failed", 0)),
                   "dlqMessages": int(t.get("messages.dlq", 0))},
        "statsAge": int(age) if age is not None else -1,
    }


def queue_ops_entry(r: Any, minutes: int) -> dict:
    return {
        "bucket": iso_s(r["ts"]), "queueName": r["queue_name"],
        "pushRequests": _int(r["push_requests"]), "pushMessages": _int(r["push_messages"]),
        "popMessages": _int(r["pop_messages"]), "popEmpty": _int(r["pop_empty"]),
        "ackRequests": _int(r["ack_requests"]), "ackSuccess": _int(r["ack_success"]),
        "ackFailed": _int(r["ack_failed"]), "transactions": _int(r["transactions"]),
        "partitionsCreated": _int(r["created"]), "partitionsDeleted": _int(r["deleted"]),
        "partitionCount": r["partition_count"],
        "avgLagMs": _avg_lag(r["lag_sum_ms"], _int(r["lag_count"])),
        "maxLagMs": _round(r["lag_max_ms"]),
        "pushPerSecond": rate(r["push_messages"], minutes),
        "popPerSecond": rate(r["pop_messages"], minutes),
        "ackPerSecond": rate(r["ack_success"] + r["ack_failed"], minutes),
        "emptyPerSecond": rate(r["pop_empty"], minutes),
        "parkedCount": round(float(r["parked"]), 2),
    }


def worker_entry(w: Any, minutes: int) -> dict:
    push, pop, ack = _int(w["push_messages"]), _int(w["pop_messages"]), _int(w["ack_messages"])
    return {
        "timestamp": iso_s(w["ts"]), "pushMessages": push, "popMessages": pop,
        "ackMessages": ack, "pushRequests": _int(w["push_requests"]),
        "popRequests": _int(w["pop_requests"]), "ackRequests": _int(w["ack_requests"]),
        "jobsDone": None,
        "pushPerSecond": rate(push, minutes), "popPerSecond": rate(pop, minutes),
        "ackPerSecond": rate(ack, minutes),
        "avgEventLoopLagMs": _round(w["loop_lag_avg"]),
        "maxEventLoopLagMs": _round(w["loop_lag_max"]),
        "avgFreeSlots": _round(w["free_slots_avg"]), "minFreeSlots": _round(w["free_slots_min"]),
        "dbConnections": _round(w["pool_size"]),
        "avgJobQueueSize": _round(w["job_queue_avg"]),
        "maxJobQueueSize": _round(w["job_queue_max"]), "backoffSize": _round(w["backoff_max"]),
        "avgLagMs": _round(_avg_lag(w["lag_sum_ms"], _int(w["lag_count"]))),
        "maxLagMs": _round(w["max_lag_ms"]), "lagCount": _int(w["lag_count"]),
        "dbErrors": _int(w["db_errors"]), "ackSuccess": _int(w["ack_success"]),
        "ackFailed": _int(w["ack_failed"]), "dlqCount": _int(w["dlq"]),
    }


def summary_entry(summary: Any) -> dict:
    t = counters(summary)

    def n(key: str) -> int:
        return int(t.get(key, 0))
    return {"totalPushMessages": n("ops.push_messages"), "totalPopMessages": n("ops.pop_messages"),
            "totalAckMessages": n("ops.ack_success") + n("ops.ack_failed"),
            "totalPushRequests": n("ops.push_requests"), "totalPopRequests": n("ops.pop_requests"),
            "totalAckRequests": n("ops.ack_requests"), "totalDbErrors": n("ops.db_errors"),
            "totalAckFailed": n("ops.ack_failed"), "totalDlq": n("messages.dlq"),
            "pendingMessages": n("ops.push_messages") - n("ops.pop_messages")}


# -- system metrics: the reference's leaves, merged per bucket ------------------

def _merge_leaf(leaves: list[tuple[dict, int]]) -> dict:
    """``avg`` weighted by sample count, lowest ``min``, highest ``max``, newest ``last``."""
    weighted = [(lf["avg"], n) for lf, n in leaves if isinstance(lf, dict) and lf.get("avg")
                is not None]
    mins = [lf["min"] for lf, _ in leaves if isinstance(lf, dict) and lf.get("min") is not None]
    maxs = [lf["max"] for lf, _ in leaves if isinstance(lf, dict) and lf.get("max") is not None]
    last = next((lf.get("last") for lf, _ in reversed(leaves) if isinstance(lf, dict)
                 and lf.get("last") is not None), None)
    total = sum(n for _, n in weighted)
    return {"avg": round(sum(v * n for v, n in weighted) / total, 3) if total else None,
            "min": min(mins) if mins else None, "max": max(maxs) if maxs else None,
            "last": last}


LEAF_PATHS = (("cpu", "user_us"), ("cpu", "system_us"), ("memory", "rss_bytes"),
              ("memory", "virtual_bytes"), ("database", "pool_size"), ("database", "pool_idle"),
              ("database", "pool_active"), ("threadpool", "db", "pool_size"),
              ("threadpool", "db", "queue_size"), ("threadpool", "system", "pool_size"),
              ("threadpool", "system", "queue_size"), ("registries", "response"),
              ("event_loop", "lag_ms"), ("event_loop", "lag_max_ms"))


def _dig(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _put(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _shared_state(newest: dict) -> dict:
    s = newest.get("shared_state") if isinstance(newest, dict) else None
    s = s if isinstance(s, dict) else {}
    health, transport = s.get("server_health") or {}, s.get("transport") or {}
    none3 = {"count": None, "latency_us": None, "items": None}
    return {"enabled": s.get("enabled"),
            "sidecar_ops": {"push": none3, "pop": none3, "ack": none3},
            "queue_backoff": {"queues_with_backoff": None, "total_backed_off_groups": None,
                              "avg_interval_ms": None},
            "queue_backoff_summary": None,
            "queue_config_cache": {"size": None, "hits": None, "misses": None},
            "consumer_presence": {"queues_tracked": None, "servers_tracked": None,
                                  "total_registrations": None},
            "server_health": {"alive": health.get("alive"), "dead": health.get("dead")},
            "transport": {"sent": transport.get("sent"), "received": transport.get("received"),
                          "dropped": transport.get("dropped")}}


def system_replicas(rows: list, minutes: int) -> list[dict]:
    """One entry per (hostname, port, workerId), ordered so; ascending time series."""
    width = minutes * 60
    replicas: dict[tuple, dict[int, list]] = {}
    for r in rows:
        key = (r["hostname"], r["port"], r["worker_id"])
        start = int(r["timestamp"].timestamp() // width * width)
        replicas.setdefault(key, {}).setdefault(start, []).append(r)
    out = []
    for (host, port, worker), buckets in sorted(replicas.items()):
        series = []
        for start in sorted(buckets):
            group = buckets[start]
            metrics: dict = {}
            for path in LEAF_PATHS:
                _put(metrics, path, _merge_leaf([(_dig(g["metrics"], path) or {},
                                                  g["sample_count"]) for g in group]))
            metrics["shared_state"] = _shared_state(group[-1]["metrics"])
            series.append({"timestamp": iso_milli(dt.datetime.fromtimestamp(start, dt.UTC)),
                           "sampleCount": sum(g["sample_count"] for g in group),
                           "metrics": metrics})
        out.append({"hostname": host, "port": port, "workerId": worker, "timeSeries": series})
    return out


# -- the collector's series, read for routes/ops/analytics.py ------------------------

async def queue_ops(ctx: BrokerContext, minutes: int, since: dt.datetime, until: dt.datetime,
                    queue: str | None) -> list:
    return await analytics.queue_ops(ctx.store, minutes, since, until, queue)


async def retention(ctx: BrokerContext, minutes: int, since: dt.datetime, until: dt.datetime,
                    queue: str | None) -> list:
    return await analytics.retention_series(ctx.store, minutes, since, until, queue)


async def queue_lag(ctx: BrokerContext, since: dt.datetime, until: dt.datetime,
                    queue: str | None) -> list:
    return await analytics.queue_lag_rows(ctx.store, since, until, queue)


async def parked_replicas(ctx: BrokerContext, minutes: int, since: dt.datetime,
                          until: dt.datetime, queue: str | None) -> list:
    return await analytics.parked_replicas(ctx.store, minutes, since, until, queue)


async def system_rows(ctx: BrokerContext, since: dt.datetime, until: dt.datetime,
                      hostname: str | None, worker_id: str | None) -> list:
    return await analytics.system_rows(ctx.store, since, until, hostname, worker_id)


async def worker_metrics(ctx: BrokerContext, minutes: int, since: dt.datetime,
                         until: dt.datetime, hostname: str | None, pid: int | None) -> dict:
    return await analytics.worker_metrics(ctx.store, minutes, since, until, hostname, pid)


async def postgres_stats(ctx: BrokerContext) -> dict[str, Any]:
    return await analytics.postgres_stats(ctx.store)


# -- the status routes' reads (routes/ops/status.py) ----------------------------------

async def queues_status(ctx: BrokerContext, namespace: str | None, task: str | None,
                        limit: int, offset: int) -> list:
    return await ops.queues_status(ctx.store, namespace, task, limit, offset)


async def queue_status(ctx: BrokerContext, queue: str) -> tuple[Any, list]:
    """(the queue's row or None, its partitions' figures)."""
    return await ops.queue_status(ctx.store, queue)


async def message_series(ctx: BrokerContext, *, queue: str | None, namespace: str | None,
                         task: str | None, since: dt.datetime, until: dt.datetime,
                         bucket_minutes: int) -> dict:
    """Ingested, processed and dead-lettered messages per bucket (status/analytics)."""
    return await ops.analytics(ctx.store, queue=queue, namespace=namespace, task=task,
                               since=since, until=until, bucket_minutes=bucket_minutes)
