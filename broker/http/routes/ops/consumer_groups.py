"""Consumer groups (docs/wire-contract.md §11): listing, lag, deletion, subscription rewrite,
seek; the work (and what a seek or a deletion wakes) is broker/service/consumer_groups.py's.
"""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.times import iso_milli, parse_timestamp
from broker.http.responses import args, error, json, read_json
from broker.http.routes.ops.common import plain
from broker.http.types import BrokerRequest
from broker.http.wire.common import body_object, q_bool, q_int
from broker.service import consumer_groups as service

bp = Blueprint("ops_consumer_groups")


@bp.get("/api/v1/consumer-groups")
async def list_groups(request: BrokerRequest):
    groups = await service.groups(request.app.ctx)
    return json([plain(g) for g in groups])


@bp.get("/api/v1/consumer-groups/lagging")
async def lagging(request: BrokerRequest):
    """Cursor rows whose oldest unconsumed message is older than minLagSeconds (3600)."""
    min_lag = q_int(args(request), "minLagSeconds", 3600, minimum=0)
    rows = await service.cursors(request.app.ctx, min_lag_seconds=float(min_lag))
    return json([{
        "consumer_group": r["consumer_group"], "queue_name": r["queue_name"],
        "partition_name": r["partition_name"], "partition_id": str(r["partition_id"]),
        "worker_id": str(r["lease_id"]) if r["lease_active"] and r["lease_id"] else None,
        "offset_lag": r["offset_lag"],
        "time_lag_seconds": round(r["time_lag_seconds"], 3),
        "lag_hours": round(r["time_lag_seconds"] / 3600, 2),
        "oldest_unconsumed_at": iso_milli(r["oldest_unconsumed_at"]),
        "last_consumed_at": iso_milli(r["last_consumed_at"]),
    } for r in rows])


@bp.get("/api/v1/consumer-groups/<group:str>", unquote=True)
async def get_group(request: BrokerRequest, group: str):
    """Per queue, the group's partitions; ``{}`` for a group without cursors."""
    rows = await service.cursors(request.app.ctx, group=group)
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["queue_name"], {"partitions": []})["partitions"].append({
            "partition": r["partition_name"], "partitionId": str(r["partition_id"]),
            "workerId": str(r["lease_id"]) if r["lease_active"] and r["lease_id"] else None,
            "lastConsumedAt": iso_milli(r["last_consumed_at"]),
            "totalConsumed": r["total_messages_consumed"],
            "batchesConsumed": r["total_batches_consumed"],
            "offsetLag": r["offset_lag"],
            "timeLagSeconds": round(r["time_lag_seconds"], 3),
            "leaseActive": r["lease_active"],
            "leaseExpiresAt": iso_milli(r["lease_expires_at"]) if r["lease_active"] else None,
            "cursor": r["cursor_seq"], "lastSeq": r["last_seq"],
        })
    return json(out)


async def _delete(request: BrokerRequest, group: str, queue: str | None):
    delete_metadata = q_bool(args(request), "deleteMetadata", True)
    gone, meta = await service.delete(request.app.ctx, group, queue, delete_metadata)
    body = {"success": True, "consumerGroup": group, "deletedPartitions": gone,
            "metadataDeleted": delete_metadata, "metadataRowsDeleted": meta}
    if queue is not None:
        body["queueName"] = queue
    return json(body)


@bp.delete("/api/v1/consumer-groups/<group:str>", unquote=True)
async def delete_group(request: BrokerRequest, group: str):
    return await _delete(request, group, None)


@bp.delete("/api/v1/consumer-groups/<group:str>/queues/<queue:str>", unquote=True)
async def delete_group_queue(request: BrokerRequest, group: str, queue: str):
    return await _delete(request, group, queue)


@bp.post("/api/v1/consumer-groups/<group:str>/subscription", unquote=True)
async def update_subscription(request: BrokerRequest, group: str):
    """Rewrite the group's stored subscription timestamp; cursors stay where they are."""
    raw = body_object(read_json(request)).get("subscriptionTimestamp")
    if raw is None or raw == "":
        raise BadRequest("Missing subscriptionTimestamp in request body")
    if not isinstance(raw, str):
        raise BadRequest("subscriptionTimestamp must be an ISO-8601 string")
    ts = parse_timestamp(raw, "subscriptionTimestamp")
    rows = await service.update_subscription(request.app.ctx, group, ts)
    return json({"success": True, "consumerGroup": group, "newTimestamp": iso_milli(ts),
                 "rowsUpdated": rows})


@bp.post("/api/v1/consumer-groups/<group:str>/queues/<queue:str>/seek", unquote=True)
async def seek(request: BrokerRequest, group: str, queue: str):
    body = body_object(read_json(request))
    to_end = body.get("toEnd")
    raw_ts = body.get("timestamp")
    if to_end is not None and not isinstance(to_end, bool):
        raise BadRequest("toEnd must be a boolean")
    if to_end is not True and raw_ts in (None, ""):
        raise BadRequest("Must specify either 'toEnd': true or 'timestamp'")
    ts = None
    if to_end is not True:
        if not isinstance(raw_ts, str):
            raise BadRequest("timestamp must be an ISO-8601 string")
        ts = parse_timestamp(raw_ts, "timestamp")
    rows = await service.seek(request.app.ctx, group, queue, to_end is True, ts)
    if rows is None:
        return error("Queue not found", 404)
    return json({"success": True, "consumerGroup": group, "queueName": queue,
                 "seekToEnd": to_end is True, "targetTimestamp": iso_milli(ts),
                 "partitionsUpdated": len(rows),
                 "partitions": [{"partition": r["partition_name"], "from": r["old_seq"],
                                 "to": r["seq"]} for r in rows]})


@bp.post("/api/v1/consumer-groups/<group:str>/queues/<queue:str>/partitions/<partition:str>/seek",
         unquote=True)
async def seek_partition(request: BrokerRequest, group: str, queue: str, partition: str):
    """Move the group's cursor on one partition to its newest message (creating the
    cursor row when the group has none there), releasing the lease."""
    row = await service.seek_partition(request.app.ctx, group, queue, partition)
    if row is None:
        return json({"success": False, "error": "Partition not found"}, status=404)
    return json({"success": True, "consumerGroup": group, "queueName": queue,
                 "partitionName": partition, "updated": True,
                 "cursorMovedTo": {"seq": row["cursor_seq"],
                                   "messageId": plain(row["last_consumed_id"]),
                                   "createdAt": iso_milli(row["last_consumed_created_at"])}})
