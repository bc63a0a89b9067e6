"""Dashboard status and analytics (docs/wire-contract.md §14.2–§14.4). Shapes are stable
JSON; counters come from queen.stats once the stats job has populated it (``statsAge`` says
how old they are), from the base tables before that. Time series are read from
base tables and the collector's metric tables, filtered by ``from``/``to``."""
from __future__ import annotations

import datetime as dt

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.telemetry import telemetry
from broker.core.times import iso_milli
from broker.http.responses import args, error, json
from broker.http.routes.ops.common import (
    interval_minutes,
    series,
    time_range,
)
from broker.http.types import BrokerRequest
from broker.http.wire.common import MAX_NAME, q_int, q_str
from broker.http.wire.queues import figure_totals, partition_figures, queue_summary
from broker.service import analytics, messages
from broker.service.drain import spool_stats

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


@bp.get("/api/v1/status")
async def status(request: BrokerRequest):
    """Throughput per bucket (newest first) from the collector's rows, queues,
    message figures, leases, dead letters, workers, lifetime errors."""
    a = args(request)
    queue, namespace, task = _scope(a)
    since, until = time_range(a)
    body = await analytics.status(request.app.ctx, since=since, until=until, queue=queue,
                                  namespace=namespace, task=task)
    body["timeRange"] = _range(since, until)
    body["errors"]["http5xx"] = sum(telemetry.errors.values())
    return json(body)


@bp.get("/api/v1/status/queues")
async def status_queues(request: BrokerRequest):
    a = args(request)
    _queue, namespace, task = _scope(a)
    time_range(a)  # validated; queue listings are not time-bound
    limit = q_int(a, "limit", 100, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    rows = await analytics.queues_status(request.app.ctx, namespace, task, limit, offset)
    return json({"queues": [queue_summary(r) for r in rows],
                 "pagination": {"limit": limit, "offset": offset,
                                "total": rows[0]["full_count"] if rows else None}})


@bp.get("/api/v1/status/queues/<queue:str>", unquote=True)
async def status_queue(request: BrokerRequest, queue: str):
    q, parts = await analytics.queue_status(request.app.ctx, queue)
    if q is None:
        return error("Queue not found", 404)
    figures = [partition_figures(p) for p in parts]
    totals = figure_totals(figures)
    partitions = []
    for p, m in zip(parts, figures):
        last = iso_milli(p["last_consumed_at"] or p["cursor_updated_at"])
        partitions.append({
            "id": str(p["partition_id"]), "name": p["partition_name"],
            "createdAt": iso_milli(p["created_at"]), "lastActivity": last,
            "lastMessageAt": iso_milli(p["last_message_at"]), "lastSeq": p["last_seq"],
            "messages": m, "stats": dict(m), "oldestPendingAt": iso_milli(p["oldest_pending_at"]),
            "oldestMessage": iso_milli(p["pending_cursor_at"]),
            "newestMessage": iso_milli(p["newest_at"]),
            "cursor": {"position": p["qm_cursor"],
                       "totalConsumed": p["total_messages_consumed"] or 0,
                       "batchesConsumed": p["total_batches_consumed"] or 0,
                       "lastActivity": last},
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
        "totals": {"messages": dict(totals), **totals}, "partitions": partitions,
    })


@bp.get("/api/v1/status/queues/<queue:str>/messages", unquote=True)
async def status_queue_messages(request: BrokerRequest, queue: str):
    """The queue's newest messages (a JSON array, docs/wire-contract.md §14.3)."""
    a = args(request)
    limit = q_int(a, "limit", 50, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    if not await messages.queue_exists(request.app.ctx, queue):
        return error("Queue not found", 404)
    rows, _mode = await messages.page(request.app.ctx, queue=queue, limit=limit, offset=offset)
    return json([{"id": str(r["id"]), "transactionId": r["transaction_id"],
                  "partitionId": str(r["partition_id"]),
                  "queuePath": f"{r['queue_name']}/{r['partition']}",
                  "queue": r["queue_name"], "partition": r["partition"],
                  "status": r["status"], "createdAt": iso_milli(r["created_at"])}
                 for r in rows])


@bp.get("/api/v1/status/analytics")
async def status_analytics(request: BrokerRequest):
    a = args(request)
    queue, namespace, task = _scope(a)
    interval, minutes = interval_minutes(a)
    since, until = time_range(a, default=dt.timedelta(hours=24))
    if (until - since).total_seconds() / 60 / minutes > MAX_POINTS:
        raise BadRequest("too many points: use a coarser interval or a shorter range")
    s = await analytics.message_series(request.app.ctx, queue=queue, namespace=namespace,
                                       task=task, since=since, until=until,
                                       bucket_minutes=minutes)
    ing = series(s["ingested"], since, until, minutes)
    dead = series(s["dead"], since, until, minutes)
    proc = series(s["processed"], since, until, minutes)
    points = [{"timestamp": t, "messages": ing["values"].get(t, 0),
               "ingested": ing["values"].get(t, 0),
               "processed": proc["values"].get(t, 0), "deadLettered": dead["values"].get(t, 0)}
              for t in ing["timestamps"]]
    return json({
        "interval": interval, "bucketMinutes": minutes, "timeRange": _range(since, until),
        "from": iso_milli(since), "to": iso_milli(until),
        "filters": {"queue": queue, "namespace": namespace, "task": task},
        "timestamps": ing["timestamps"], "dataPoints": points,
        "totals": {"ingested": sum(p["ingested"] for p in points),
                   "processed": sum(p["processed"] for p in points),
                   "deadLettered": sum(p["deadLettered"] for p in points)},
    })


@bp.get("/api/v1/status/buffers")
async def buffers(request: BrokerRequest):
    app = request.app
    stats = await spool_stats(app.ctx)
    return json({"pending": stats.get("pendingCount", 0), "failed": stats.get("failedCount", 0),
                 "dbHealthy": stats.get("dbHealthy", True), "worker": 0,
                 "fileBuffer": stats, "maintenanceMode": app.ctx.flags.push,
                 "popMaintenanceMode": app.ctx.flags.pop,
                 "serverId": app.ctx.settings.queen_server_id,
                 "messagesBuffered": telemetry.messages.get("buffered", 0)})

