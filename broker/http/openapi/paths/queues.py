"""Queue configuration and the resource listings (queues, namespaces, tasks, partitions)."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    INT,
    MAP,
    NSTR,
    NTIME,
    STR,
    arr,
    obj,
    op,
    path,
    q_int,
    query,
)
from broker.service.queues import QUEUE_OPTIONS

TAG = "Queues"

OPTIONS = obj({name: {"type": "boolean"} if typ == "boolean" else {"type": "integer"}
               for name, _col, typ, _default in QUEUE_OPTIONS})

COUNTS = obj({k: INT for k in ("total", "pending", "processing", "completed", "deadLetter")})

QUEUE_ROW = obj({"id": STR, "name": STR, "namespace": NSTR, "task": NSTR, "priority": INT,
                 "createdAt": NTIME, "partitions": INT, "messages": COUNTS},
                ["id", "name", "messages"])

OPERATIONS = [
    op("POST", "/api/v1/configure", tag=TAG, summary="Create or configure a queue",
       description="Options left out keep their value (a new queue takes the default). "
                   "A value of the wrong type or range is a 400 naming the option. "
                   "`applied` lists the options sent that take effect; `ignored` the ones "
                   "accepted but not acted on (an unknown name, or a value asking for what "
                   "this broker does not do, e.g. `priority` other than 0, `ttl`, "
                   "`deadLetterQueue: false`), each with a line in `warnings`.",
       body=obj({"queue": {"type": "string", "minLength": 1, "maxLength": 255},
                 "namespace": STR, "task": STR, "options": OPTIONS}, ["queue"]),
       body_required=True,
       ok=obj({"configured": BOOL, "queueId": STR, "partitionId": STR, "queue": STR,
               "namespace": NSTR, "task": NSTR, "options": OPTIONS,
               "applied": arr(STR), "ignored": arr(STR), "warnings": arr(STR)},
              ["configured", "queue", "options", "applied", "ignored", "warnings"])),
    op("GET", "/api/v1/resources/queues", tag=TAG, summary="List queues with message counts",
       ok=obj({"queues": arr(QUEUE_ROW)}, ["queues"])),
    op("GET", "/api/v1/resources/queues/<queue:str>", tag=TAG, summary="One queue, per partition",
       params=(path("queue"),), errors=(404,),
       ok=obj({"id": STR, "name": STR, "namespace": NSTR, "task": NSTR, "createdAt": NTIME,
               "options": OPTIONS, "partitions": arr(obj({
                   "id": STR, "name": STR, "createdAt": NTIME, "stats": MAP,
                   "oldestMessage": NTIME, "newestMessage": NTIME})),
               "totals": MAP}, ["id", "name", "partitions", "totals"])),
    op("DELETE", "/api/v1/resources/queues/<queue:str>", tag=TAG,
       summary="Delete a queue with its messages", params=(path("queue"),),
       ok=obj({"deleted": BOOL, "queue": STR, "existed": BOOL}, ["deleted", "queue", "existed"])),
    op("GET", "/api/v1/resources/queues/<queue:str>/depth", tag=TAG,
       summary="Backlog per partition after a group's cursor",
       params=(path("queue"), query("group", "Consumer group (default: the effective cursor)")),
       errors=(404,),
       ok=obj({"queue": STR, "group": NSTR, "pending": INT, "partitionsPending": INT,
               "conflation": BOOL, "effectivePending": INT,
               "partitions": arr(obj({"partition": STR, "pending": INT}))},
              ["queue", "pending", "partitions"])),
    op("GET", "/api/v1/resources/namespaces", tag=TAG, summary="Namespaces and their counts",
       ok=obj({"namespaces": arr(obj({"namespace": STR, "queues": INT, "partitions": INT,
                                      "messages": COUNTS})), "statsAge": ANY},
              ["namespaces"])),
    op("GET", "/api/v1/resources/tasks", tag=TAG, summary="Tasks and their counts",
       ok=obj({"tasks": arr(obj({"task": STR, "queues": INT, "partitions": INT,
                                 "messages": COUNTS})), "statsAge": ANY}, ["tasks"])),
    op("GET", "/api/v1/resources/overview", tag=TAG, summary="Counts across every queue",
       ok=obj({"queues": INT, "partitions": INT, "namespaces": INT, "tasks": INT,
               "messages": COUNTS, "lag": ANY, "throughput": MAP, "timestamp": STR,
               "statsAge": ANY}, ["queues", "partitions", "messages"])),
    op("GET", "/api/v1/resources/partitions", tag=TAG, summary="Partitions, deepest first",
       params=(query("queue", "Only this queue"), q_int("minDepth", "Only at least this deep", 0),
               q_int("limit", "Page size", 1000), q_int("offset", "Rows to skip", 0)),
       ok=obj({"partitions": arr(obj({"id": STR, "name": STR, "queue": STR, "depth": INT})),
               "pagination": MAP}, ["partitions", "pagination"])),
]
