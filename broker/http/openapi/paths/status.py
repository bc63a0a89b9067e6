"""Dashboard status and analytics: time series and counters, as they are answered."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    FROM,
    INT,
    MAP,
    NSTR,
    STR,
    TO,
    arr,
    obj,
    op,
    path,
    q_int,
    query,
)
from broker.http.openapi.paths.streams import STREAM_QUERY

TAG = "Status and analytics"

SCOPE = (query("queue", "Only this queue"), query("namespace", "Only this namespace"),
         query("task", "Only this task"))
RANGE = (FROM, TO)
METRIC_FILTERS = (*RANGE, query("hostname", "Only this host"),
                  query("workerId", "Only this worker"),
                  q_int("limit", "At most this many points (1-50000)", 5000))
TIME_RANGE = obj({"from": STR, "to": STR}, ["from", "to"])
SERIES = obj({"timeRange": TIME_RANGE, "series": arr(MAP)}, ["timeRange", "series"])

OPERATIONS = [
    op("GET", "/api/v1/status", tag=TAG, summary="The dashboard's overview over a time range",
       params=(*SCOPE, *RANGE),
       ok=obj({"timeRange": TIME_RANGE, "bucketMinutes": INT, "pointCount": INT,
               "throughput": arr(MAP), "queues": ANY, "messages": MAP, "leases": MAP,
               "deadLetterQueue": MAP, "workers": arr(MAP), "errors": MAP, "statsAge": ANY},
              ["timeRange", "throughput", "messages"])),
    op("GET", "/api/v1/status/queues", tag=TAG, summary="Queues with their counts, paged",
       params=(*SCOPE, *RANGE, q_int("limit", "Page size (1-1000)", 100),
               q_int("offset", "Rows to skip", 0)),
       ok=obj({"queues": arr(MAP), "pagination": MAP}, ["queues", "pagination"])),
    op("GET", "/api/v1/status/queues/<queue:str>", tag=TAG,
       summary="One queue's configuration, totals and partitions", params=(path("queue"),),
       errors=(404,),
       ok=obj({"queue": MAP, "totals": MAP, "partitions": arr(MAP)},
              ["queue", "totals", "partitions"])),
    op("GET", "/api/v1/status/queues/<queue:str>/messages", tag=TAG,
       summary="A queue's newest messages",
       params=(path("queue"), q_int("limit", "Page size (1-1000)", 50),
               q_int("offset", "Rows to skip", 0)), errors=(404,),
       ok=arr(obj({"id": STR, "transactionId": STR, "partitionId": STR, "status": STR},
                  ["id", "transactionId", "status"]))),
    op("GET", "/api/v1/status/analytics", tag=TAG, summary="Ingested / processed / dead series",
       params=(*SCOPE, query("interval", "Bucket width", {"type": "string", "enum": [
           "minute", "hour", "day"]}), *RANGE),
       ok=obj({"interval": STR, "bucketMinutes": INT, "timeRange": TIME_RANGE,
               "filters": MAP, "timestamps": arr(STR), "dataPoints": arr(MAP), "totals": MAP},
              ["interval", "timestamps", "dataPoints", "totals"])),
    op("GET", "/api/v1/status/buffers", tag=TAG, summary="This broker's spool and flags",
       ok=obj({"fileBuffer": MAP, "maintenanceMode": BOOL, "popMaintenanceMode": BOOL,
               "serverId": STR, "messagesBuffered": INT},
              ["fileBuffer", "maintenanceMode", "popMaintenanceMode"])),
    op("GET", "/api/v1/analytics/system-metrics", tag=TAG,
       summary="The collector's system metrics", params=METRIC_FILTERS,
       ok=obj({"timeRange": MAP, "bucketMinutes": INT, "replicaCount": INT, "pointCount": INT,
               "replicas": arr(obj({"hostname": STR, "port": INT, "workerId": STR,
                                    "timeSeries": arr(MAP)}))},
              ["timeRange", "replicas"])),
    op("GET", "/api/v1/analytics/worker-metrics", tag=TAG,
       summary="The collector's worker metrics", params=METRIC_FILTERS,
       ok=obj({"timeRange": MAP, "bucketMinutes": INT}, ["timeRange"])),
    op("GET", "/api/v1/analytics/queue-lag", tag=TAG, summary="Current lag per queue and group",
       description="A top-level array of per-minute rows, newest first.",
       params=(query("queue", "Only this queue"), *RANGE),
       ok=arr(obj({"queueName": STR, "popCount": INT, "avgLagMs": INT, "maxLagMs": INT,
                   "bucketTime": STR}, ["queueName", "bucketTime"]))),
    op("GET", "/api/v1/analytics/queue-ops", tag=TAG, summary="Pushed / dead-lettered series",
       params=(query("queue", "Only this queue"), *RANGE),
       ok=obj({**SERIES["properties"], "bucketMinutes": INT}, ["timeRange", "series"])),
    op("GET", "/api/v1/analytics/retention", tag=TAG, summary="Retention deletions",
       params=(query("queue", "Only this queue"), *RANGE,
               q_int("limit", "At most this many rows (1-50000)", 5000)),
       ok=obj({**SERIES["properties"], "totals": MAP}, ["timeRange", "series", "totals"])),
    op("GET", "/api/v1/analytics/queue-parked-replicas", tag=TAG,
       summary="Long polls parked on this broker",
       ok=obj({"timestamp": STR, "replicas": arr(obj({"serverId": STR, "parked": INT}))},
              ["replicas"])),
    op("GET", "/api/v1/analytics/postgres-stats", tag=TAG,
       summary="PostgreSQL's own figures and the pool",
       ok=obj({"timestamp": STR, "database": STR, "databaseCache": MAP,
               "tableCache": arr(MAP), "indexCache": arr(MAP), "cacheSummary": MAP},
              ["timestamp", "database"])),
    op("GET", "/api/v1/status/streams", tag=TAG,
       summary="Streaming queries with their state sizes and committed cycles",
       description="Per query: `state` (rows, stored bytes of the values, partitions holding "
                   "state, newest write) and `cycles` (committed, partitions that committed "
                   "one, newest commit time, cluster-wide).",
       ok=obj({"queries": arr(STREAM_QUERY), "totals": obj({
           "queries": INT, "stateRows": INT, "stateBytes": INT, "cycles": INT})},
              ["queries", "totals"])),
    op("GET", "/api/v1/status/streams/<name:str>", tag=TAG,
       summary="One streaming query and its source partitions, largest state first",
       params=(path("name", "Query name"),
               q_int("limit", "At most this many partitions (1-1000)", 100)),
       errors=(404,),
       ok=obj({"query": STREAM_QUERY, "partitions": arr(obj({
           "partitionId": STR, "queue": STR, "partition": STR,
           "state": obj({"rows": INT, "bytes": INT, "lastUpdateAt": NSTR}),
           "cycles": obj({"committed": INT, "lastCycleAt": NSTR})},
           ["partitionId", "queue", "partition", "state", "cycles"]))},
              ["query", "partitions"])),
]
