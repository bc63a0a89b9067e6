"""Paged, server-side-filtered lists for an operator's screen (the dashboard reads them):
never a whole table in one answer. ``search`` is a case-insensitive substring; ``limit``
(default 50, at most 500) and ``offset`` page; every answer says how many rows match.

* ``GET /api/v1/browse/queues``: queues (name, namespace, task, partitions, consumer
  groups, message figures from queen.stats);
* ``GET /api/v1/browse/queues/{queue}``: the queue's header and its options, plus the
  options this broker supports (name, type, default) for a configuration form;
* ``GET /api/v1/browse/queues/{queue}/partitions``: its partitions, exact figures;
* ``GET /api/v1/browse/consumer-groups``: (group, queue) pairs, furthest behind first;
* ``GET /api/v1/browse/consumer-groups/{group}/queues/{queue}``: that pair's lag per
  partition (falling behind first) and its stored subscription.
"""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.times import iso_milli, parse_timestamp
from broker.http.responses import args, error, json
from broker.http.types import BrokerRequest
from broker.http.wire.common import MAX_NAME, q_int, q_str
from broker.http.wire.queues import queue_options, supported_options
from broker.service import browse

bp = Blueprint("ops_browse")

MAX_PAGE = 500


def _page(request: BrokerRequest) -> tuple[str | None, int, int]:
    a = args(request)
    search = q_str(a, "search")
    if search is not None and len(search) > MAX_NAME:
        raise BadRequest(f"search must be at most {MAX_NAME} characters")
    if search is not None and "\x00" in search:
        raise BadRequest("search must not contain a NUL character")
    return (search, q_int(a, "limit", 50, minimum=1, maximum=MAX_PAGE),
            q_int(a, "offset", 0, minimum=0))


def _figures(r) -> dict:
    return {"total": r["total"], "pending": r["pending"], "processing": r["processing"],
            "completed": r["completed"], "deadLetter": r["dead_letter"]}


@bp.get("/api/v1/browse/queues")
async def queues(request: BrokerRequest):
    search, limit, offset = _page(request)
    rows, total, age = await browse.queues(request.app.ctx, search, limit, offset)
    return json({
        "queues": [{"name": r["name"], "namespace": r["namespace"], "task": r["task"],
                    "priority": r["priority"], "createdAt": iso_milli(r["created_at"]),
                    "partitions": r["partitions"], "consumerGroups": r["groups"],
                    "messages": _figures(r)} for r in rows],
        "total": total, "search": search,
        "pagination": {"limit": limit, "offset": offset},
        "figuresFrom": "queen.stats",
        "statsAge": None if age is None else round(age, 3),
    })


@bp.get("/api/v1/browse/queues/<queue:str>", unquote=True)
async def queue(request: BrokerRequest, queue: str):
    row = await browse.queue(request.app.ctx, queue)
    if row is None:
        return error("Queue not found", 404)
    return json({"name": row["name"], "namespace": row["namespace"], "task": row["task"],
                 "createdAt": iso_milli(row["created_at"]), "options": queue_options(row),
                 "supportedOptions": supported_options()})


@bp.get("/api/v1/browse/queues/<queue:str>/partitions", unquote=True)
async def partitions(request: BrokerRequest, queue: str):
    search, limit, offset = _page(request)
    page = await browse.partitions(request.app.ctx, queue, search, limit, offset)
    if page is None:
        return error("Queue not found", 404)
    rows, total = page
    return json({
        "queue": queue,
        "partitions": [{"id": str(r["id"]), "name": r["name"],
                        "createdAt": iso_milli(r["created_at"]), "lastSeq": r["last_seq"],
                        "lastMessageAt": iso_milli(r["last_message_at"]),
                        "leaseUntil": iso_milli(r["lease_until"]),
                        "messages": _figures(r)} for r in rows],
        "total": total, "search": search, "pagination": {"limit": limit, "offset": offset},
    })


@bp.get("/api/v1/browse/consumer-groups")
async def groups(request: BrokerRequest):
    search, limit, offset = _page(request)
    rows, total = await browse.groups(request.app.ctx, search, limit, offset)
    return json({
        "groups": [{"group": r["consumer_group"], "queue": r["queue_name"],
                    "namespace": r["namespace"], "task": r["task"],
                    "partitions": r["partitions"], "partitionsBehind": r["partitions_behind"],
                    "positionsBehind": r["positions_behind"],
                    "activeLeases": r["active_leases"],
                    "lastConsumedAt": iso_milli(r["last_consumed_at"])} for r in rows],
        "total": total, "search": search, "pagination": {"limit": limit, "offset": offset},
    })


@bp.get("/api/v1/browse/consumer-groups/<group:str>/queues/<queue:str>", unquote=True)
async def group_lag(request: BrokerRequest, group: str, queue: str):
    _search, limit, offset = _page(request)
    rows, total, sub = await browse.group_lag(request.app.ctx, group, queue, limit, offset)
    return json({
        "group": group, "queue": queue,
        "subscription": None if sub is None else {
            "mode": sub["subscription_mode"],
            "timestamp": iso_milli(sub["subscription_timestamp"]),
            "createdAt": iso_milli(sub["created_at"])},
        "partitions": [{"partition": r["partition_name"], "partitionId": str(r["partition_id"]),
                        "cursor": r["cursor_seq"], "lastSeq": r["last_seq"],
                        "offsetLag": r["offset_lag"],
                        "timeLagSeconds": round(r["time_lag_seconds"], 3),
                        "oldestUnconsumedAt": iso_milli(r["oldest_unconsumed_at"]),
                        "leaseUntil": iso_milli(r["lease_until"]),
                        "lastConsumedAt": iso_milli(r["last_consumed_at"]),
                        "totalConsumed": r["total_messages_consumed"]} for r in rows],
        "total": total, "pagination": {"limit": limit, "offset": offset},
    })


@bp.get("/api/v1/browse/queues/<queue:str>/partitions/<partition:str>/messages", unquote=True)
async def partition_messages(request: BrokerRequest, queue: str, partition: str):
    """A partition's messages in position order from ``fromPosition`` (default 0) or from
    the first one created at or after ``from`` (ISO-8601); ``limit`` (50, at most 500).
    ``next`` is the position to ask for the following page (None at the end)."""
    a = args(request)
    from_position = q_int(a, "fromPosition", 0, minimum=0, maximum=2**63 - 1)
    raw_from = q_str(a, "from")
    since = parse_timestamp(raw_from, "from") if raw_from is not None else None
    limit = q_int(a, "limit", 50, minimum=1, maximum=MAX_PAGE)
    rows = await browse.partition_messages(request.app.ctx, queue, partition,
                                           from_position, since, limit)
    return json({
        "queue": queue, "partition": partition,
        "messages": [{"id": str(r["id"]), "partitionId": str(r["partition_id"]),
                      "position": r["seq"], "transactionId": r["transaction_id"],
                      "traceId": str(r["trace_id"]) if r["trace_id"] else None,
                      "createdAt": iso_milli(r["created_at"]),
                      "isEncrypted": r["is_encrypted"], "deadLettered": r["dead_lettered"]}
                     for r in rows],
        "next": rows[-1]["seq"] + 1 if len(rows) == limit else None,
    })
