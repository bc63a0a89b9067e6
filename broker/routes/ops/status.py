"""Dashboard status and analytics (api.md §14.2). Shapes are stable JSON; counters
come from queen.stats once the stats job has populated it (``statsAge`` says how
old they are), from the base tables before that. Time series are read from
base tables and the collector's metric tables, filtered by ``from``/``to``."""
from __future__ import annotations

import datetime as dt

from sanic import Blueprint, Request

from broker.http import args, error, json
from broker.routes.ops.common import (
    bucket_minutes,
    camel_row,
    interval_minutes,
    now_utc,
    plain,
    series,
    time_range,
)
from broker.service.gauges import gauges
from broker.store import ops, ops_sql
from broker.telemetry import telemetry
from broker.wire import MAX_NAME, BadRequest, iso_milli, q_int, q_str

bp = Blueprint("ops_status")

MAX_POINTS = 10_000


def _scope(a) -> tuple[str | None, str | None, str | None]:
    out = []
    for name in ("queue", "namespace", "task"):
        value = q_str(a, name)
        if value is not None and len(value) > MAX_NAME:
            raise BadRequest(f"{name} must be at most {MAX_NAME} characters")
        out.append(value)
    return out[0], out[1], out[2]


def _range(since: dt.datetime, until: dt.datetime) -> dict:
    return {"from": iso_milli(since), "to": iso_milli(until)}


def _messages(r) -> dict:
    return {"total": r["total"], "pending": r["pending"], "processing": r["processing"],
            "completed": r["completed"], "failed": r["dead_letter"],
            "deadLetter": r["dead_letter"]}


@bp.get("/api/v1/status")
async def status(request: Request):
    a = args(request)
    queue, namespace, task = _scope(a)
    since, until = time_range(a)
    minutes = bucket_minutes(since, until)
    s = await ops.status(request.app.ctx.store, queue=queue, namespace=namespace, task=task,
                         since=since, until=until, bucket_minutes=minutes)
    ing = series(s["ingested"], since, until, minutes)
    proc = series(s["processed"], since, until, minutes)
    dead = series(s["dead"], since, until, minutes)
    width = minutes * 60
    throughput = [{
        "timestamp": t,
        "ingested": ing["values"].get(t, 0), "processed": proc["values"].get(t, 0),
        "deadLettered": dead["values"].get(t, 0),
        "ingestedPerSecond": round(ing["values"].get(t, 0) / width, 3),
        "processedPerSecond": round(proc["values"].get(t, 0) / width, 3),
    } for t in ing["timestamps"]]
    totals, leases, dlq = s["totals"], s["leases"], s["dlq"]
    return json({
        "timeRange": _range(since, until), "bucketMinutes": minutes,
        "pointCount": len(throughput), "throughput": throughput,
        "queues": totals["queues"],
        "messages": _messages(totals),
        "leases": {"active": leases["active"], "partitionsLocked": leases["partitions"],
                   "totalBatchSize": leases["batch_size"], "totalAcked": leases["acked"]},
        "deadLetterQueue": {"totalMessages": dlq["total"], "affectedPartitions": dlq["partitions"],
                            "inRange": dlq["in_range"],
                            "topErrors": [{"error": r["error"], "count": r["n"]}
                                          for r in s["topErrors"]]},
        "workers": [{"hostname": w["hostname"], "workerId": w["worker_id"], "pid": w["pid"],
                     "lastSeen": iso_milli(w["updated_at"]), "bucketTime": iso_milli(w["bucket_time"]),
                     "counters": w["counters"], "gauges": w["gauges"]} for w in s["workers"]],
        "errors": {"deadLettered": dlq["in_range"],
                   "http5xx": sum(telemetry.errors.values()),
                   "http5xxByRoute": dict(telemetry.errors)},
        "statsAge": s["statsAge"],
    })


@bp.get("/api/v1/status/queues")
async def status_queues(request: Request):
    a = args(request)
    _queue, namespace, task = _scope(a)
    time_range(a)  # validated; queue listings are not time-bound
    limit = q_int(a, "limit", 100, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    rows = await ops.queues_status(request.app.ctx.store, namespace, task, limit, offset)
    return json({"queues": [{
        "id": str(r["id"]), "name": r["name"], "namespace": r["namespace"], "task": r["task"],
        "priority": r["priority"], "createdAt": iso_milli(r["created_at"]),
        "partitions": r["partitions"],
        "messages": {"total": r["total"], "pending": r["pending"],
                     "processing": r["processing"], "completed": r["completed"],
                     "deadLetter": r["dead_letter"]},
    } for r in rows], "pagination": {"limit": limit, "offset": offset,
                                     "total": rows[0]["full_count"] if rows else None}})


@bp.get("/api/v1/status/queues/<queue:str>", unquote=True)
async def status_queue(request: Request, queue: str):
    q, parts = await ops.queue_status(request.app.ctx.store, queue)
    if q is None:
        return error("Queue not found", 404)
    keys = ("total", "pending", "processing", "completed", "deadLetter")
    totals = dict.fromkeys(keys, 0)
    partitions = []
    for p in parts:
        m = {"total": p["total"], "pending": p["pending"], "processing": p["processing"],
             "completed": p["completed"], "deadLetter": p["dead_letter"]}
        for k in keys:
            totals[k] += m[k]
        partitions.append({
            "id": str(p["partition_id"]), "name": p["partition_name"],
            "createdAt": iso_milli(p["created_at"]), "lastActivity": iso_milli(p["last_activity"]),
            "lastMessageAt": iso_milli(p["last_message_at"]), "lastSeq": p["last_seq"],
            "messages": m, "oldestPendingAt": iso_milli(p["oldest_pending_at"]),
            "cursor": {"position": p["qm_cursor"],
                       "totalConsumed": p["total_messages_consumed"] or 0,
                       "batchesConsumed": p["total_batches_consumed"] or 0,
                       "lastActivity": iso_milli(p["last_consumed_at"] or p["cursor_updated_at"])},
        })
    return json({
        "queue": {"id": str(q["id"]), "name": q["name"], "namespace": q["namespace"],
                  "task": q["task"], "priority": q["priority"],
                  "createdAt": iso_milli(q["created_at"]),
                  "config": {"leaseTime": q["lease_time"], "retryLimit": q["retry_limit"],
                             "retryDelay": q["retry_delay"], "ttl": q["ttl"],
                             "maxQueueSize": q["max_size"],
                             "deadLetterQueue": q["dead_letter_queue"],
                             "dlqAfterMaxRetries": q["dlq_after_max_retries"],
                             "delayedProcessing": q["delayed_processing"],
                             "windowBuffer": q["window_buffer"],
                             "retentionEnabled": q["retention_enabled"],
                             "retentionSeconds": q["retention_seconds"],
                             "completedRetentionSeconds": q["completed_retention_seconds"],
                             "encryptionEnabled": q["encryption_enabled"],
                             "maxWaitTimeSeconds": q["max_wait_time_seconds"]}},
        "totals": totals, "partitions": partitions,
    })


@bp.get("/api/v1/status/queues/<queue:str>/messages", unquote=True)
async def status_queue_messages(request: Request, queue: str):
    """The queue's newest messages (a JSON array, api.md §14.2)."""
    a = args(request)
    limit = q_int(a, "limit", 50, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    store = request.app.ctx.store
    if not await ops.queue_exists(store, queue):
        return error("Queue not found", 404)
    rows, _mode = await ops.messages_page(store, queue=queue, partition=None, namespace=None,
                                          task=None, since=None, until=None, status=None,
                                          limit=limit, offset=offset)
    return json([{"id": str(r["id"]), "transactionId": r["transaction_id"],
                  "partitionId": str(r["partition_id"]),
                  "queuePath": f"{r['queue_name']}/{r['partition']}",
                  "queue": r["queue_name"], "partition": r["partition"],
                  "status": r["status"], "createdAt": iso_milli(r["created_at"])}
                 for r in rows])


@bp.get("/api/v1/status/analytics")
async def status_analytics(request: Request):
    a = args(request)
    queue, namespace, task = _scope(a)
    interval, minutes = interval_minutes(a)
    since, until = time_range(a, default=dt.timedelta(hours=24))
    if (until - since).total_seconds() / 60 / minutes > MAX_POINTS:
        raise BadRequest("too many points: use a coarser interval or a shorter range")
    s = await ops.analytics(request.app.ctx.store, queue=queue, namespace=namespace, task=task,
                            since=since, until=until, bucket_minutes=minutes)
    ing = series(s["ingested"], since, until, minutes)
    dead = series(s["dead"], since, until, minutes)
    proc = series(s["processed"], since, until, minutes)
    points = [{"timestamp": t, "ingested": ing["values"].get(t, 0),
               "processed": proc["values"].get(t, 0), "deadLettered": dead["values"].get(t, 0)}
              for t in ing["timestamps"]]
    return json({
        "interval": interval, "bucketMinutes": minutes, "timeRange": _range(since, until),
        "filters": {"queue": queue, "namespace": namespace, "task": task},
        "timestamps": ing["timestamps"], "dataPoints": points,
        "totals": {"ingested": sum(p["ingested"] for p in points),
                   "processed": sum(p["processed"] for p in points),
                   "deadLettered": sum(p["deadLettered"] for p in points)},
    })


def _metric_filters(a):
    since, until = time_range(a)
    limit = q_int(a, "limit", 5000, minimum=1, maximum=50_000)
    return since, until, q_str(a, "hostname"), q_str(a, "workerId"), limit


@bp.get("/api/v1/analytics/system-metrics")
async def system_metrics(request: Request):
    since, until, host, worker, limit = _metric_filters(args(request))
    rows = await ops.fetch(request.app.ctx.store, ops_sql.SYSTEM_METRICS, since, until, host,
                           worker, limit)
    return json({"timeRange": _range(since, until),
                 "replicas": sorted({f"{r['hostname']}:{r['port']}:{r['worker_id']}" for r in rows}),
                 "series": [camel_row(r) for r in rows], "pointCount": len(rows)})


@bp.get("/api/v1/analytics/worker-metrics")
async def worker_metrics(request: Request):
    since, until, host, worker, limit = _metric_filters(args(request))
    rows = await ops.fetch(request.app.ctx.store, ops_sql.WORKER_METRICS, since, until, host,
                           worker, limit)
    return json({"timeRange": _range(since, until),
                 "workers": sorted({f"{r['hostname']}:{r['worker_id']}:{r['pid']}" for r in rows}),
                 "series": [camel_row(r) for r in rows], "pointCount": len(rows)})


@bp.get("/api/v1/analytics/queue-lag")
async def queue_lag(request: Request):
    """Current lag per (queue, group); there is no lag history table, so the
    series holds one point: now."""
    a = args(request)
    queue, _ns, _task = _scope(a)
    since, until = time_range(a)
    rows = await ops.fetch(request.app.ctx.store, ops_sql.QUEUE_LAG_NOW, queue)
    now = iso_milli(now_utc())
    return json({"timeRange": _range(since, until),
                 "series": [{"timestamp": now, "queue": r["queue"],
                             "consumerGroup": r["consumer_group"], "partitions": r["partitions"],
                             "offsetLag": r["offset_lag"],
                             "maxTimeLagSeconds": round(r["max_time_lag"], 3),
                             "avgTimeLagSeconds": round(r["avg_time_lag"], 3)} for r in rows]})


@bp.get("/api/v1/analytics/queue-ops")
async def queue_ops(request: Request):
    a = args(request)
    queue, _ns, _task = _scope(a)
    since, until = time_range(a)
    minutes = bucket_minutes(since, until)
    rows = await ops.fetch(request.app.ctx.store, ops_sql.QUEUE_OPS_SERIES, queue, minutes,
                           since, until)
    return json({"timeRange": _range(since, until), "bucketMinutes": minutes,
                 "series": [{"timestamp": iso_milli(r["ts"]), "queue": r["queue"],
                             "pushed": r["pushed"], "deadLettered": r["dead_lettered"]}
                            for r in rows]})


@bp.get("/api/v1/analytics/retention")
async def retention(request: Request):
    a = args(request)
    queue, _ns, _task = _scope(a)
    since, until = time_range(a, default=dt.timedelta(hours=24))
    limit = q_int(a, "limit", 5000, minimum=1, maximum=50_000)
    rows = await ops.fetch(request.app.ctx.store, ops_sql.RETENTION_HISTORY, since, until, queue,
                           limit)
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["retention_type"]] = totals.get(r["retention_type"], 0) + r["messages_deleted"]
    return json({"timeRange": _range(since, until), "totals": totals,
                 "series": [{"timestamp": iso_milli(r["executed_at"]), "queue": r["queue_name"],
                             "partition": r["partition_name"],
                             "partitionId": plain(r["partition_id"]),
                             "messagesDeleted": r["messages_deleted"],
                             "retentionType": r["retention_type"]} for r in rows]})


@bp.get("/api/v1/analytics/queue-parked-replicas")
async def parked_replicas(request: Request):
    """Long polls parked on this broker (there is no cluster table of them)."""
    app = request.app
    parked = await app.ctx.waiters_proxy.parked_count()
    return json({"timestamp": iso_milli(now_utc()),
                 "replicas": [{"serverId": app.ctx.settings.queen_server_id, "parked": parked}]})


@bp.get("/api/v1/analytics/postgres-stats")
async def postgres_stats(request: Request):
    s = await ops.postgres_stats(request.app.ctx.store)
    db = s["database"]
    by_state = {r["state"]: r["n"] for r in s["connections"]}
    return json({
        "database": camel_row(db) if db else None,
        "connections": {"total": sum(by_state.values()), "byState": by_state,
                        "waitingOnLocks": sum(r["waiting_on_locks"] for r in s["connections"])},
        "tables": [camel_row(r) for r in s["tables"]],
        "pool": {k: v for k, v in gauges(request.app.ctx).items() if k.startswith("db_pool")},
        "timestamp": iso_milli(now_utc()),
    })


@bp.get("/api/v1/status/buffers")
async def buffers(request: Request):
    app = request.app
    stats = await app.ctx.spool.stats()
    return json({"fileBuffer": stats, "maintenanceMode": app.ctx.flags.push,
                 "popMaintenanceMode": app.ctx.flags.pop,
                 "serverId": app.ctx.settings.queen_server_id,
                 "messagesBuffered": telemetry.messages.get("buffered", 0)})

