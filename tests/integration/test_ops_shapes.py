"""Every operator and analytics route in the shape Queen's dashboard reads: each field
the contract lists is present with its JSON type, arrays in the stated order, traces
in snake_case; the figures are the ones this scenario produced, measured by the
metrics collector (a broker flushing every second; a flush is also forced).

Scenario (one broker, one module): queue A (namespace/task, Default + 3 partitions) gets 12
messages; queue mode takes 3 of p1 (2 completed, 1 dead-lettered "boom"), group g1
consumes p1; a trace named after the queue; a long poll parked on queue B while the
collector samples; queue C drops its completed messages through retention.
"""
from __future__ import annotations

import re
import threading
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import start_broker
from tests.waiting import wait_until

S = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
INT, NUM, STR, BOOL = "int", "number", "str", "bool"


def _is(value, kind) -> bool:
    if isinstance(kind, tuple):            # (kind, None): nullable
        return value is None or _is(value, kind[0])
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind in (S, MS):
        return isinstance(value, str) and bool(kind.match(value))
    if kind is list:
        return isinstance(value, list)
    if kind is dict:
        return isinstance(value, dict)
    raise AssertionError(kind)


def shape(obj: dict, spec: dict, where: str = "") -> None:
    """Every key of ``spec`` is in ``obj`` with that type (extra keys may stay)."""
    assert isinstance(obj, dict), (where, obj)
    for key, kind in spec.items():
        assert key in obj, f"{where}.{key} missing in {sorted(obj)}"
        if isinstance(kind, dict):
            shape(obj[key], kind, f"{where}.{key}")
        else:
            assert _is(obj[key], kind), f"{where}.{key} = {obj[key]!r} is not {kind}"


def ordered(values: list, reverse: bool = False) -> bool:
    return values == sorted(values, reverse=reverse)


NN = (NUM, None)
NI = (INT, None)


@pytest.fixture(scope="module")
def world(database, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    broker = start_broker(database, tmp, METRICS_FLUSH_MS="1000", STATS_INTERVAL_MS="1000",
                          RETENTION_INTERVAL="1000")
    http = httpx.Client(base_url=broker.url, timeout=30)
    tag = tmp.name[-8:].replace("-", "").lower()
    qa, qb, qc = f"shape-a-{tag}", f"shape-b-{tag}", f"shape-c-{tag}"
    ns, task = f"ns{tag}", f"tk{tag}"
    parked: threading.Thread | None = None
    try:
        assert http.post("/api/v1/configure", json={"queue": qa, "namespace": ns, "task": task,
                                                    "options": {"leaseTime": 60}}).status_code == 200
        assert http.post("/api/v1/configure", json={"queue": qc, "options": {
            "retentionEnabled": True, "completedRetentionSeconds": 1}}).status_code == 200
        for part, n in (("p1", 6), ("p2", 4), ("p3", 2)):
            r = http.post("/api/v1/push", json={"items": [
                {"queue": qa, "partition": part, "payload": {"n": i}} for i in range(n)]})
            assert r.status_code == 200, r.text
        taken = http.get(f"/api/v1/pop/queue/{qa}/partition/p1",
                         params={"wait": "false", "batch": 3}).json()["messages"]
        for m, status in zip(taken, ("completed", "completed", "dlq")):
            assert http.post("/api/v1/ack", json={
                "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                "leaseId": m["leaseId"], "status": status, "error": "boom"}).status_code == 200
        g1 = http.get(f"/api/v1/pop/queue/{qa}/partition/p1",
                      params={"wait": "false", "batch": 10, "consumerGroup": "g1"}).json()
        for m in g1["messages"]:
            assert http.post("/api/v1/ack", json={
                "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                "leaseId": m["leaseId"], "status": "completed",
                "consumerGroup": "g1"}).status_code == 200
        trace_name = f"flow {tag}"
        assert http.post("/api/v1/traces", json={
            "transactionId": taken[0]["transactionId"], "partitionId": taken[0]["partitionId"],
            "traceNames": [trace_name], "eventType": "step",
            "data": {"text": "charged"}}).status_code in (200, 201)
        # queue C: one message consumed, then removed by the completed-retention sweep
        assert http.post("/api/v1/push", json={"items": [
            {"queue": qc, "payload": {"c": 1}}]}).status_code == 200
        c = http.get(f"/api/v1/pop/queue/{qc}", params={"wait": "false"}).json()["messages"][0]
        assert http.post("/api/v1/ack", json={"transactionId": c["transactionId"],
                                              "partitionId": c["partitionId"],
                                              "leaseId": c["leaseId"],
                                              "status": "completed"}).status_code == 200
        # a long poll parked on queue B while the collector samples (once a second)
        def park():
            try:
                httpx.get(f"{broker.url}/api/v1/pop/queue/{qb}",
                          params={"wait": "true", "timeout": 8000}, timeout=30)
            except httpx.HTTPError:
                pass  # the broker stopped under it at teardown
        parked = threading.Thread(target=park, daemon=True)
        parked.start()

        def parked_seen():
            http.post("/api/v1/system/jobs/metrics/run")
            body = http.get("/api/v1/analytics/queue-parked-replicas",
                            params={"queue": qb}).json()
            return any(p["parkedCount"] > 0 for p in body["series"])
        wait_until(parked_seen, 60, "the parked pop in the collector's rows", interval=0.5)
        # an empty pop for popEmpty, rather than waiting the parked one out
        empty = http.get(f"/api/v1/pop/queue/{qb}", params={"wait": "false"})
        assert empty.status_code == 200 and empty.json()["messages"] == [], empty.text

        def retained():
            return http.get("/api/v1/analytics/retention",
                            params={"queue": qc}).json()["totals"]["completedRetentionMsgs"]
        wait_until(retained, 60, "the retention sweep of queue C", interval=0.5)
        assert http.post("/api/v1/stats/refresh", json={"full": True}).status_code == 200
        assert http.post("/api/v1/system/jobs/metrics/run").status_code == 200
        yield {"http": http, "qa": qa, "qb": qb, "qc": qc, "ns": ns, "task": task,
               "taken": taken, "trace": trace_name, "url": broker.url}
    finally:
        http.close()
        broker.stop()
        if parked is not None:
            parked.join(30)


THROUGHPUT = {"timestamp": S, "ingested": INT, "processed": INT, "popMessages": INT,
              "ingestedPerSecond": NUM, "processedPerSecond": NUM, "popPerSecond": NUM,
              "avgLagMs": NUM, "maxLagMs": INT, "avgEventLoopLagMs": NI, "maxEventLoopLagMs": NI,
              "minFreeSlots": NI, "dbErrors": NI, "ackFailed": INT, "dlqCount": NI,
              "queenCpuUserPct": NN, "queenCpuSysPct": NN, "queenRssMb": NN, "dbPoolActive": NN,
              "dbPoolIdle": NN, "dbPoolSize": NN}


def test_status(world):
    http = world["http"]
    body = http.get("/api/v1/status").json()
    shape(body, {"timeRange": {"from": MS, "to": MS}, "bucketMinutes": INT, "pointCount": INT,
                 "throughput": list, "queues": list, "statsAge": INT,
                 "messages": {"total": INT, "pending": INT, "processing": INT, "completed": INT,
                              "failed": INT, "deadLetter": INT,
                              "requests": {"push": INT, "pop": INT, "ack": INT},
                              "batchEfficiency": {"push": NUM, "pop": NUM, "ack": NUM}},
                 "leases": {"active": INT, "partitionsWithLeases": INT, "totalBatchSize": INT,
                            "totalAcked": INT},
                 "deadLetterQueue": {"totalMessages": INT, "affectedPartitions": INT,
                                     "topErrors": list},
                 "workers": list, "errors": {"dbErrors": INT, "ackFailed": INT,
                                             "dlqMessages": INT}})
    assert body["bucketMinutes"] == 1 and body["pointCount"] == len(body["throughput"]) > 0
    stamps = [p["timestamp"] for p in body["throughput"]]
    assert ordered(stamps, reverse=True)                       # newest bucket first
    for p in body["throughput"]:
        shape(p, THROUGHPUT, "throughput[]")
    measured = [p for p in body["throughput"] if p["queenCpuUserPct"] is not None]
    assert measured and all(p["dbPoolSize"] >= 1 and p["queenRssMb"] > 0 for p in measured)
    for w in body["workers"]:
        shape(w, {"hostname": STR, "workerId": INT, "avgEventLoopLagMs": NI,
                  "maxEventLoopLagMs": NI, "freeSlots": NI, "dbConnections": NI,
                  "jobQueueSize": NI, "messagesProcessed": INT}, "workers[]")
    assert ordered([(w["hostname"], w["workerId"]) for w in body["workers"]])
    assert body["messages"]["batchEfficiency"]["push"] > 0

    scoped = http.get("/api/v1/status", params={"namespace": world["ns"]}).json()
    for p in scoped["throughput"]:
        shape(p, THROUGHPUT, "throughput[] (filtered)")
    assert sum(p["ingested"] for p in scoped["throughput"]) == 12
    assert sum(p["ackFailed"] for p in scoped["throughput"]) == 1
    assert [q["name"] for q in scoped["queues"]] == [world["qa"]]
    shape(scoped["queues"][0], {"id": STR, "name": STR, "namespace": (STR, None),
                                "task": (STR, None), "partitions": INT, "totalConsumed": INT})
    dlq = http.get("/api/v1/status", params={"queue": world["qa"]}).json()["deadLetterQueue"]
    assert dlq["topErrors"] == [{"error": "boom", "count": 1}]


def test_status_queues_and_detail(world):
    http, qa = world["http"], world["qa"]
    body = http.get("/api/v1/status/queues", params={"namespace": world["ns"],
                                                     "limit": 500}).json()
    shape(body, {"queues": list, "pagination": {"limit": INT, "offset": INT}})
    q = body["queues"][0]
    shape(q, {"id": STR, "name": STR, "namespace": (STR, None), "task": (STR, None),
              "createdAt": MS, "partitions": INT,
              "messages": {"total": INT, "pending": INT, "processing": INT}})
    assert q["messages"]["total"] == 12 and q["partitions"] == 4    # Default + p1..p3

    d = http.get(f"/api/v1/status/queues/{quote(qa)}").json()
    six = {k: INT for k in ("total", "pending", "processing", "completed", "failed",
                            "deadLetter")}
    shape(d, {"queue": {"id": STR, "name": STR, "namespace": (STR, None), "task": (STR, None),
                        "priority": INT, "createdAt": MS,
                        "config": {"leaseTime": INT, "retryLimit": INT, "retryDelay": INT,
                                   "ttl": INT, "maxQueueSize": INT, "deadLetterQueue": BOOL}},
              "partitions": list, "totals": {"messages": six, **six}})
    names = [p["name"] for p in d["partitions"]]
    assert names == sorted(names) and set(names) == {"Default", "p1", "p2", "p3"}
    for p in d["partitions"]:
        shape(p, {"id": STR, "name": STR, "createdAt": MS, "messages": six, "stats": six,
                  "cursor": {"totalConsumed": INT, "batchesConsumed": INT},
                  "lastActivity": (MS, None), "oldestMessage": (MS, None),
                  "newestMessage": (MS, None)}, "partitions[]")
    p1 = next(p for p in d["partitions"] if p["name"] == "p1")
    assert p1["cursor"]["totalConsumed"] == 2 + 6   # completed: queue mode 2, g1 6, each once
    assert d["totals"]["total"] == 12 and d["totals"]["messages"]["deadLetter"] == 1
    assert http.get(f"/api/v1/status/queues/{qa}-none").status_code == 404

    msgs = http.get(f"/api/v1/status/queues/{quote(qa)}/messages").json()
    assert isinstance(msgs, list) and len(msgs) == 12
    for m in msgs:
        shape(m, {"id": STR, "transactionId": STR, "partitionId": STR, "queuePath": STR,
                  "queue": STR, "partition": STR, "status": STR, "createdAt": MS})
    assert ordered([m["createdAt"] for m in msgs], reverse=True)

    a = http.get("/api/v1/status/analytics", params={"queue": qa, "interval": "minute"}).json()
    shape(a, {"interval": STR, "from": MS, "to": MS, "dataPoints": list})
    assert ordered([p["timestamp"] for p in a["dataPoints"]])
    assert sum(p["messages"] for p in a["dataPoints"]) == 12
    b = http.get("/api/v1/status/buffers").json()
    shape(b, {"pending": INT, "failed": INT, "dbHealthy": BOOL, "worker": INT})


QUEUE_OPS = {"bucket": S, "queueName": STR, "pushRequests": INT, "pushMessages": INT,
             "popMessages": INT, "popEmpty": INT, "ackRequests": INT, "ackSuccess": INT,
             "ackFailed": INT, "transactions": INT, "partitionsCreated": INT,
             "partitionsDeleted": INT, "partitionCount": NI, "avgLagMs": NUM, "maxLagMs": INT,
             "pushPerSecond": NUM, "popPerSecond": NUM, "ackPerSecond": NUM,
             "emptyPerSecond": NUM, "parkedCount": NUM}


def test_queue_ops_lag_parked(world):
    http, qa, qb = world["http"], world["qa"], world["qb"]
    body = http.get("/api/v1/analytics/queue-ops").json()
    shape(body, {"timeRange": {"from": MS, "to": MS}, "bucketMinutes": INT, "series": list,
                 "queues": list})
    for e in body["series"]:
        shape(e, QUEUE_OPS, "series[]")
    assert ordered([(e["bucket"], e["queueName"]) for e in body["series"]])
    assert body["queues"] == sorted(body["queues"]) and {qa, qb} <= set(body["queues"])
    mine = [e for e in body["series"] if e["queueName"] == qa]
    assert sum(e["pushMessages"] for e in mine) == 12
    assert sum(e["pushRequests"] for e in mine) == 3
    assert sum(e["popMessages"] for e in mine) == 3 + 6
    assert sum(e["ackSuccess"] for e in mine) == 2 + 6 and sum(e["ackFailed"] for e in mine) == 1
    assert sum(e["partitionsCreated"] for e in mine) == 4        # Default + p1..p3
    assert max(e["partitionCount"] or 0 for e in mine) == 4
    assert any(e["parkedCount"] > 0 for e in body["series"] if e["queueName"] == qb)
    assert sum(e["popEmpty"] for e in body["series"] if e["queueName"] == qb) >= 1

    lag = http.get("/api/v1/analytics/queue-lag").json()
    assert isinstance(lag, list)
    for r in lag:
        shape(r, {"queueName": STR, "popCount": INT, "avgLagMs": INT, "maxLagMs": INT,
                  "bucketTime": S})
    keys = [(r["bucketTime"], r["queueName"]) for r in lag]
    assert keys == sorted(keys, key=lambda k: (tuple(-ord(c) for c in k[0]), k[1]))
    assert sum(r["popCount"] for r in lag if r["queueName"] == qa) == 9

    parked = http.get("/api/v1/analytics/queue-parked-replicas").json()
    shape(parked, {"timeRange": {"from": MS, "to": MS}, "bucketMinutes": INT, "series": list,
                   "replicas": list})
    for e in parked["series"]:
        shape(e, {"bucket": S, "queueName": STR, "hostname": STR, "workerId": INT,
                  "parkedCount": NUM})
    assert ordered([(e["bucket"], e["queueName"], e["hostname"], e["workerId"])
                    for e in parked["series"]])
    assert ordered([(r["hostname"], r["workerId"]) for r in parked["replicas"]])


def test_retention(world):
    body = world["http"].get("/api/v1/analytics/retention").json()
    counts = {"retentionMsgs": INT, "completedRetentionMsgs": INT, "evictionMsgs": INT,
              "totalMsgs": INT, "eventCount": INT}
    shape(body, {"timeRange": {"from": MS, "to": MS}, "bucketMinutes": INT, "series": list,
                 "totals": counts})
    for e in body["series"]:
        shape(e, {"bucket": S, **counts})
    assert ordered([e["bucket"] for e in body["series"]])
    mine = world["http"].get("/api/v1/analytics/retention", params={"queue": world["qc"]}).json()
    assert mine["totals"]["completedRetentionMsgs"] == 1 and mine["totals"]["eventCount"] >= 1


LEAF = {"avg": NN, "min": NN, "max": NN, "last": NN}


def test_system_and_worker_metrics(world):
    http = world["http"]
    body = http.get("/api/v1/analytics/system-metrics").json()
    shape(body, {"timeRange": {"from": MS, "to": MS}, "bucketMinutes": INT, "replicaCount": INT,
                 "pointCount": INT, "replicas": list})
    assert body["replicaCount"] == len(body["replicas"]) >= 1
    assert body["pointCount"] == sum(len(r["timeSeries"]) for r in body["replicas"])
    keys = [(r["hostname"], r["port"], r["workerId"]) for r in body["replicas"]]
    assert keys == sorted(keys)
    mine = [r for r in body["replicas"] if r["port"] == int(world["url"].rsplit(":", 1)[1])]
    assert mine, keys
    for r in body["replicas"]:
        shape(r, {"hostname": STR, "port": INT, "workerId": STR, "timeSeries": list})
        assert ordered([p["timestamp"] for p in r["timeSeries"]])
        for p in r["timeSeries"]:
            shape(p, {"timestamp": MS, "sampleCount": INT, "metrics": {
                "cpu": {"user_us": LEAF, "system_us": LEAF},
                "memory": {"rss_bytes": LEAF, "virtual_bytes": LEAF},
                "database": {"pool_size": LEAF, "pool_idle": LEAF, "pool_active": LEAF},
                "threadpool": {"db": {"pool_size": LEAF, "queue_size": LEAF},
                               "system": {"pool_size": LEAF, "queue_size": LEAF}},
                "registries": {"response": LEAF},
                "shared_state": {"enabled": (BOOL, None), "consumer_presence": dict,
                                 "server_health": dict, "transport": dict}}})
    last = mine[0]["timeSeries"][-1]["metrics"]
    assert last["memory"]["rss_bytes"]["last"] > 0 and last["cpu"]["user_us"]["avg"] is not None

    w = http.get("/api/v1/analytics/worker-metrics").json()
    shape(w, {"timeRange": {"from": MS, "to": MS}, "bucketMinutes": INT, "pointCount": INT,
              "timeSeries": list, "workers": list, "queues": list, "summary": {
                  k: INT for k in ("totalPushMessages", "totalPopMessages", "totalAckMessages",
                                   "totalPushRequests", "totalPopRequests", "totalAckRequests",
                                   "totalDbErrors", "totalAckFailed", "totalDlq",
                                   "pendingMessages")}})
    assert ordered([p["timestamp"] for p in w["timeSeries"]], reverse=True)
    for p in w["timeSeries"]:
        shape(p, {"timestamp": S, "pushMessages": INT, "popMessages": INT, "ackMessages": INT,
                  "pushRequests": INT, "popRequests": INT, "ackRequests": INT,
                  "jobsDone": NI, "pushPerSecond": NUM, "popPerSecond": NUM, "ackPerSecond": NUM,
                  "avgEventLoopLagMs": NI, "maxEventLoopLagMs": NI, "avgFreeSlots": NI,
                  "minFreeSlots": NI, "dbConnections": NI, "avgJobQueueSize": NI,
                  "maxJobQueueSize": NI, "backoffSize": NI, "avgLagMs": INT, "maxLagMs": INT,
                  "lagCount": INT, "dbErrors": INT, "ackSuccess": INT, "ackFailed": INT,
                  "dlqCount": INT})
    assert any(p["backoffSize"] for p in w["timeSeries"])       # the parked long poll
    for x in w["workers"]:
        shape(x, {"hostname": STR, "workerId": INT, "avgEventLoopLagMs": NI,
                  "maxEventLoopLagMs": NI, "freeSlots": NI, "dbConnections": NI,
                  "jobQueueSize": NI, "backoffSize": NI, "messagesProcessed": INT, "lastSeen": S})
    for q in w["queues"]:
        shape(q, {"queueName": STR, "popCount": INT, "avgLagMs": INT, "maxLagMs": INT})
    assert ordered([q["popCount"] for q in w["queues"]], reverse=True)
    assert w["summary"]["totalPushMessages"] >= 13


def test_postgres_stats(world):
    body = world["http"].get("/api/v1/analytics/postgres-stats").json()
    shape(body, {"timestamp": MS, "database": STR,
                 "databaseCache": {"database": STR, "diskReads": INT, "cacheHits": INT,
                                   "cacheHitRatio": NN},
                 "tableCache": list, "indexCache": list, "deadTuples": list, "hotUpdates": list,
                 "activeQueries": list, "autovacuumStatus": list, "bufferUsage": list,
                 "tableSizes": list,
                 "cacheSummary": {"tables": {"diskReads": INT, "cacheHits": INT, "hitRatio": NN},
                                  "indexes": {"diskReads": INT, "cacheHits": INT,
                                              "hitRatio": NN}},
                 "bufferConfig": {"sharedBuffers": STR, "sharedBuffersSize": STR}})
    for t in body["tableCache"]:
        shape(t, {"schema": STR, "table": STR, "diskReads": INT, "cacheHits": INT,
                  "cacheHitRatio": NN})
    assert ordered([t["diskReads"] for t in body["tableCache"]], reverse=True)
    for t in body["tableSizes"]:
        shape(t, {"table": STR, "totalSize": STR, "totalSizeBytes": INT, "tableSize": STR,
                  "tableSizeBytes": INT, "indexSize": STR, "indexSizeBytes": INT})
    assert ordered([t["totalSizeBytes"] for t in body["tableSizes"]], reverse=True)
    for q in body["activeQueries"]:
        shape(q, {"pid": INT, "duration": NUM, "state": STR, "query": STR})
    for t in body["hotUpdates"]:
        shape(t, {"schema": STR, "table": STR, "totalUpdates": INT, "hotUpdates": INT,
                  "hotUpdatePercentage": NUM})


def test_resources(world):
    http, qa = world["http"], world["qa"]
    o = http.get("/api/v1/resources/overview").json()
    shape(o, {"queues": INT, "partitions": INT, "namespaces": INT, "tasks": INT,
              "messages": {k: INT for k in ("total", "pending", "processing", "completed",
                                            "failed", "deadLetter")},
              "lag": {"time": {"avg": NUM, "median": NUM, "min": NUM, "max": INT},
                      "offset": {"avg": NUM, "median": NUM, "min": NUM, "max": NUM}},
              "throughput": {"ingestedPerSecond": NUM, "processedPerSecond": NUM},
              "timestamp": MS})
    assert o["throughput"]["ingestedPerSecond"] > 0
    qs = http.get("/api/v1/resources/queues").json()["queues"]
    mine = next(q for q in qs if q["name"] == qa)
    shape(mine, {"id": STR, "name": STR, "namespace": (STR, None), "task": (STR, None),
                 "createdAt": MS, "partitions": INT,
                 "messages": {"total": INT, "pending": INT, "processing": INT}})
    d = http.get(f"/api/v1/resources/queues/{quote(qa)}").json()
    six = {k: INT for k in ("total", "pending", "processing", "completed", "failed",
                            "deadLetter")}
    shape(d, {"id": STR, "name": STR, "createdAt": MS, "partitions": list, "totals": six})
    assert ordered([p["name"] for p in d["partitions"]])
    for p in d["partitions"]:
        shape(p, {"id": STR, "name": STR, "createdAt": MS, "stats": six,
                  "oldestMessage": (MS, None), "newestMessage": (MS, None)})
    for path, key in (("namespaces", "namespace"), ("tasks", "task")):
        rows = http.get(f"/api/v1/resources/{path}").json()[path]
        assert any(r[key] in (world["ns"], world["task"]) for r in rows)


def test_traces_snake_case(world):
    http, m = world["http"], world["taken"][0]
    by = http.get(f"/api/v1/traces/by-name/{quote(world['trace'])}",
                  params={"limit": 50, "offset": 0}).json()
    shape(by, {"traces": list, "total": INT, "pagination": {"limit": INT, "offset": INT}})
    assert by["total"] == 1
    t = by["traces"][0]
    shape(t, {"id": STR, "transaction_id": STR, "partition_id": STR, "event_type": STR,
              "data": dict, "consumer_group": STR, "worker_id": (STR, None), "created_at": MS,
              "queue_name": STR, "partition_name": STR, "message_payload": dict,
              "trace_names": list})
    assert t["queue_name"] == world["qa"] and t["trace_names"] == [world["trace"]]
    assert not any(c.isupper() for k in t for c in k)          # snake_case, every key
    mine = http.get(f"/api/v1/traces/{m['partitionId']}/{m['transactionId']}").json()
    assert [x["event_type"] for x in mine["traces"]] == ["step"]
    assert not any(c.isupper() for x in mine["traces"] for k in x for c in k)
    names = http.get("/api/v1/traces/names").json()
    shape(names, {"trace_names": list, "pagination": {"limit": INT, "offset": INT}})
    for n in names["trace_names"]:
        shape(n, {"trace_name": STR, "trace_count": INT, "message_count": INT, "last_seen": MS})
    assert ordered([n["last_seen"] for n in names["trace_names"]], reverse=True)


def test_messages_and_move_to_dlq(world):
    http, qa = world["http"], world["qa"]
    body = http.get("/api/v1/messages", params={"queue": qa, "limit": 100}).json()
    shape(body, {"messages": list, "mode": {"hasQueueMode": BOOL, "busGroupsCount": INT,
                                            "type": STR}})
    for m in body["messages"]:
        shape(m, {"id": STR, "transactionId": STR, "partitionId": STR, "queue": STR,
                  "partition": STR, "status": STR, "createdAt": MS,
                  "busStatus": {"consumedBy": INT, "totalGroups": INT}})
    assert ordered([m["createdAt"] for m in body["messages"]], reverse=True)
    # p2's oldest message is next for queue mode: it can be moved; a later one cannot
    p2 = sorted((m for m in body["messages"] if m["partition"] == "p2"),
                key=lambda m: m["id"])             # ids are UUIDv7: push order
    first, later = p2[0], p2[2]
    r = http.post(f"/api/v1/messages/{later['partitionId']}/{later['transactionId']}/dlq")
    assert r.status_code == 409 and r.json()["movedToDLQ"] is False
    r = http.post(f"/api/v1/messages/{first['partitionId']}/{first['transactionId']}/dlq")
    assert r.status_code == 200, r.text
    assert r.json() == {"movedToDLQ": True, "partitionId": first["partitionId"],
                        "transactionId": first["transactionId"]}
    d = http.get(f"/api/v1/messages/{first['partitionId']}/{first['transactionId']}").json()
    assert d["status"] == "dead_letter" and d["errorMessage"] == "Manually moved to DLQ"
    again = http.post(f"/api/v1/messages/{first['partitionId']}/{first['transactionId']}/dlq")
    assert again.status_code == 409
    missing = http.post(f"/api/v1/messages/{first['partitionId']}/nope/dlq")
    assert missing.status_code == 404
    # queue mode no longer delivers it: the next pop of p2 starts after it
    nxt = http.get(f"/api/v1/pop/queue/{qa}/partition/p2",
                   params={"wait": "false", "batch": 1}).json()["messages"]
    assert nxt and nxt[0]["transactionId"] == p2[1]["transactionId"]
    # and /retry brings it back
    r = http.post(f"/api/v1/messages/{first['partitionId']}/{first['transactionId']}/retry")
    assert r.status_code == 200, r.text
    dlq = http.get("/api/v1/dlq").json()
    for m in dlq["messages"]:
        shape(m, {"id": STR, "transactionId": STR, "partitionId": STR, "queue": STR,
                  "partition": STR, "consumerGroup": STR, "errorMessage": (STR, None),
                  "retryCount": INT, "createdAt": MS, "failedAt": MS})


def test_consumers_and_header_routes(world):
    """Appendix A routes the Consumers, Header and Migration views read."""
    http, qa = world["http"], world["qa"]
    groups = http.get("/api/v1/consumer-groups").json()
    assert isinstance(groups, list)
    for g in groups:
        shape(g, {"name": STR, "queueName": STR, "members": INT, "partitionsWithLag": INT,
                  "maxTimeLag": NUM, "state": STR})
    assert {"g1", "__QUEUE_MODE__"} <= {g["name"] for g in groups if g["queueName"] == qa}
    rows = http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 0}).json()
    assert isinstance(rows, list) and rows
    for r in rows:
        shape(r, {"consumer_group": STR, "queue_name": STR, "partition_name": STR,
                  "offset_lag": INT, "time_lag_seconds": NUM,
                  "oldest_unconsumed_at": (MS, None)})
    m = http.get("/api/v1/system/maintenance").json()
    shape(m, {"maintenanceMode": BOOL, "popMaintenanceMode": BOOL, "bufferedMessages": INT,
              "bufferStats": {"failedCount": INT, "failedFiles": {"totalMB": NUM}}})
    assert http.get("/health").json()["status"] in ("healthy", "ok")


def test_standalone_identity(world):
    """The reference web dashboard boots from GET /auth/me and renders nothing without it:
    with auth off the broker answers the standalone identity (one synthetic cluster, admin,
    live operator), so the app shows every view including the operator-only System page."""
    http = world["http"]
    me = http.get("/auth/me")
    assert me.status_code == 200 and me.headers["content-type"].startswith("application/json")
    body = me.json()
    shape(body, {"user_id": STR, "is_operator": BOOL, "operator_enabled": BOOL,
                 "operator_live": BOOL, "acting_cluster": {"id": STR, "slug": STR},
                 "clusters": list, "act_cluster_header": STR, "role": STR, "standalone": BOOL})
    assert body["standalone"] is True and body["operator_live"] is True
    assert body["email"] is None
    (cluster,) = body["clusters"]
    shape(cluster, {"id": STR, "slug": STR, "role": STR, "tenant_slug": STR, "status": STR,
                    "cell_slug": STR})
    assert cluster["role"] == "admin" and cluster["status"] == "active"
    assert cluster["id"] == body["acting_cluster"]["id"]
    assert cluster["tenant_id"] is None  # no tenancy here: not a made-up id
    assert cluster["cell_slug"] == http.get("/health").json()["server"]
    login = http.get("/auth/login", follow_redirects=False)
    assert login.status_code == 302 and login.headers["location"] == "/"
    assert http.post("/auth/logout").json() == {"ok": True}


def test_dead_lettered_by_a_bus_group_is_dead_letter_on_a_shared_partition(world):
    """A message with a DLQ row is `dead_letter` in the list and the detail, also when
    the partition has a queue-mode cursor besides the group that dead-lettered it (the
    reference's rule; the dashboard's dead_letter filter and purge button rely on it)."""
    http = world["http"]
    queue = f"{world['qa']}-hybrid"
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": "h", "payload": {"n": i}} for i in range(3)]})
    assert r.status_code == 200, r.text
    qm = http.get(f"/api/v1/pop/queue/{queue}/partition/h",
                  params={"wait": "false", "batch": 1}).json()["messages"]
    assert http.post("/api/v1/ack", json={
        "transactionId": qm[0]["transactionId"], "partitionId": qm[0]["partitionId"],
        "leaseId": qm[0]["leaseId"], "status": "completed"}).json()[0]["success"]
    bus = http.get(f"/api/v1/pop/queue/{queue}/partition/h",
                   params={"wait": "false", "batch": 3, "consumerGroup": "gx"}).json()["messages"]
    victim = bus[1]
    for m in bus:
        assert http.post("/api/v1/ack", json={
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "consumerGroup": "gx", "error": "bad payload",
            "status": "dlq" if m is victim else "completed"}).json()[0]["success"]
    listed = http.get("/api/v1/messages", params={"queue": queue, "status": "dead_letter"}).json()
    assert [m["transactionId"] for m in listed["messages"]] == [victim["transactionId"]]
    assert listed["mode"]["type"] == "hybrid"
    every = {m["transactionId"]: m["status"] for m in http.get(
        "/api/v1/messages", params={"queue": queue}).json()["messages"]}
    assert every == {qm[0]["transactionId"]: "completed", victim["transactionId"]: "dead_letter",
                     bus[2]["transactionId"]: "pending"}
    detail = http.get(f"/api/v1/messages/{victim['partitionId']}/{victim['transactionId']}").json()
    assert detail["status"] == "dead_letter" and detail["errorMessage"] == "bad payload"
