"""Consumer groups: listing, lag, deletion, subscription rewrite, seek."""
from __future__ import annotations

from broker.http.openapi.builder import (
    BOOL,
    INT,
    MAP,
    NINT,
    NSTR,
    NTIME,
    NUM,
    STR,
    arr,
    obj,
    op,
    path,
    q_bool,
    q_int,
)

TAG = "Consumer groups"

GROUP = path("group", "Consumer group name")
QUEUE = path("queue", "Queue name")
DELETE_META = q_bool("deleteMetadata", "Also forget the group's stored subscription (default true)")
DELETED = obj({"success": BOOL, "consumerGroup": STR, "deletedPartitions": INT,
               "metadataDeleted": BOOL, "metadataRowsDeleted": INT, "queueName": STR},
              ["success", "consumerGroup", "deletedPartitions"])
SEEK_BODY = obj({"toEnd": BOOL, "timestamp": {"type": "string", "format": "date-time"}},
                description="Either `toEnd: true` or an ISO-8601 `timestamp`")

OPERATIONS = [
    op("GET", "/api/v1/consumer-groups", tag=TAG, summary="Every consumer group with its lag",
       ok=arr(obj({"name": STR, "queueName": STR, "members": INT, "partitionsWithLag": INT,
                   "totalLag": INT, "maxTimeLag": NUM, "activeLeases": INT,
                   "state": {"type": "string", "enum": ["Dead", "Lagging", "Stable"]},
                   "subscriptionMode": NSTR, "subscriptionTimestamp": NTIME},
                  ["name", "queueName", "totalLag", "state"]))),
    op("GET", "/api/v1/consumer-groups/lagging", tag=TAG,
       summary="Cursors whose oldest unconsumed message is older than minLagSeconds",
       params=(q_int("minLagSeconds", "Threshold in seconds", 3600),),
       ok=arr(obj({"consumer_group": STR, "queue_name": STR, "partition_name": STR,
                   "partition_id": STR, "worker_id": NSTR, "offset_lag": INT,
                   "time_lag_seconds": NUM, "lag_hours": NUM, "oldest_unconsumed_at": NTIME,
                   "last_consumed_at": NTIME},
                  ["consumer_group", "queue_name", "partition_name", "offset_lag"]))),
    op("GET", "/api/v1/consumer-groups/<group:str>", tag=TAG,
       summary="A group's partitions per queue (`{}` for an unknown group)", params=(GROUP,),
       ok=obj(additionalProperties=obj({"partitions": arr(obj({
           "partition": STR, "partitionId": STR, "workerId": NSTR, "offsetLag": INT,
           "timeLagSeconds": NUM, "leaseActive": BOOL, "cursor": NINT, "lastSeq": NINT,
           "lastConsumedAt": NTIME, "leaseExpiresAt": NTIME}))}, ["partitions"]))),
    op("DELETE", "/api/v1/consumer-groups/<group:str>", tag=TAG,
       summary="Delete a group's cursors on every queue", params=(GROUP, DELETE_META),
       ok=DELETED),
    op("DELETE", "/api/v1/consumer-groups/<group:str>/queues/<queue:str>", tag=TAG,
       summary="Delete a group's cursors on one queue", params=(GROUP, QUEUE, DELETE_META),
       ok=DELETED),
    op("POST", "/api/v1/consumer-groups/<group:str>/subscription", tag=TAG,
       summary="Rewrite the group's stored subscription timestamp (cursors stay)",
       params=(GROUP,),
       body=obj({"subscriptionTimestamp": {"type": "string", "format": "date-time"}},
                ["subscriptionTimestamp"]), body_required=True,
       ok=obj({"success": BOOL, "consumerGroup": STR, "newTimestamp": NTIME, "rowsUpdated": INT},
              ["success", "rowsUpdated"])),
    op("POST", "/api/v1/consumer-groups/<group:str>/queues/<queue:str>/seek", tag=TAG,
       summary="Move the group's cursors on a queue to the end or to a time",
       params=(GROUP, QUEUE), body=SEEK_BODY, body_required=True, errors=(404,),
       ok=obj({"success": BOOL, "consumerGroup": STR, "queueName": STR, "seekToEnd": BOOL,
               "targetTimestamp": NTIME, "partitionsUpdated": INT,
               "partitions": arr(obj({"partition": STR, "from": NINT, "to": NINT}))},
              ["success", "partitionsUpdated", "partitions"])),
    op("POST", "/api/v1/consumer-groups/<group:str>/queues/<queue:str>/partitions/"
               "<partition:str>/seek", tag=TAG,
       summary="Move the group's cursor on one partition to its newest message",
       params=(GROUP, QUEUE, path("partition", "Partition name")),
       ok=obj({"success": BOOL, "consumerGroup": STR, "queueName": STR, "partitionName": STR,
               "updated": BOOL, "cursorMovedTo": MAP}, ["success"]),
       responses={404: {"description": "No such partition",
                        "content": {"application/json": {"schema": obj(
                            {"success": BOOL, "error": STR}, ["success", "error"])}}}}),
]
