"""Configure, queue resources, dead letters and health (docs/wire-contract.md §9, §10,
§12, §15.1)."""
from __future__ import annotations

from loguru import logger
from sanic import Blueprint, Request

import broker
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid, new_uuid7
from broker.core.telemetry import telemetry
from broker.core.times import iso_milli, parse_timestamp
from broker.http.responses import args, error, json, read_json
from broker.http.wire.messages import parse_configure, q_int, q_str, queue_options
from broker.service.drain import spool_stats
from broker.service.push import wake_after_commit
from broker.store.schema import schema_version

bp = Blueprint("admin")


@bp.post("/api/v1/configure")
async def configure(request: Request):
    queue, namespace, task, options = parse_configure(read_json(request))
    app = request.app
    row = await app.ctx.store.configure(queue, namespace, task, options)
    app.ctx.hints.queue_config_changed(queue, deleted=False)
    if row["encryption_enabled"] and app.ctx.cipher is None:
        logger.warning("queue {} has encryptionEnabled but QUEEN_ENCRYPTION_KEY is not set: "
                       "its payloads are stored in clear", queue)
    return json({
        "configured": True,
        "queueId": str(row["id"]),
        "partitionId": str(row["default_partition_id"]),
        "queue": row["name"],
        "namespace": row["namespace"],
        "task": row["task"],
        "options": queue_options(row),
    })


# -- queues -----------------------------------------------------------------

@bp.get("/api/v1/resources/queues")
async def list_queues(request: Request):
    rows = await request.app.ctx.store.list_queues()
    return json({"queues": [{
        "id": str(r["id"]), "name": r["name"], "namespace": r["namespace"], "task": r["task"],
        "priority": r["priority"], "createdAt": iso_milli(r["created_at"]),
        "partitions": r["partitions"],
        "messages": {"total": r["total"], "pending": r["pending"], "processing": r["processing"],
                     "completed": r["completed"], "deadLetter": r["dead_letter"]},
    } for r in rows]})


@bp.get("/api/v1/resources/queues/<queue:str>", unquote=True)
async def get_queue(request: Request, queue: str):
    q, partitions = await request.app.ctx.store.queue_detail(queue)
    if q is None:
        return error("Queue not found", 404)
    keys = ("total", "pending", "processing", "completed", "failed", "deadLetter")
    totals = dict.fromkeys(keys, 0)
    out = []
    for p in partitions:
        stats = {"total": p["total"], "pending": p["pending"], "processing": p["processing"],
                 "completed": p["completed"], "failed": p["dead_letter"],
                 "deadLetter": p["dead_letter"]}
        for k in keys:
            totals[k] += stats[k]
        out.append({"id": str(p["id"]), "name": p["name"], "createdAt": iso_milli(p["created_at"]),
                    "stats": stats, "oldestMessage": iso_milli(p["oldest"]),
                    "newestMessage": iso_milli(p["newest"])})
    return json({"id": str(q["id"]), "name": q["name"], "namespace": q["namespace"],
                 "task": q["task"], "createdAt": iso_milli(q["created_at"]),
                 "options": queue_options(q), "partitions": out, "totals": totals})


@bp.delete("/api/v1/resources/queues/<queue:str>", unquote=True)
async def delete_queue(request: Request, queue: str):
    existed = await request.app.ctx.store.delete_queue(queue)
    request.app.ctx.hints.queue_config_changed(queue, deleted=True)
    return json({"deleted": True, "queue": queue, "existed": existed})


# -- dead letters -----------------------------------------------------------

@bp.get("/api/v1/dlq")
async def dlq(request: Request):
    a = args(request)
    since = q_str(a, "from")
    until = q_str(a, "to")
    limit = min(q_int(a, "limit", 100, minimum=1), 1000)
    offset = q_int(a, "offset", 0, minimum=0)
    total, rows = await request.app.ctx.store.dlq(
        queue=q_str(a, "queue"), partition=q_str(a, "partition"),
        group=q_str(a, "consumerGroup"),
        since=parse_timestamp(since, "from") if since else None,
        until=parse_timestamp(until, "to") if until else None,
        limit=limit, offset=offset)
    cipher = request.app.ctx.cipher
    messages = []
    for r in rows:
        data = r["payload"]
        if r["is_encrypted"] and cipher is not None:
            data = cipher.decrypt(data)
        messages.append({
            "id": str(r["id"]), "transactionId": r["transaction_id"],
            "partitionId": str(r["partition_id"]), "queue": r["queue"],
            "partition": r["partition"], "consumerGroup": r["consumer_group"],
            "errorMessage": r["error_message"], "retryCount": r["retry_count"], "data": data,
            "producerSub": r["producer_sub"], "createdAt": iso_milli(r["created_at"]),
            "failedAt": iso_milli(r["failed_at"]),
        })
    return json({"messages": messages, "total": total,
                 "pagination": {"limit": limit, "offset": offset}})


@bp.post("/api/v1/messages/<partition_id:str>/<transaction_id:str>/retry", unquote=True)
async def retry_dead_letter(request: Request, partition_id: str, transaction_id: str):
    """Re-enqueue a dead-lettered message: its DLQ rows go, and a copy with a derived
    transactionId is pushed to the same partition (every group sees the copy; the
    original stays where it is, so no cursor moves backwards)."""
    if not is_uuid(partition_id):
        raise BadRequest(f"partitionId must be a UUID, got {partition_id!r}")
    app = request.app
    copy_txid = f"{transaction_id}:retry:{new_uuid7()}"
    dead, pushed = await app.ctx.store.retry_dead_letter(partition_id, transaction_id,
                                                         new_uuid7(), copy_txid)
    if not dead:
        return error("Message not found in the dead-letter queue", 404)
    first = dead[0]
    wake_after_commit(app.ctx, {(first["queue"], first["partition"])})
    return json({"retried": True, "transactionId": transaction_id,
                 "consumerGroup": first["consumer_group"],
                 "consumerGroups": sorted({r["consumer_group"] for r in dead}),
                 "newTransactionId": copy_txid, "messageId": str(pushed["message_id"])})


# -- health -----------------------------------------------------------------

@bp.get("/health")
async def health(request: Request):
    app = request.app
    settings = app.ctx.settings
    store = app.ctx.store
    ok = await store.ping()
    body = {
        "status": "healthy" if ok else "unhealthy",
        "database": "connected" if ok else "disconnected",
        # Which PG_HOST server is in use (it moves after a failover), as last seen.
        "databaseServer": {"address": store.server.address, "readOnly": store.server.read_only,
                           "schemaVersion": schema_version()},
        "server": settings.queen_server_id,
        "worker_id": settings.worker_id,
        "version": "1.0.0",
        "brokerVersion": broker.__version__,
        "shared_state": await shared_state(app),
        "spool": await spool_stats(app.ctx),
        "queen": {"worker_id": settings.worker_id, "status": "active"},
    }
    return json(body, status=200 if ok else 503)


async def shared_state(app) -> dict:
    """The cluster view of this broker (docs/behaviour.md §3.6): mesh stats under
    ``transport``, the config cache, peer liveness and the maintenance flags."""
    settings = app.ctx.settings
    mesh = app.ctx.mesh
    transport = mesh.stats() if mesh is not None else None
    if transport is not None:  # wakes received from peers, through the per-queue gate
        transport["received_wakes"] = app.ctx.hints.remote_wakes.stats()
    return {
        "enabled": settings.queen_sync_enabled,
        "running": mesh is not None,
        "server_id": settings.queen_server_id,
        "transport": transport,
        "queue_config_cache": app.ctx.queue_cache.stats(),
        "server_health": {
            "servers_tracked": (transport["servers_alive"] + transport["servers_dead"]) if transport else 0,
            "servers_alive": transport["servers_alive"] if transport else 0,
            "servers_dead": transport["servers_dead"] if transport else 0,
        },
        "maintenance_mode": app.ctx.flags.push,
        "pop_maintenance_mode": app.ctx.flags.pop,
        "parkedPops": await app.ctx.waiters_proxy.parked_count(),
        "longPolls": await long_poll_figures(app),
    }


async def long_poll_figures(app) -> dict:
    """How much work parked pops cost: claims issued, timer re-checks and how many
    of them another pop's check answered, pops woken by commits."""
    wakes = await app.ctx.waiters_proxy.wake_stats()
    pops = telemetry.pops
    return {"parked": wakes["parked"], "cohorts": wakes["cohorts"],
            "claimQueries": pops["claim_queries"], "attempts": pops["attempts"],
            "timerRechecks": pops["timer_rechecks"], "sharedRechecks": pops["shared_rechecks"],
            "woken": wakes["woken"], "wakesPassedOn": wakes["passed_on"]}


@bp.get("/api/v1/system/shared-state")
async def shared_state_route(request: Request):
    return json(await shared_state(request.app))
