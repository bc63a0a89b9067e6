"""Analytics routes (queue-ops, retention, queue-lag, queue-parked-replicas,
system-metrics, worker-metrics, postgres-stats) in the shapes Queen's dashboard
reads; figures from the metrics collector's tables (broker/service/analytics.py)."""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.times import iso_milli
from broker.http.responses import args, json
from broker.http.routes.ops.common import now_utc, time_range
from broker.http.types import BrokerRequest
from broker.http.wire.common import MAX_NAME, q_str
from broker.service import analytics as svc

bp = Blueprint("ops_analytics")


def _name(a, key: str) -> str | None:
    value = q_str(a, key)
    if value is not None and len(value) > MAX_NAME:
        raise BadRequest(f"{key} must be at most {MAX_NAME} characters")
    return value


def _window(a):
    since, until = time_range(a)
    return since, until, svc.bucket_minutes(since, until), {"from": iso_milli(since),
                                                            "to": iso_milli(until)}


@bp.get("/api/v1/analytics/queue-ops")
async def queue_ops(request: BrokerRequest):
    a = args(request)
    since, until, minutes, window = _window(a)
    rows = await svc.queue_ops(request.app.ctx, minutes, since, until, _name(a, "queue"))
    series = [svc.queue_ops_entry(r, minutes) for r in rows]
    return json({"timeRange": window, "bucketMinutes": minutes, "series": series,
                 "queues": sorted({e["queueName"] for e in series})})


@bp.get("/api/v1/analytics/retention")
async def retention(request: BrokerRequest):
    a = args(request)
    since, until, minutes, window = _window(a)
    rows = await svc.retention(request.app.ctx, minutes, since, until, _name(a, "queue"))
    series = [{"bucket": svc.iso_s(r["ts"]), "retentionMsgs": r["retention"],
               "completedRetentionMsgs": r["completed"], "evictionMsgs": r["eviction"],
               "totalMsgs": r["total"], "eventCount": r["events"]} for r in rows]
    keys = ("retentionMsgs", "completedRetentionMsgs", "evictionMsgs", "totalMsgs", "eventCount")
    return json({"timeRange": window, "bucketMinutes": minutes, "series": series,
                 "totals": {k: sum(e[k] for e in series) for k in keys}})


@bp.get("/api/v1/analytics/queue-lag")
async def queue_lag(request: BrokerRequest):
    """Q minute rows, newest first (a top-level array)."""
    a = args(request)
    since, until = time_range(a)
    rows = await svc.queue_lag(request.app.ctx, since, until, _name(a, "queue"))
    return json([{"queueName": r["queue_name"], "popCount": r["pop_count"],
                  "avgLagMs": r["avg_lag"], "maxLagMs": r["max_lag"],
                  "bucketTime": svc.iso_s(r["bucket_time"])} for r in rows])


@bp.get("/api/v1/analytics/queue-parked-replicas")
async def parked_replicas(request: BrokerRequest):
    a = args(request)
    since, until, minutes, window = _window(a)
    rows = await svc.parked_replicas(request.app.ctx, minutes, since, until,
                                     _name(a, "queue"))
    series = [{"bucket": svc.iso_s(r["ts"]), "queueName": r["queue_name"],
               "hostname": r["hostname"], "workerId": r["pid"], "workerName": r["worker_id"],
               "parkedCount": r["parked"]} for r in rows]
    replicas = sorted({(e["hostname"], e["workerId"]) for e in series})
    return json({"timeRange": window, "bucketMinutes": minutes, "series": series,
                 "replicas": [{"hostname": h, "workerId": w} for h, w in replicas]})


@bp.get("/api/v1/analytics/system-metrics")
async def system_metrics(request: BrokerRequest):
    a = args(request)
    since, until, minutes, window = _window(a)
    rows = await svc.system_rows(request.app.ctx, since, until, _name(a, "hostname"),
                                 _name(a, "workerId"))
    replicas = svc.system_replicas(rows, minutes)
    return json({"timeRange": window, "bucketMinutes": minutes, "replicaCount": len(replicas),
                 "pointCount": sum(len(r["timeSeries"]) for r in replicas),
                 "replicas": replicas})


@bp.get("/api/v1/analytics/worker-metrics")
async def worker_metrics(request: BrokerRequest):
    a = args(request)
    since, until, minutes, window = _window(a)
    raw = q_str(a, "workerId")
    if raw is not None and not raw.isdigit():
        raise BadRequest(f"workerId must be an integer (a broker's process id), got {raw!r}")
    m = await svc.worker_metrics(request.app.ctx, minutes, since, until,
                                 _name(a, "hostname"), int(raw) if raw else None)
    series = [svc.worker_entry(w, minutes) for w in m["series"]]
    return json({
        "timeRange": window, "bucketMinutes": minutes, "pointCount": len(series),
        "timeSeries": series,
        "workers": [{"hostname": w["hostname"], "workerId": w["pid"],
                     "workerName": w["worker_name"], "avgEventLoopLagMs": w["loop_lag_avg"],
                     "maxEventLoopLagMs": w["loop_lag_max"], "freeSlots": w["free_slots"],
                     "dbConnections": w["db_connections"], "jobQueueSize": w["job_queue"],
                     "backoffSize": w["backoff"], "messagesProcessed": int(w["processed"] or 0),
                     "lastSeen": svc.iso_s(w["last_seen"])} for w in m["workers"]],
        "queues": [{"queueName": r["queue_name"], "popCount": r["pop_count"],
                    "avgLagMs": r["avg_lag"], "maxLagMs": r["max_lag"]} for r in m["queues"]],
        "summary": svc.summary_entry(m["summary"]),
    })


def _s(ts) -> str | None:
    return svc.iso_s(ts)


@bp.get("/api/v1/analytics/postgres-stats")
async def postgres_stats(request: BrokerRequest):
    s = await svc.postgres_stats(request.app.ctx)
    db, buf = s["databaseCache"], s["bufferConfig"]

    def cache(rows, index: bool = False):
        return [{"schema": r["schema"], "table": r["table"],
                 **({"index": r["index"]} if index else {}),
                 "diskReads": r["disk_reads"], "cacheHits": r["cache_hits"],
                 "cacheHitRatio": r["ratio"]} for r in rows]

    def summary(rows):
        reads = sum(r["disk_reads"] for r in rows)
        hits = sum(r["cache_hits"] for r in rows)
        return {"diskReads": reads, "cacheHits": hits,
                "hitRatio": round(100 * hits / (hits + reads), 2) if hits + reads else None}

    return json({
        "timestamp": iso_milli(now_utc()), "database": s["database"],
        "databaseCache": {"database": db["database"], "diskReads": db["disk_reads"],
                          "cacheHits": db["cache_hits"], "cacheHitRatio": db["ratio"]},
        "tableCache": cache(s["tableCache"]), "indexCache": cache(s["indexCache"], True),
        "cacheSummary": {"tables": summary(s["tableCache"]),
                         "indexes": summary(s["indexCache"])},
        "deadTuples": [{"schema": r["schema"], "table": r["table"], "deadTuples": r["dead"],
                        "liveTuples": r["live"], "deadPercentage": r["pct"],
                        "lastVacuum": _s(r["last_vacuum"]),
                        "lastAutovacuum": _s(r["last_autovacuum"])} for r in s["deadTuples"]],
        "hotUpdates": [{"schema": r["schema"], "table": r["table"], "totalUpdates": r["updates"],
                        "hotUpdates": r["hot"], "hotUpdatePercentage": r["pct"]}
                       for r in s["hotUpdates"]],
        "activeQueries": [{"pid": r["pid"], "duration": round(r["duration"], 3),
                           "state": r["state"], "query": r["query"],
                           "waitEventType": r["wait_event_type"], "waitEvent": r["wait_event"]}
                          for r in s["activeQueries"]],
        "autovacuumStatus": [{"table": r["table"], "lastAutovacuum": _s(r["last_autovacuum"]),
                              "deadTuples": r["dead"], "autovacuumCount": r["autovacuum_count"],
                              "autoanalyzeCount": r["autoanalyze_count"]}
                             for r in s["autovacuum"]],
        "bufferConfig": {"sharedBuffers": buf["shared_buffers"], "sharedBuffersSize": buf["size"]},
        "bufferUsage": [{"object": r["object"], "bufferedSize": r["buffered_size"],
                         "bufferedBytes": r["buffered_bytes"], "percentOfCache": r["pct"]}
                        for r in s["bufferUsage"]],
        "tableSizes": [{"table": r["table"], "totalSize": r["total_size"],
                        "totalSizeBytes": r["total_bytes"], "tableSize": r["table_size"],
                        "tableSizeBytes": r["table_bytes"], "indexSize": r["index_size"],
                        "indexSizeBytes": r["index_bytes"]} for r in s["tableSizes"]],
    })
