"""Message traces: record from consumers, read by message and by name."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    FROM,
    INT,
    MAP,
    NINT,
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

TAG = "Traces"

TRACE = obj({"id": STR, "message_id": STR, "partition_id": STR, "transaction_id": STR,
             "consumer_group": STR, "event_type": STR, "trace_names": arr(STR), "data": ANY,
             "worker_id": STR, "created_at": STR, "queue_name": STR, "partition_name": STR,
             "message_payload": ANY},
            ["id", "transaction_id", "event_type", "trace_names", "created_at"])
"""A trace event: snake_case, as Queen's own tools read it."""

BY_NAME = obj({"traceName": STR, "traces": arr(TRACE), "total": INT, "pagination": MAP},
              ["traceName", "traces", "total"])
BY_NAME_PARAMS = (FROM, TO, q_int("limit", "Page size (1-1000)", 100),
                  q_int("offset", "Rows to skip", 0))

OPERATIONS = [
    op("POST", "/api/v1/traces", tag=TAG, summary="Record a trace event on a message",
       body=obj({"transactionId": {"type": "string", "minLength": 1}, "partitionId": UUID,
                 "data": ANY, "consumerGroup": STR, "eventType": STR,
                 "traceNames": {"anyOf": [STR, arr(STR), {"type": "null"}]}},
                ["transactionId", "partitionId", "data"]), body_required=True,
       ok=obj({"success": BOOL, "traceId": STR}, ["success", "traceId"]), ok_status=201,
       responses={404: {"description": "No such message",
                        "content": {"application/json": {"schema": obj(
                            {"success": BOOL, "error": STR}, ["success", "error"])}}}}),
    op("GET", "/api/v1/traces/names", tag=TAG, summary="Trace names with their counts",
       params=(query("search", "Only names containing this"),
               q_int("limit", "Page size (1-1000)", 50), q_int("offset", "Rows to skip", 0)),
       ok=obj({"trace_names": arr(obj({"trace_name": STR, "trace_count": INT,
                                       "message_count": INT, "last_seen": STR})),
               "total": NINT, "pagination": MAP}, ["trace_names"])),
    op("GET", "/api/v1/traces/by-name/<name:str>", tag=TAG, summary="Traces carrying a name",
       description="A name containing `/` may be sent unencoded.",
       params=(path("name", "Trace name"), *BY_NAME_PARAMS), ok=BY_NAME),
    op("GET", "/api/v1/traces/<partition_id:str>/<transaction_id:str>", tag=TAG,
       summary="The traces of one message",
       params=(path("partition_id", "Partition id", UUID),
               path("transaction_id", "The message's transactionId")), errors=(404,),
       ok=obj({"partitionId": STR, "transactionId": STR, "traces": arr(TRACE), "count": INT},
              ["traces", "count"])),
]
