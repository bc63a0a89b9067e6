"""Ephemeral (RAM-class) queues: the eight verbs of /api/v1/ephemeral/* (docs/ephemeral.md).
The rest of the family (any other path or method: 404 ``ephemeral_unsupported``) is
described in state.py."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    INT,
    MAP,
    STR,
    arr,
    error,
    obj,
    op,
    path,
    q_int,
    query,
)

TAG = "Ephemeral queues"


def _coded(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": obj(
                {"error": STR, "code": STR, "detail": STR}, ["error", "code"])}}}


OPTIONS = obj({"maxBytes": INT, "maxLength": INT,
               "policy": {"type": "string", "enum": ["reject", "drop_oldest"]},
               "ttlSeconds": INT, "leaseSeconds": INT, "retryLimit": INT,
               "windowBuffer": obj({"ms": INT, "count": INT})})
QUEUE_BODY = obj({"queue": STR}, ["queue"])
MESSAGE = obj({"id": STR, "partition": STR, "payload": ANY, "attempts": INT},
              ["id", "partition", "payload", "attempts"])
_QUEUE = (path("queue", "Ephemeral queue"),)

OPERATIONS = [
    op("POST", "/api/v1/ephemeral/configure", tag=TAG,
       summary="Declare an ephemeral queue and its bounds (stored in PostgreSQL)",
       description="Options given are merged over the stored ones (null: back to the "
                   "default); the answer shows every effective option. Unknown options: 400.",
       body=obj({"queue": STR, "options": OPTIONS}, ["queue"]), body_required=True,
       ok=obj({"queue": STR, "configured": BOOL, "options": OPTIONS},
              ["queue", "configured", "options"])),
    op("POST", "/api/v1/ephemeral/reset", tag=TAG,
       summary="Drop every message, void every lease, rewind every cursor",
       body=QUEUE_BODY, body_required=True, ok=obj({"queue": STR, "dropped": INT}, ["dropped"]),
       database=False),
    op("DELETE", "/api/v1/ephemeral/queue/<queue:str>", tag=TAG,
       summary="Delete an ephemeral queue: contents, cursors and declaration",
       params=_QUEUE, ok=obj({"queue": STR, "deleted": BOOL}, ["deleted"])),
    op("POST", "/api/v1/ephemeral/push", tag=TAG,
       summary="Push messages to an ephemeral queue (RAM only; all or nothing)",
       description="Partition omitted: `Default`. 429 `ephemeral_queue_full` (policy reject, "
                   "Retry-After), 503 `ephemeral_memory_full` (EPHEMERAL_MAX_BYTES), 413 "
                   "`ephemeral_push_too_large` (can never fit the queue's bounds).",
       body=obj({"queue": STR, "partition": STR,
                 "messages": arr(obj({"payload": ANY}))}, ["queue", "messages"]),
       body_required=True, ok=obj({"pushed": INT}, ["pushed"]),
       responses={429: _coded("The queue is full (policy reject); retry later"),
                  413: _coded("The push can never fit the queue's bounds"),
                  503: error(503, "`ephemeral_memory_full`: EPHEMERAL_MAX_BYTES is used up")},
       database=False),
    op("GET", "/api/v1/ephemeral/pop", tag=TAG,
       summary="Take messages (a long poll with wait=true); one lease per batch",
       params=(query("queue", "Ephemeral queue", required=True),
               query("partition", "Only this partition"), q_int("batch", "Most messages"),
               query("wait", "Long poll: true / false"),
               q_int("timeout", "Long-poll milliseconds"),
               query("group", "Consumer group (none: queue mode)"),
               query("autoAck", "Commit at delivery: no lease, nothing to ack")),
       ok=obj({"queue": STR, "messages": arr(MESSAGE)}, ["queue", "messages"]),
       database=False),
    op("POST", "/api/v1/ephemeral/ack", tag=TAG,
       summary="Acknowledge popped messages: completed, failed or retry",
       description="Outcome per id: acked, redelivered, stale (an id of a previous incarnation "
                   "of the broker or the ring), unknown.",
       body=obj({"queue": STR, "group": STR,
                 "acks": arr(obj({"id": STR, "status": STR, "error": STR}, ["id"]))},
                ["queue", "acks"]), body_required=True,
       ok=obj({"results": arr(obj({"id": STR, "outcome": STR, "dropped": BOOL},
                                  ["id", "outcome"]))}, ["results"]),
       database=False),
    op("GET", "/api/v1/ephemeral/queues", tag=TAG,
       summary="Every ephemeral queue of this broker, declared and implicit, with gauges",
       ok=obj({"queues": arr(MAP)}, ["queues"]), database=False),
    op("GET", "/api/v1/ephemeral/queues/<queue:str>/depth", tag=TAG,
       summary="Depth gauges of one ephemeral queue: per partition and per group",
       params=_QUEUE, ok=MAP,
       responses={404: _coded("`ephemeral_queue_not_found`: no such queue on this broker")},
       database=False),
]
