"""Push, pop, ack, transaction and lease renewal (the data path)."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    INT,
    NSTR,
    STR,
    UUID,
    Schema,
    arr,
    error,
    obj,
    op,
    path,
    q_bool,
    q_int,
    query,
    ref,
)

TAG = "Messaging"

PUSH_ITEM = obj({
    "queue": {"type": "string", "minLength": 1, "maxLength": 255},
    "partition": {"type": "string", "minLength": 1, "maxLength": 255, "default": "Default"},
    "payload": ANY,
    "transactionId": {"type": "string", "description": "Deduplication key; generated if absent"},
    "traceId": {"type": "string"},
}, ["queue"])

PUSH_RESULT = obj({
    "index": INT, "status": {"type": "string",
                             "enum": ["queued", "duplicate", "buffered", "failed"]},
    "transaction_id": STR, "transactionId": STR, "message_id": STR, "partition_id": STR,
    "queueName": STR, "error": STR,
}, ["index", "status"])

POP_PARAMS = (
    query("consumerGroup", "Consumer group; absent: queue mode"),
    q_int("batch", "Messages to take (1-10000)"),
    q_bool("wait", "Long poll until a message arrives or `timeout` passes"),
    q_int("timeout", "Long-poll limit in milliseconds"),
    q_bool("autoAck", "Acknowledge on delivery"),
    query("subscriptionMode", "A new group's start: `new` (only later messages) or all"),
    query("subscriptionFrom", "A new group's start: `now` or an ISO-8601 timestamp"),
    q_bool("autopilot", "The broker sizes the omitted `batch` / `partitions` and echoes its "
                        "decision in `autopilot` (docs/wire-contract.md §5.8)"),
    q_bool("conflation", "Last-value delivery, the consumer group's policy on the queue "
                         "(stored at its first pop; needs `consumerGroup`, not with `autoAck`; "
                         "docs/wire-contract.md §5.8)"),
    q_bool("frames", "Messages found come as QPF1 frames, `application/x-queen-pop` "
                     "(docs/wire-contract.md §5.9); empty answers stay JSON"),
)

POP_ANSWER = obj({
    "success": BOOL, "messages": arr(ref("Message")), "leaseId": NSTR, "queue": NSTR,
    "partition": NSTR, "partitionId": NSTR, "consumerGroup": NSTR, "error": STR,
    "paused": BOOL, "windowBufferActive": BOOL, "partitionsClaimed": INT,
    "conflation": BOOL, "conflationConflict": BOOL,
    "autopilot": obj({"partitions": INT, "batch": INT, "waitMs": INT},
                     ["partitions", "batch", "waitMs"]),
}, ["messages"])

POP_OK = {"description": "Messages, or none (JSON); with `frames=true` and messages found, QPF1",
          "content": {"application/json": {"schema": POP_ANSWER},
                      "application/x-queen-pop": {"schema": {"type": "string",
                                                             "format": "binary"}}}}

PARTITION_REF: Schema = {"anyOf": [UUID, {"type": "string", "pattern": "^[0-9]{1,20}$",
                                          "description": "a framed pop's partition handle"}]}

ACK_ITEM = obj({
    "transactionId": {"type": "string", "minLength": 1},
    "partitionId": PARTITION_REF,
    "status": {"type": "string", "enum": ["completed", "success", "failed", "retry"],
               "default": "completed"},
    "error": STR, "leaseId": UUID,
}, ["transactionId", "partitionId"])

ACK_RESULT = obj({
    "index": INT, "transactionId": STR, "success": BOOL, "error": NSTR,
    "queueName": NSTR, "partitionName": NSTR, "leaseReleased": {"type": ["boolean", "null"]},
    "dlq": {"type": ["boolean", "null"]},
}, ["index", "transactionId", "success"])

POP_DESC = ("An answer with no message is 200 with an empty `messages` list "
            "(`success: false, error: no_available_partition`). Under pop maintenance "
            "the answer is `{\"messages\": [], \"paused\": true}`. A pop of a queue that "
            "does not exist answers the same 200 with `queueExists: false` added (clients "
            "read it as no message; the broker logs a warning).")

OPERATIONS = [
    op("POST", "/api/v1/push", tag=TAG, summary="Push messages",
       description="Stored (200), or all buffered in the spool because PostgreSQL is "
                   "unreachable or push maintenance is on (201). An empty `items` is 201 `[]`. "
                   "A queue with `maxSize`: the request's items of that queue are refused "
                   "together when they would take its depth past it (`status: failed`, "
                   "`error: Queue '<name>' would exceed max capacity (<max>). Current: "
                   "<depth>, Batch: <n>`); 409 when every item was refused.",
       body=obj({"items": arr(PUSH_ITEM)}, ["items"]), body_required=True,
       ok=arr(PUSH_RESULT),
       responses={201: {"description": "Everything buffered in the spool (or nothing sent)",
                        "content": {"application/json": {"schema": arr(PUSH_RESULT)}}},
                  409: error(409, "Every item refused: its queue's depth would pass maxSize "
                                  "(`code: max_size`)")}),
    op("GET", "/api/v1/pop/queue/<queue:str>/partition/<partition:str>", tag=TAG,
       summary="Pop from one partition", description=POP_DESC,
       params=(path("queue"), path("partition"), *POP_PARAMS), responses={200: POP_OK}),
    op("GET", "/api/v1/pop/queue/<queue:str>", tag=TAG, summary="Pop from any partition of a queue",
       description=POP_DESC,
       params=(path("queue"), q_int("partitions", "Partitions one pop may claim (1-1000)"),
               *POP_PARAMS), responses={200: POP_OK}),
    op("GET", "/api/v1/pop", tag=TAG, summary="Pop by namespace and/or task",
       description=POP_DESC + " At least one of `namespace` and `task` is required.",
       params=(query("namespace", "Queues of this namespace"), query("task", "Queues of this task"),
               q_int("partitions", "Partitions one pop may claim (1-1000)"), *POP_PARAMS),
       responses={200: POP_OK}),
    op("POST", "/api/v1/ack", tag=TAG, summary="Acknowledge one message",
       body={**ACK_ITEM, "properties": {**ACK_ITEM["properties"], "consumerGroup": STR}},
       body_required=True, ok=arr(ACK_RESULT, minItems=1, maxItems=1)),
    op("POST", "/api/v1/ack/batch", tag=TAG, summary="Acknowledge many messages",
       body=obj({"acknowledgments": arr(ACK_ITEM), "consumerGroup": STR}, ["acknowledgments"]),
       body_required=True, ok=arr(ACK_RESULT)),
    op("POST", "/api/v1/transaction", tag=TAG, summary="Pushes and acks in one transaction",
       description="All or nothing: a failed ack rolls everything back "
                   "(`success: false`, every result `rolled_back`).",
       body=obj({"operations": arr(obj({
           "type": {"type": "string", "enum": ["push", "ack"]},
           "items": arr(PUSH_ITEM), "transactionId": STR, "partitionId": PARTITION_REF,
           "status": STR, "consumerGroup": STR, "leaseId": UUID}, ["type"]), minItems=1),
           "requiredLeases": arr(UUID)}, ["operations"]),
       body_required=True,
       ok=obj({"transactionId": STR, "success": BOOL, "error": STR,
               "results": arr(obj({"index": INT, "type": STR, "success": BOOL}))},
              ["transactionId", "success", "results"])),
    op("POST", "/api/v1/lease/<lease_id:str>/extend", tag=TAG, summary="Renew a lease",
       params=(path("lease_id", "The lease id a pop answered", UUID),),
       body=obj({"seconds": {"type": "integer", "minimum": 1, "maximum": 86400,
                             "default": 60}}),
       ok=obj({"leaseId": STR, "success": BOOL, "error": NSTR, "expiresAt": NSTR,
               "newExpiresAt": NSTR, "renewed": INT},
              ["leaseId", "success", "renewed"])),
]
