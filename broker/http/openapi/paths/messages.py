"""Message browsing, dead letters and their retry."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    FROM,
    INT,
    MAP,
    NSTR,
    NTIME,
    STR,
    TO,
    UUID,
    arr,
    obj,
    op,
    path,
    q_int,
    query,
)

TAG = "Messages and dead letters"

MESSAGE_KEY = (path("partition_id", "Partition id", UUID),
               path("transaction_id", "The message's transactionId"))

DEAD_LETTER = obj({"id": STR, "transactionId": STR, "partitionId": STR, "queue": STR,
                   "partition": STR, "consumerGroup": NSTR, "errorMessage": NSTR,
                   "retryCount": INT, "data": ANY, "producerSub": NSTR, "createdAt": NTIME,
                   "failedAt": NTIME}, ["transactionId", "partitionId", "queue"])

OPERATIONS = [
    op("GET", "/api/v1/messages", tag=TAG, summary="List messages",
       params=(query("queue", "Only this queue"), query("partition", "Only this partition"),
               query("namespace", "Only this namespace (alias `ns`)"), query("ns", "Alias of namespace"),
               query("task", "Only this task"),
               query("status", "Only this status", {"type": "string", "enum": [
                   "pending", "processing", "completed", "dead_letter"]}),
               FROM, TO, q_int("limit", "Page size (1-1000)", 200),
               q_int("offset", "Rows to skip", 0)),
       ok=obj({"messages": arr(obj({"id": STR, "transactionId": STR, "partitionId": STR,
                                    "queue": STR, "partition": STR, "status": STR})),
               "mode": MAP, "pagination": MAP, "timeRange": MAP},
              ["messages", "pagination"])),
    op("GET", "/api/v1/messages/<partition_id:str>/<transaction_id:str>", tag=TAG,
       summary="One message with its payload, groups and dead letters",
       params=MESSAGE_KEY, errors=(404,),
       ok=obj({"id": STR, "transactionId": STR, "partitionId": STR, "queue": STR,
               "partition": STR, "status": STR, "payload": ANY, "position": INT,
               "consumerGroups": arr(MAP), "deadLetters": arr(MAP)},
              ["id", "transactionId", "partitionId", "queue", "status"])),
    op("DELETE", "/api/v1/messages/<partition_id:str>/<transaction_id:str>", tag=TAG,
       summary="Delete one message (its dead letters and traces go with it)",
       params=MESSAGE_KEY,
       ok=obj({"success": BOOL, "partitionId": STR, "transactionId": STR, "message": STR},
              ["success"]),
       responses={404: {"description": "No such message",
                        "content": {"application/json": {"schema": obj(
                            {"success": BOOL, "error": STR}, ["success", "error"])}}}}),
    op("GET", "/api/v1/dlq", tag=TAG, summary="Dead-lettered messages",
       params=(query("queue", "Only this queue"), query("partition", "Only this partition"),
               query("consumerGroup", "Only this group"), FROM, TO,
               q_int("limit", "Page size (1-1000)", 100), q_int("offset", "Rows to skip", 0)),
       ok=obj({"messages": arr(DEAD_LETTER), "total": INT, "pagination": MAP},
              ["messages", "total"])),
    op("POST", "/api/v1/messages/<partition_id:str>/<transaction_id:str>/retry", tag=TAG,
       summary="Re-enqueue a dead-lettered message",
       description="Its dead-letter rows go, and a copy with a derived transactionId is pushed "
                   "to the same partition.",
       params=MESSAGE_KEY, errors=(404,),
       ok=obj({"retried": BOOL, "transactionId": STR, "consumerGroup": NSTR,
               "consumerGroups": arr(NSTR), "newTransactionId": STR, "messageId": STR},
              ["retried", "newTransactionId"])),
    op("POST", "/api/v1/messages/<partition_id:str>/<transaction_id:str>/dlq", tag=TAG,
       summary="Move a message to the dead-letter queue (queue mode)",
       description="Only the oldest unread message of a partition, not leased right now.",
       params=MESSAGE_KEY, errors=(404, 409),
       ok=obj({"movedToDLQ": BOOL, "partitionId": STR, "transactionId": STR},
              ["movedToDLQ"])),
]
