"""Message browsing for operators (docs/wire-contract.md §13): list, detail, delete."""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.times import iso_milli
from broker.http.responses import args, json
from broker.http.routes.ops.common import path_uuid, time_range
from broker.http.types import BrokerRequest
from broker.http.wire.common import MAX_NAME, q_int, q_str
from broker.service import messages as service

bp = Blueprint("ops_messages")

STATUSES = ("pending", "processing", "completed", "dead_letter")


def mode_of(has_queue_mode: bool, bus_groups: int) -> dict:
    kind = ("hybrid" if has_queue_mode and bus_groups else "queue" if has_queue_mode
            else "bus" if bus_groups else "none")
    return {"hasQueueMode": has_queue_mode, "busGroupsCount": bus_groups, "type": kind}


def _filter(a, name: str) -> str | None:
    value = q_str(a, name)
    if value is not None and len(value) > MAX_NAME:
        raise BadRequest(f"{name} must be at most {MAX_NAME} characters")
    return value


@bp.get("/api/v1/messages")
async def list_messages(request: BrokerRequest):
    a = args(request)
    status = q_str(a, "status")
    if status is not None and status not in STATUSES:
        raise BadRequest(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    since, until = time_range(a, round_to_minute=True)
    limit = q_int(a, "limit", 200, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    rows, mode = await service.page(
        request.app.ctx, queue=_filter(a, "queue"), partition=_filter(a, "partition"),
        namespace=_filter(a, "ns") or _filter(a, "namespace"), task=_filter(a, "task"),
        since=since, until=until, status=status, limit=limit, offset=offset)
    return json({
        "messages": [{
            "id": str(r["id"]), "transactionId": r["transaction_id"],
            "partitionId": str(r["partition_id"]),
            "queuePath": f"{r['queue_name']}/{r['partition']}",
            "queue": r["queue_name"], "partition": r["partition"],
            "namespace": r["namespace"], "task": r["task"],
            "status": r["status"], "queueStatus": r["queue_status"],
            "busStatus": {"consumedBy": r["consumed_by"], "totalGroups": r["bus_groups"]},
            "traceId": str(r["trace_id"]) if r["trace_id"] else None,
            "producerSub": r["producer_sub"], "queuePriority": r["priority"],
            "createdAt": iso_milli(r["created_at"]),
            "leaseExpiresAt": iso_milli(r["lease_expires_at"]),
        } for r in rows],
        "mode": mode_of(mode["has_queue_mode"], mode["bus_groups"]),
        "pagination": {"limit": limit, "offset": offset},
        "timeRange": {"from": iso_milli(since), "to": iso_milli(until)},
    })


@bp.get("/api/v1/messages/<partition_id:str>/<transaction_id:str>", unquote=True)
async def get_message(request: BrokerRequest, partition_id: str, transaction_id: str):
    path_uuid(partition_id, "partitionId")
    found = await service.detail(request.app.ctx, partition_id, transaction_id)
    if found is None:
        return json({"error": "Message not found"}, status=404)
    msg, st, payload, dead = found.message, found.status, found.payload, found.dead
    last_dead = dead[0] if dead else None
    return json({
        "id": str(msg["id"]), "transactionId": msg["transaction_id"],
        "partitionId": str(msg["partition_id"]),
        "queuePath": f"{msg['queue_name']}/{msg['partition']}",
        "queue": msg["queue_name"], "partition": msg["partition"],
        "namespace": msg["namespace"], "task": msg["task"],
        "status": st["status"], "queueStatus": st["queueStatus"],
        "payload": payload, "isEncrypted": msg["is_encrypted"],
        "traceId": str(msg["trace_id"]) if msg["trace_id"] else None,
        "producerSub": msg["producer_sub"], "createdAt": iso_milli(msg["created_at"]),
        "position": msg["seq"],
        "errorMessage": last_dead["error_message"] if last_dead else None,
        "retryCount": last_dead["retry_count"] if last_dead else 0,
        "leaseExpiresAt": iso_milli(st["leaseExpiresAt"]),
        "queueConfig": {"leaseTime": msg["lease_time"], "retryLimit": msg["retry_limit"],
                        "retryDelay": msg["retry_delay"], "ttl": msg["ttl"],
                        "priority": msg["priority"]},
        "mode": {**mode_of(st["hasQueueMode"], st["busGroups"]),
                 "consumedByGroups": st["consumedBy"]},
        "consumerGroups": [{"name": g["name"], "consumed": g["consumed"],
                            "leaseExpiresAt": iso_milli(g["leaseExpiresAt"])}
                           for g in st["groups"]],
        "deadLetters": [{"consumerGroup": d["consumer_group"], "errorMessage": d["error_message"],
                         "retryCount": d["retry_count"], "failedAt": iso_milli(d["failed_at"])}
                        for d in dead],
    })


@bp.delete("/api/v1/messages/<partition_id:str>/<transaction_id:str>", unquote=True)
async def delete_message(request: BrokerRequest, partition_id: str, transaction_id: str):
    """Delete one message; its dead letters and traces go with it (cascade)."""
    path_uuid(partition_id, "partitionId")
    deleted = await service.delete(request.app.ctx, partition_id, transaction_id)
    body = {"success": deleted, "partitionId": partition_id, "transactionId": transaction_id,
            "message": "Message deleted successfully" if deleted else "Message not found"}
    if not deleted:
        body["error"] = "Message not found"
    return json(body, status=200 if deleted else 404)


MOVE_REFUSED = {
    "not_found": (404, "Message not found"),
    "consumed": (409, "Message already consumed in queue mode (or already dead-lettered)"),
    "leased": (409, "Message is leased to a consumer right now"),
    "not_next": (409, "Only the oldest unread message of a partition can be moved to the DLQ "
                      "(queue mode reads a partition in order)"),
}


@bp.post("/api/v1/messages/<partition_id:str>/<transaction_id:str>/dlq", unquote=True)
async def move_to_dlq(request: BrokerRequest, partition_id: str, transaction_id: str):
    """Dead-letter a message for queue mode (no body needed)."""
    path_uuid(partition_id, "partitionId")
    outcome = await service.move_to_dlq(request.app.ctx, partition_id, transaction_id,
                                        "Manually moved to DLQ")
    if outcome == "moved":
        return json({"movedToDLQ": True, "partitionId": partition_id,
                     "transactionId": transaction_id})
    status, message = MOVE_REFUSED[outcome]
    return json({"movedToDLQ": False, "error": message, "partitionId": partition_id,
                 "transactionId": transaction_id}, status=status)
