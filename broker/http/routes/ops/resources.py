"""Queue resources beyond the basic queue routes of admin.py (docs/wire-contract.md
§10.4–§10.7): namespaces, tasks, overview, partitions, depth."""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.times import iso_milli
from broker.http.responses import args, error, json
from broker.http.routes.ops.common import now_utc
from broker.http.types import BrokerRequest
from broker.http.wire.common import MAX_NAME, q_int, q_str
from broker.service import resources

bp = Blueprint("ops_resources")


def _messages(r) -> dict:
    return {"total": r["total"], "pending": r["pending"], "processing": r["processing"],
            "completed": r["completed"], "failed": r["dead_letter"],
            "deadLetter": r["dead_letter"]}


async def _dimension(request: BrokerRequest, dim: str, plural: str):
    rows, age = await resources.dimension(request.app.ctx, dim)
    return json({plural: [{dim: r["key"], "queues": r["queues"], "partitions": r["partitions"],
                           "messages": _messages(r)} for r in rows],
                 "statsAge": age})


@bp.get("/api/v1/resources/namespaces")
async def namespaces(request: BrokerRequest):
    """Namespaces (non-empty), counters from queen.stats once populated."""
    return await _dimension(request, "namespace", "namespaces")


@bp.get("/api/v1/resources/tasks")
async def tasks(request: BrokerRequest):
    """Tasks (non-empty), counters from queen.stats once populated."""
    return await _dimension(request, "task", "tasks")


@bp.get("/api/v1/resources/overview")
async def overview(request: BrokerRequest):
    view = await resources.overview(request.app.ctx)
    o, recent, max_lag_ms = view.figures, view.recent, view.max_lag_ms
    catalog, totals = o["catalog"], o["totals"]
    # pop lag of the last 5 minutes (the collector's rows), in whole seconds
    lag_time = {**o["lag"]["time"],
                "avg": round(recent["lag_sum_ms"] / recent["lag_count"] / 1000)
                if recent["lag_count"] else 0,
                "max": int(max_lag_ms / 1000)}
    return json({
        "queues": catalog["queues"], "partitions": catalog["partitions"],
        "namespaces": catalog["namespaces"], "tasks": catalog["tasks"],
        "messages": _messages(totals),
        "lag": {"time": lag_time, "offset": o["lag"]["offset"]},
        "throughput": {"ingestedPerSecond": round(recent["pushed"] / 300, 2),
                       "processedPerSecond": round(recent["acked"] / 300, 2)},
        "timestamp": iso_milli(now_utc()),
        "statsAge": o["statsAge"],
    })


@bp.get("/api/v1/resources/partitions")
async def partitions(request: BrokerRequest):
    """Partitions (of ``queue``) with at least ``minDepth`` pending messages; exact."""
    a = args(request)
    queue = q_str(a, "queue")
    if queue is not None and len(queue) > MAX_NAME:
        raise BadRequest(f"queue must be at most {MAX_NAME} characters")
    min_depth = q_int(a, "minDepth", 0, minimum=0)
    limit = q_int(a, "limit", 1000, minimum=1, maximum=10_000)
    offset = q_int(a, "offset", 0, minimum=0)
    rows = await resources.partitions(request.app.ctx, queue, min_depth, limit, offset)
    return json({"partitions": [{
        "id": str(r["partition_id"]), "name": r["partition_name"], "queue": r["queue_name"],
        "namespace": r["namespace"], "task": r["task"], "queuePriority": r["priority"],
        "createdAt": iso_milli(r["created_at"]), "lastActivity": iso_milli(r["last_activity"]),
        "depth": r["pending"], "processing": r["processing"], "total": r["total"],
        "deadLetter": r["dead_letter"], "oldestPendingAt": iso_milli(r["oldest_pending_at"]),
    } for r in rows], "pagination": {"limit": limit, "offset": offset}})


@bp.get("/api/v1/resources/queues/<queue:str>/depth", unquote=True)
async def depth(request: BrokerRequest, queue: str):
    """Backlog per partition after a group's cursor (``group``) or the effective
    cursor (queue mode's, else the least advanced group's). Exact."""
    group = q_str(args(request), "group")
    if group is not None and len(group) > MAX_NAME:
        raise BadRequest(f"group must be at most {MAX_NAME} characters")
    found = await resources.queue_depth(request.app.ctx, queue, group)
    if found is None:
        return error("Queue not found", 404)
    rows = found.rows
    pending = sum(r["pending"] for r in rows)
    owing = sum(1 for r in rows if r["pending"] > 0)
    # A conflating group runs its handler once per partition that owes work (§5.8).
    conflates = found.conflates
    return json({
        "queue": queue, "group": group, "pending": pending,
        "partitionsPending": owing,
        "conflation": conflates,
        "effectivePending": owing if conflates else pending,
        "partitions": [{"partition": r["partition"], "pending": r["pending"]} for r in rows],
    })

