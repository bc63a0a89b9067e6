"""Health, metrics, maintenance modes, shared state, background jobs, the spool's
quarantine, the cluster's spool holds, and this reference itself."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    INT,
    MAP,
    NSTR,
    NTIME,
    NUM,
    STR,
    answer,
    arr,
    nullable,
    obj,
    op,
    path,
)

TAG = "System"
QTAG = "Spool quarantine"
STAG = "Spool holds"

ENABLED = obj({"enabled": BOOL}, ["enabled"])
QUARANTINE_ID = path("ident", "Quarantine entry id",
                     {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$"})
Q_ENTRY = obj({"id": STR, "reason": NSTR, "error": NSTR, "quarantinedAt": ANY,
               "originFile": NSTR, "index": ANY, "queue": NSTR, "partition": NSTR,
               "transactionId": NSTR}, ["id"])
SPOOL_HOLD = obj({"spool": STR, "partitions": INT, "oldestAcceptedAt": STR,
                  "lastHeartbeat": NTIME, "silentSeconds": nullable(NUM), "silent": BOOL},
                 ["spool", "partitions", "lastHeartbeat", "silent"])
SPOOL_HOLDS = obj({
    "boundMs": {**INT, "description": "FILE_BUFFER_ORDER_WAIT_MS: a spool silent this long "
                                      "no longer holds back a broker that has beaten this long"},
    "forgetMs": {**INT, "description": "FILE_BUFFER_ORDER_FORGET_MS: a spool silent this long "
                                       "has its holds removed by the retention job (0: never)"},
    "silentSpools": INT,
    "silentHeldPartitions": {**INT, "description": "Distinct partitions held by silent spools"},
    "spools": arr(SPOOL_HOLD),
    "ended": obj({"expired": INT, "released": INT}, ["expired", "released"])},
    ["boundMs", "forgetMs", "silentSpools", "silentHeldPartitions", "spools", "ended"])
HEALTH = obj({"status": {"type": "string", "enum": ["healthy", "unhealthy"]},
              "database": {"type": "string", "enum": ["connected", "disconnected"]},
              "server": STR, "version": STR, "brokerVersion": STR, "shared_state": MAP, "spool": MAP,
              "spoolHolds": nullable(SPOOL_HOLDS)},
             ["status", "database", "server"])
LIVE = obj({"status": {"type": "string", "enum": ["live", "stuck"]},
            "loopLagMs": {**NUM, "description": "The event loop's worst lag in the last 10 s "
                                                "(or the time since it last measured)"},
            "maxLoopLagMs": {**INT, "description": "HEALTH_LIVE_MAX_LAG_MS"}},
           ["status", "loopLagMs", "maxLoopLagMs"])
READY = obj({"status": {"type": "string", "enum": ["ready", "unready"]},
             "database": {"type": "string", "enum": ["up", "down", "unknown"]},
             "reason": {"type": "string", "enum": ["stopping", "spool_full", "spool_failing"]},
             "spool": obj({"healthy": BOOL, "pendingBytes": INT, "maxBytes": INT, "full": BOOL},
                          ["healthy", "pendingBytes", "maxBytes", "full"])},
            ["status", "database"])
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

OPERATIONS = [
    op("GET", "/health", tag=TAG, summary="Liveness and the database's reachability",
       public=True, database=False, ok=HEALTH,
       responses={503: {**answer(HEALTH, "The database is unreachable")}}),
    op("GET", "/health/live", tag=TAG, summary="Liveness: the event loop is not stuck",
       description="For a process supervisor (a container's health check, Kubernetes' "
                   "livenessProbe): 503 when the event loop woke later than "
                   "HEALTH_LIVE_MAX_LAG_MS in the last 10 s. PostgreSQL plays no part.",
       public=True, database=False, ok=LIVE,
       responses={503: {**answer(LIVE, "The event loop was stuck")}}),
    op("GET", "/health/ready", tag=TAG, summary="Readiness: this broker can take traffic",
       description="For a load balancer (haproxy's httpchk, Kubernetes' readinessProbe): "
                   "200 while PostgreSQL is reachable, or while it is not but the spool "
                   "takes pushes with room left; 503 when the spool is failing or past "
                   "HEALTH_READY_SPOOL_MAX_PERCENT of its cap while PostgreSQL is away, "
                   "and from the start of a graceful stop.",
       public=True, database=False, ok=READY,
       responses={503: {**answer(READY, "Not ready: stopping, spool_full or "
                                        "spool_failing (in `reason`)")}}),
    op("GET", "/metrics", tag=TAG, summary="Process and queue figures (JSON)",
       description="A client whose Accept asks for `text/plain` or OpenMetrics gets the "
                   "Prometheus text of `/metrics/prometheus`.",
       public=True, database=False,
       responses={200: {"description": "OK", "content": {
           "application/json": {"schema": obj({"uptime": ANY, "requests": MAP, "messages": MAP,
                                               "database": MAP, "spool": MAP,
                                               "queues": nullable(ANY)},
                                              ["uptime", "requests", "messages"])},
           PROMETHEUS: {"schema": STR}}}}),
    op("GET", "/metrics/prometheus", tag=TAG, summary="Prometheus text format",
       public=True, database=False, ok=STR, ok_description="Prometheus exposition text",
       responses={200: answer(STR, "Prometheus exposition text", PROMETHEUS)}),
    op("GET", "/api/v1/system/maintenance", tag=TAG,
       summary="Both maintenance flags, the spool and the cluster's spool backlog",
       ok=obj({"maintenanceMode": BOOL, "popMaintenanceMode": BOOL, "bufferedMessages": INT,
               "bufferHealthy": BOOL, "quarantinedEvents": INT, "orderExceptions": INT,
               "staging": MAP, "bufferStats": MAP, "clusterBacklog": nullable(arr(MAP))},
              ["maintenanceMode", "popMaintenanceMode", "bufferedMessages"])),
    op("POST", "/api/v1/system/maintenance", tag=TAG,
       summary="Push maintenance on/off (pushes go to the spool while on)",
       body=ENABLED, body_required=True,
       ok=obj({"maintenanceMode": BOOL, "bufferedMessages": INT, "bufferHealthy": BOOL,
               "message": STR}, ["maintenanceMode"])),
    op("GET", "/api/v1/system/maintenance/pop", tag=TAG, summary="The pop maintenance flag",
       ok=obj({"popMaintenanceMode": BOOL, "message": STR}, ["popMaintenanceMode"])),
    op("POST", "/api/v1/system/maintenance/pop", tag=TAG,
       summary="Pop maintenance on/off (pops answer empty while on)",
       body=ENABLED, body_required=True,
       ok=obj({"popMaintenanceMode": BOOL, "message": STR}, ["popMaintenanceMode"])),
    op("GET", "/api/v1/system/shared-state", tag=TAG,
       summary="This broker's view of the cluster: mesh peers, caches, flags",
       database=False,
       ok=obj({"enabled": BOOL, "running": BOOL, "server_id": STR,
               "transport": nullable(MAP), "server_health": MAP, "maintenance_mode": BOOL,
               "pop_maintenance_mode": BOOL, "parkedPops": INT},
              ["enabled", "running", "server_id", "transport"])),
    op("POST", "/api/v1/stats/refresh", tag=TAG, summary="Run a stats cycle now",
       body=obj({"full": {"type": "boolean", "description": "Recount every partition"}}),
       ok=obj({"success": BOOL, "skipped": BOOL, "durationMs": ANY}, ["success", "skipped"]),
       responses={500: answer(obj({"success": BOOL, "error": STR}, ["success", "error"]),
                              "The cycle failed (its error is in the body)")}),
    op("GET", "/api/v1/system/jobs", tag=TAG, summary="The background jobs' counters",
       database=False, ok=obj(additionalProperties=MAP)),
    op("POST", "/api/v1/system/jobs/<name:str>/run", tag=TAG, summary="Run one cycle of a job",
       params=(path("name", "Job name", {"type": "string",
                                         "enum": ["retention", "stats", "metrics"]}),),
       errors=(404,), ok=MAP),
    op("GET", "/api/v1/system/spool/quarantine", tag=QTAG,
       summary="Spooled pushes the replay could not commit (node-local)", database=False,
       ok=obj({"count": INT, "entries": arr(Q_ENTRY)}, ["count", "entries"])),
    op("GET", "/api/v1/system/spool/quarantine/<ident>", tag=QTAG,
       summary="One quarantined entry, with its event", params=(QUARANTINE_ID,),
       database=False, errors=(404,), ok=obj({"id": STR, "event": ANY}, ["id"])),
    op("POST", "/api/v1/system/spool/quarantine/<ident>/replay", tag=QTAG,
       summary="Push a quarantined event now, optionally to another queue/partition",
       params=(QUARANTINE_ID,), body=obj({"queue": STR, "partition": STR}),
       errors=(404, 409),
       ok=obj({"id": STR, "status": STR, "queue": NSTR, "partition": NSTR,
               "transactionId": NSTR}, ["id", "status"])),
    op("DELETE", "/api/v1/system/spool/quarantine/<ident>", tag=QTAG,
       summary="Discard a quarantined event", params=(QUARANTINE_ID,), database=False,
       errors=(404,), ok=obj({"id": STR, "discarded": BOOL}, ["id", "discarded"])),
    op("GET", "/api/v1/system/spools", tag=STAG,
       summary="Spools holding partitions back (queen.spool_backlog), cluster-wide",
       description="A spool registers the partitions it holds spooled pushes for; pushes to "
                   "them are staged behind it. A spool silent for `boundMs` "
                   "(FILE_BUFFER_ORDER_WAIT_MS) no longer holds back a broker that has "
                   "beaten that long (docs/behaviour.md §5.8).",
       ok=SPOOL_HOLDS),
    op("POST", "/api/v1/system/spools/<spool_id:str>/release", tag=STAG,
       summary="Release one spool's holds (delete its queen.spool_backlog rows and heartbeat)",
       description="Its partitions are no longer held back by it. If its disk ever comes "
                   "back, its pushes land later, each counted as an order exception; nothing "
                   "already in PostgreSQL changes. A spool that beat within "
                   "FILE_BUFFER_ORDER_WAIT_MS is refused (409) unless `force` is true; "
                   "`(staged)` is always refused.",
       params=(path("spool_id", "A spool id (as GET /api/v1/system/spools lists it)",
                    {"type": "string", "minLength": 1, "maxLength": 255}),),
       body=obj({"force": BOOL}), errors=(404, 409),
       ok=obj({"spool": STR, "released": BOOL, "partitions": INT, "lastHeartbeat": NTIME,
               "forced": BOOL}, ["spool", "released", "partitions"])),
    op("GET", "/openapi.json", tag="Reference", summary="This OpenAPI document",
       public=True, database=False, ok=MAP),
    op("GET", "/docs", tag="Reference", summary="This reference as a page",
       public=True, database=False,
       responses={200: answer(STR, "A self-contained HTML page", "text/html")}),
]
