"""Operator routes (docs/wire-contract.md §10.4–§10.7, §11, §13, §14, §15.2–§15.3) against
a real broker.

One small scenario per test (``scenario``): an encrypted queue with namespace and
task, three messages on partition p1 and two on p2; queue mode acked two on p1,
dead-lettered the first of p2 and holds a lease on the third of p1; group ``ga``
consumed all of p1; group ``gb`` holds a lease on p2 without acking.

Counters documented as coming from queen.stats are only checked exactly while
the stats table is empty (``statsAge`` null), when they are computed live.
"""
from __future__ import annotations

import datetime as dt
import uuid
from urllib.parse import quote

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import db_fetch, db_val

QUEUE_MODE = "__QUEUE_MODE__"


# -- helpers ----------------------------------------------------------------

def push(http, queue, *payloads, partition="Default"):
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "payload": p} for p in payloads]})
    assert r.status_code == 200, r.text
    return r.json()


def pop(http, queue, partition, group=None, batch=10, **params):
    params = {"wait": "false", "batch": batch, **params}
    if group:
        params["consumerGroup"] = group
    r = http.get(f"/api/v1/pop/queue/{queue}/partition/{partition}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def ack(http, msg, status="completed", group=None, **extra):
    r = http.post("/api/v1/ack", json={
        "transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
        "status": status, "leaseId": msg["leaseId"], "consumerGroup": group, **extra})
    assert r.status_code == 200, r.text
    return r.json()[0]


def ok(r, status=200):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def scenario(http, queue):
    ns, task = f"{queue}-ns", f"{queue}-tk"
    ok(http.post("/api/v1/configure", json={
        "queue": queue, "namespace": ns, "task": task,
        "options": {"encryptionEnabled": True, "leaseTime": 120}}))
    push(http, queue, {"n": 1}, {"n": 2}, {"n": 3}, partition="p1")
    push(http, queue, {"n": 4}, {"n": 5}, partition="p2")
    ga, gb = f"{queue}-ga", f"{queue}-gb"
    # queue mode: acks 1 and 2 of p1, dead-letters 4 (p2), holds a lease on 3
    first = pop(http, queue, "p1", batch=2)["messages"]
    assert [m["data"] for m in first] == [{"n": 1}, {"n": 2}]
    for m in first:
        assert ack(http, m)["success"]
    dead = pop(http, queue, "p2", batch=1)["messages"][0]
    assert ack(http, dead, "dlq", error="boom")["dlq"] is True
    held = pop(http, queue, "p1", batch=1)["messages"][0]
    assert held["data"] == {"n": 3}
    # ga consumed p1 entirely; gb holds a lease on p2
    for m in pop(http, queue, "p1", group=ga)["messages"]:
        assert ack(http, m, group=ga)["success"]
    gb_msgs = pop(http, queue, "p2", group=gb)["messages"]
    assert len(gb_msgs) == 2
    return {"ns": ns, "task": task, "ga": ga, "gb": gb, "first": first, "dead": dead,
            "held": held, "gb_msgs": gb_msgs}


def stats_empty(body) -> bool:
    return body.get("statsAge") is None


# -- resources --------------------------------------------------------------

def test_namespaces_tasks_overview(http, queue_name):
    s = scenario(http, queue_name)
    body = ok(http.get("/api/v1/resources/namespaces"))
    mine = [n for n in body["namespaces"] if n["namespace"] == s["ns"]]
    assert len(mine) == 1 and mine[0]["queues"] == 1 and mine[0]["partitions"] == 3
    assert set(mine[0]["messages"]) >= {"total", "pending"}
    if stats_empty(body):
        assert mine[0]["messages"]["total"] == 5
        # each message in one state (docs/operations/metrics.md): 1 and 2 completed (queue mode
        # and ga past them), 3 and 5 processing (under queue mode's and gb's leases), 4
        # dead-lettered (by queue mode; gb's lease on it does not make it processing)
        assert mine[0]["messages"]["pending"] == 0
        assert mine[0]["messages"]["deadLetter"] == 1
        assert mine[0]["messages"]["processing"] == 2
        assert mine[0]["messages"]["completed"] == 2
    body = ok(http.get("/api/v1/resources/tasks"))
    mine = [t for t in body["tasks"] if t["task"] == s["task"]]
    assert len(mine) == 1 and mine[0]["queues"] == 1

    o = ok(http.get("/api/v1/resources/overview"))
    for key in ("queues", "partitions", "namespaces", "tasks", "messages", "lag", "throughput",
                "timestamp", "statsAge"):
        assert key in o
    assert o["queues"] >= 1 and o["namespaces"] >= 1 and o["tasks"] >= 1
    assert set(o["messages"]) == {"total", "pending", "processing", "completed", "failed",
                                  "deadLetter"}
    assert set(o["lag"]["time"]) == {"avg", "median", "min", "max"}
    assert set(o["lag"]["offset"]) == {"avg", "median", "min", "max"}
    assert o["throughput"]["ingestedPerSecond"] >= 0
    assert o["lag"]["offset"]["max"] >= 2


def test_partitions_and_depth(http, queue_name):
    s = scenario(http, queue_name)
    push(http, queue_name, {"n": 6}, partition="p2")  # no consumer has taken it yet
    body = ok(http.get("/api/v1/resources/partitions", params={"queue": queue_name}))
    parts = {p["name"]: p for p in body["partitions"]}
    assert set(parts) == {"Default", "p1", "p2"}
    # depth = pending: 3 is processing (queue mode's lease), 6 pending, 4 dead, 5 processing
    assert parts["p1"]["depth"] == 0 and parts["p1"]["total"] == 3
    assert parts["p2"]["depth"] == 1 and parts["p2"]["total"] == 3
    assert parts["p1"]["processing"] == 1          # queue mode's lease on message 3
    assert parts["p2"]["processing"] == 1          # gb's lease on 5 (4 is dead-lettered)
    for key in ("id", "queue", "namespace", "task", "queuePriority", "createdAt"):
        assert key in parts["p1"]
    assert parts["p1"]["namespace"] == s["ns"]
    body = ok(http.get("/api/v1/resources/partitions",
                       params={"queue": queue_name, "minDepth": 1}))
    assert {p["name"] for p in body["partitions"]} == {"p2"}
    assert ok(http.get("/api/v1/resources/partitions",
                       params={"queue": queue_name, "minDepth": 2}))["partitions"] == []
    assert http.get("/api/v1/resources/partitions", params={"minDepth": "x"}).status_code == 400

    d = ok(http.get(f"/api/v1/resources/queues/{quote(queue_name)}/depth"))
    # without a group: the lag after the least advanced consumer, in-flight included
    assert d == {"queue": queue_name, "group": None, "pending": 4, "partitionsPending": 2,
                 "conflation": False, "effectivePending": 4,
                 "partitions": [{"partition": "Default", "pending": 0},
                                {"partition": "p1", "pending": 1},
                                {"partition": "p2", "pending": 3}]}
    d = ok(http.get(f"/api/v1/resources/queues/{queue_name}/depth", params={"group": s["ga"]}))
    # ga: p1 consumed; p2 never touched: starts at the beginning (no subscription)
    assert {p["partition"]: p["pending"] for p in d["partitions"]} == {"Default": 0, "p1": 0, "p2": 3}
    assert d["pending"] == 3 and d["partitionsPending"] == 1 and d["group"] == s["ga"]
    d = ok(http.get(f"/api/v1/resources/queues/{queue_name}/depth", params={"group": s["gb"]}))
    assert {p["partition"]: p["pending"] for p in d["partitions"]} == {"Default": 0, "p1": 3, "p2": 3}
    r = http.get(f"/api/v1/resources/queues/{queue_name}-missing/depth")
    assert r.status_code == 404 and "error" in r.json()


# -- consumer groups --------------------------------------------------------

def test_consumer_group_listing_detail_and_lagging(http, queue_name):
    s = scenario(http, queue_name)
    groups = ok(http.get("/api/v1/consumer-groups"))
    mine = {g["name"]: g for g in groups if g["queueName"] == queue_name}
    assert set(mine) == {QUEUE_MODE, s["ga"], s["gb"]}
    qm, ga, gb = mine[QUEUE_MODE], mine[s["ga"]], mine[s["gb"]]
    for g in mine.values():
        for key in ("name", "topics", "queueName", "members", "partitionsWithLag", "totalLag",
                    "maxTimeLag", "state", "subscriptionMode", "subscriptionTimestamp",
                    "subscriptionCreatedAt"):
            assert key in g
        assert g["topics"] == [queue_name]
    assert (qm["members"], qm["partitionsWithLag"], qm["totalLag"], qm["state"]) == (2, 2, 2, "Stable")
    assert (ga["members"], ga["partitionsWithLag"], ga["totalLag"], ga["state"]) == (1, 0, 0, "Stable")
    assert (gb["members"], gb["partitionsWithLag"], gb["totalLag"], gb["state"]) == (1, 1, 2, "Dead")

    detail = ok(http.get(f"/api/v1/consumer-groups/{quote(s['gb'])}"))
    assert list(detail) == [queue_name]
    (p,) = detail[queue_name]["partitions"]
    assert p["partition"] == "p2" and p["leaseActive"] is True and p["offsetLag"] == 2
    assert p["workerId"] == s["gb_msgs"][0]["leaseId"]
    assert p["totalConsumed"] == 0 and p["timeLagSeconds"] >= 0
    for key in ("lastConsumedAt", "totalConsumed", "offsetLag", "timeLagSeconds", "leaseActive"):
        assert key in p
    assert ok(http.get(f"/api/v1/consumer-groups/{queue_name}-nobody")) == {}

    lag = ok(http.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 0}))
    rows = [r for r in lag if r["queue_name"] == queue_name]
    assert {(r["consumer_group"], r["partition_name"]) for r in rows} == {
        (QUEUE_MODE, "p1"), (QUEUE_MODE, "p2"), (s["gb"], "p2")}
    for r in rows:
        assert set(r) == {"consumer_group", "queue_name", "partition_name", "partition_id",
                          "worker_id", "offset_lag", "time_lag_seconds", "lag_hours",
                          "oldest_unconsumed_at", "last_consumed_at"}
    assert not [r for r in ok(http.get("/api/v1/consumer-groups/lagging"))
                if r["queue_name"] == queue_name]          # default 3600 s
    assert http.get("/api/v1/consumer-groups/lagging",
                    params={"minLagSeconds": "soon"}).status_code == 400


def test_seek_to_end_and_to_timestamp_move_cursors_and_release_leases(http, queue_name):
    s = scenario(http, queue_name)
    gk = f"{queue_name}-gk"
    held = pop(http, queue_name, "p1", group=gk, batch=1)["messages"]
    assert [m["data"] for m in held] == [{"n": 1}]
    # lease held: another pop of the group finds nothing
    assert pop(http, queue_name, "p1", group=gk)["messages"] == []

    r = ok(http.post(f"/api/v1/consumer-groups/{quote(gk)}/queues/{quote(queue_name)}/seek",
                     json={"toEnd": True}))
    assert r == {"success": True, "consumerGroup": gk, "queueName": queue_name, "seekToEnd": True,
                 "targetTimestamp": None, "partitionsUpdated": 1,
                 "partitions": [{"partition": "p1", "from": 0, "to": 3}]}
    assert ack(http, held[0], group=gk)["success"] in (True, False)  # lease gone: no effect
    assert pop(http, queue_name, "p1", group=gk)["messages"] == []  # at the end, lease released
    push(http, queue_name, {"n": 6}, partition="p1")
    got = pop(http, queue_name, "p1", group=gk)["messages"]
    assert [m["data"] for m in got] == [{"n": 6}]

    # seek back to the timestamp of message 2: the next pop starts at message 3,
    # and the lease of the batch above is released (its ack now fails)
    created_2 = s["first"][1]["createdAt"]
    r = ok(http.post(f"/api/v1/consumer-groups/{gk}/queues/{queue_name}/seek",
                     json={"timestamp": created_2}))
    assert r["partitionsUpdated"] == 1 and r["seekToEnd"] is False
    assert r["targetTimestamp"] is not None and r["partitions"][0]["to"] == 2
    stale = ack(http, got[0], group=gk)
    assert stale["success"] is False and "lease" in stale["error"].lower()
    again = pop(http, queue_name, "p1", group=gk)["messages"]
    assert [m["data"] for m in again] == [{"n": 3}, {"n": 6}]

    # a timestamp before everything resets to the beginning
    r = ok(http.post(f"/api/v1/consumer-groups/{gk}/queues/{queue_name}/seek",
                     json={"timestamp": "2000-01-01T00:00:00Z"}))
    assert r["partitions"][0]["to"] == 0
    assert len(pop(http, queue_name, "p1", group=gk)["messages"]) == 4

    # wildcard pops see the rewound partition too (hot-list told)
    r = ok(http.post(f"/api/v1/consumer-groups/{gk}/queues/{queue_name}/seek",
                     json={"timestamp": "2000-01-01T00:00:00Z"}))
    wild = http.get(f"/api/v1/pop/queue/{queue_name}", params={
        "consumerGroup": gk, "wait": "false", "batch": 20, "partitions": 5}).json()
    assert {"n": 1} in [m["data"] for m in wild["messages"]]

    base = f"/api/v1/consumer-groups/{gk}/queues/{queue_name}/seek"
    assert http.post(base, json={}).status_code == 400
    assert http.post(base).status_code == 400                       # no body
    assert http.post(base, json={"toEnd": False}).status_code == 400
    assert http.post(base, json={"toEnd": "yes"}).status_code == 400
    assert http.post(base, json={"timestamp": "not a time"}).status_code == 400
    assert http.post(base, content=b"{").status_code == 400
    r = http.post(f"/api/v1/consumer-groups/{gk}/queues/{queue_name}-missing/seek",
                  json={"toEnd": True})
    assert r.status_code == 404 and "error" in r.json()
    # a group without cursor rows on the queue: nothing to move
    r = ok(http.post(f"/api/v1/consumer-groups/{queue_name}-none/queues/{queue_name}/seek",
                     json={"toEnd": True}))
    assert r["partitionsUpdated"] == 0


def test_partition_seek(http, queue_name):
    s = scenario(http, queue_name)
    gb = s["gb"]
    r = ok(http.post(f"/api/v1/consumer-groups/{quote(gb)}/queues/{quote(queue_name)}"
                     f"/partitions/p2/seek"))
    assert r["success"] is True and r["updated"] is True and r["partitionName"] == "p2"
    assert r["consumerGroup"] == gb and r["queueName"] == queue_name
    assert r["cursorMovedTo"]["seq"] == 2
    assert r["cursorMovedTo"]["messageId"] == s["gb_msgs"][1]["id"]
    # the lease is gone and nothing is left
    (p,) = ok(http.get(f"/api/v1/consumer-groups/{gb}"))[queue_name]["partitions"]
    assert p["leaseActive"] is False and p["offsetLag"] == 0 and p["workerId"] is None
    assert pop(http, queue_name, "p2", group=gb)["messages"] == []
    push(http, queue_name, {"n": 7}, partition="p2")
    assert [m["data"] for m in pop(http, queue_name, "p2", group=gb)["messages"]] == [{"n": 7}]
    r = http.post(f"/api/v1/consumer-groups/{gb}/queues/{queue_name}/partitions/nope/seek")
    assert r.status_code == 404
    assert r.json() == {"success": False, "error": "Partition not found"}


def test_subscription_rewrite(http, queue_name):
    scenario(http, queue_name)
    gs = f"{queue_name}-gs"
    future = "2100-01-01T00:00:00Z"
    for part in ("p1", "p2"):
        assert pop(http, queue_name, part, group=gs, subscriptionFrom=future)["messages"] == []
    wild = http.get(f"/api/v1/pop/queue/{queue_name}", params={
        "consumerGroup": gs, "wait": "false", "subscriptionFrom": future}).json()
    assert wild["messages"] == []
    push(http, queue_name, {"n": 8}, partition="p3")
    depth = ok(http.get(f"/api/v1/resources/queues/{queue_name}/depth", params={"group": gs}))
    assert depth["pending"] == 0                 # p3's message predates 2100

    r = ok(http.post(f"/api/v1/consumer-groups/{quote(gs)}/subscription",
                     json={"subscriptionTimestamp": "2000-01-01T00:00:00Z"}))
    assert r == {"success": True, "consumerGroup": gs,
                 "newTimestamp": "2000-01-01T00:00:00.000Z", "rowsUpdated": 3}
    depth = ok(http.get(f"/api/v1/resources/queues/{queue_name}/depth", params={"group": gs}))
    # existing cursors did not move; the untouched partition now starts at the beginning
    assert {p["partition"]: p["pending"] for p in depth["partitions"]} == {
        "Default": 0, "p1": 0, "p2": 0, "p3": 1}
    assert [m["data"] for m in pop(http, queue_name, "p3", group=gs)["messages"]] == [{"n": 8}]
    groups = {g["name"]: g for g in ok(http.get("/api/v1/consumer-groups"))
              if g["queueName"] == queue_name}
    assert groups[gs]["subscriptionTimestamp"] == "2000-01-01T00:00:00.000Z"

    url = f"/api/v1/consumer-groups/{gs}/subscription"
    r = http.post(url, json={})
    assert r.status_code == 400
    assert r.json() == {"error": "Missing subscriptionTimestamp in request body"}
    assert http.post(url, json={"subscriptionTimestamp": "yesterday"}).status_code == 400
    assert http.post(url, json={"subscriptionTimestamp": 5}).status_code == 400
    assert http.post(url, json=[1]).status_code == 400


def test_delete_consumer_group_reseeds(http, database, queue_name):
    s = scenario(http, queue_name)
    ga, gb = s["ga"], s["gb"]
    # ga with a subscription row of its own on p2 (kept unless deleteMetadata)
    r = ok(http.delete(f"/api/v1/consumer-groups/{quote(ga)}/queues/{quote(queue_name)}",
                       params={"deleteMetadata": "false"}))
    assert r == {"success": True, "consumerGroup": ga, "queueName": queue_name,
                 "deletedPartitions": 1, "metadataDeleted": False, "metadataRowsDeleted": 0}
    again = pop(http, queue_name, "p1", group=ga)["messages"]
    assert [m["data"] for m in again] == [{"n": 1}, {"n": 2}, {"n": 3}]

    gn = f"{queue_name}-gn"
    pop(http, queue_name, "p1", group=gn, subscriptionMode="new")
    assert db_val(database, "SELECT count(*) FROM queen.consumer_groups_metadata "
                            "WHERE consumer_group = $1", gn) == 1
    r = ok(http.delete(f"/api/v1/consumer-groups/{quote(gn)}"))
    assert r["deletedPartitions"] == 1 and r["metadataDeleted"] is True
    assert r["metadataRowsDeleted"] == 1
    assert db_val(database, "SELECT count(*) FROM queen.consumer_groups_metadata "
                            "WHERE consumer_group = $1", gn) == 0
    # no subscription left: the group starts from the beginning
    assert len(pop(http, queue_name, "p1", group=gn)["messages"]) == 3

    r = ok(http.delete(f"/api/v1/consumer-groups/{gb}", params={"deleteMetadata": "true"}))
    assert r["deletedPartitions"] == 1
    assert ok(http.get(f"/api/v1/consumer-groups/{gb}")) == {}
    # gb's lease went with its row: p2 is claimable again
    assert len(pop(http, queue_name, "p2", group=gb)["messages"]) == 2
    assert http.delete(f"/api/v1/consumer-groups/{gb}",
                       params={"deleteMetadata": "maybe"}).status_code == 400
    r = ok(http.delete(f"/api/v1/consumer-groups/{queue_name}-nobody"))
    assert r["deletedPartitions"] == 0


# -- messages ---------------------------------------------------------------

def test_message_listing_statuses(http, queue_name):
    s = scenario(http, queue_name)
    body = ok(http.get("/api/v1/messages", params={"queue": queue_name}))
    assert body["mode"] == {"hasQueueMode": True, "busGroupsCount": 2, "type": "hybrid"}
    by_data = {(m["partition"], m["transactionId"]): m for m in body["messages"]}
    assert len(body["messages"]) == 5
    status = {m["transactionId"]: m["status"] for m in body["messages"]}
    first, dead, held = s["first"], s["dead"], s["held"]
    assert status[first[0]["transactionId"]] == "completed"
    assert status[first[1]["transactionId"]] == "completed"
    assert status[held["transactionId"]] == "processing"
    assert status[dead["transactionId"]] == "dead_letter"
    assert status[s["gb_msgs"][1]["transactionId"]] == "pending"
    m = next(m for m in body["messages"] if m["transactionId"] == held["transactionId"])
    assert m["leaseExpiresAt"] is not None and m["queuePath"] == f"{queue_name}/p1"
    assert m["busStatus"] == {"consumedBy": 1, "totalGroups": 1}  # ga on p1
    for key in ("id", "transactionId", "partitionId", "queuePath", "queue", "partition",
                "namespace", "task", "status", "queueStatus", "busStatus", "traceId",
                "producerSub", "queuePriority", "createdAt", "leaseExpiresAt"):
        assert key in m
    times = [m["createdAt"] for m in body["messages"]]
    assert times == sorted(times, reverse=True)
    assert len(by_data) == 5

    only_dead = ok(http.get("/api/v1/messages", params={"queue": queue_name,
                                                        "status": "dead_letter"}))
    assert [m["transactionId"] for m in only_dead["messages"]] == [dead["transactionId"]]
    page = ok(http.get("/api/v1/messages", params={"ns": s["ns"], "limit": 2, "offset": 1}))
    assert len(page["messages"]) == 2
    assert ok(http.get("/api/v1/messages", params={"namespace": s["ns"], "partition": "p2"}
                       ))["messages"][0]["partition"] == "p2"
    old = ok(http.get("/api/v1/messages", params={"queue": queue_name,
                                                  "to": "2001-01-01T00:00:00Z",
                                                  "from": "2000-01-01T00:00:00Z"}))
    assert old["messages"] == []
    for params in ({"status": "lost"}, {"from": "nope"}, {"limit": "many"},
                   {"from": "2030-01-01T00:00:00Z", "to": "2020-01-01T00:00:00Z"}):
        r = http.get("/api/v1/messages", params=params)
        assert r.status_code == 400 and "error" in r.json(), params


def test_message_detail_and_delete_cascades(http, database, queue_name):
    s = scenario(http, queue_name)
    dead = s["dead"]
    url = f"/api/v1/messages/{dead['partitionId']}/{quote(dead['transactionId'])}"
    m = ok(http.get(url))
    assert m["payload"] == {"n": 4} and m["isEncrypted"] is True   # decrypted
    assert m["status"] == "dead_letter" and m["errorMessage"] == "boom"
    assert m["queue"] == queue_name and m["partition"] == "p2"
    assert m["queueConfig"]["leaseTime"] == 120
    assert m["mode"]["type"] == "hybrid" and m["mode"]["consumedByGroups"] == 0
    assert {g["name"] for g in m["consumerGroups"]} == {QUEUE_MODE, s["gb"]}
    gb_row = next(g for g in m["consumerGroups"] if g["name"] == s["gb"])
    assert gb_row["consumed"] is False and gb_row["leaseExpiresAt"] is not None
    held = ok(http.get(f"/api/v1/messages/{s['held']['partitionId']}/{s['held']['transactionId']}"))
    assert held["status"] == "processing" and held["leaseExpiresAt"] is not None
    assert held["payload"] == {"n": 3}

    # a trace on the message, then delete: DLQ row and traces go too
    r = ok(http.post("/api/v1/traces", json={
        "transactionId": dead["transactionId"], "partitionId": dead["partitionId"],
        "data": {"step": 1}}), 201)
    assert r["success"] is True
    r = ok(http.delete(url))
    assert r == {"success": True, "partitionId": dead["partitionId"],
                 "transactionId": dead["transactionId"], "message": "Message deleted successfully"}
    assert db_val(database, "SELECT count(*) FROM queen.dead_letter_queue d "
                            "JOIN queen.partitions p ON p.id = d.partition_id "
                            "WHERE p.id = $1::uuid", dead["partitionId"]) == 0
    assert db_val(database, "SELECT count(*) FROM queen.message_traces "
                            "WHERE partition_id = $1::uuid AND transaction_id = $2",
                  dead["partitionId"], dead["transactionId"]) == 0
    assert ok(http.get("/api/v1/dlq", params={"queue": queue_name}))["total"] == 0
    r = http.get(url)
    assert r.status_code == 404 and r.json()["error"] == "Message not found"
    r = http.delete(url)
    assert r.status_code == 404 and r.json()["success"] is False
    assert r.json()["message"] == "Message not found"
    assert http.get("/api/v1/messages/not-a-uuid/x").status_code == 400
    assert http.delete("/api/v1/messages/not-a-uuid/x").status_code == 400


# -- traces -----------------------------------------------------------------

def test_traces_round_trip(http, queue_name):
    s = scenario(http, queue_name)
    msg = s["first"][0]
    name = f"order flow/{queue_name}"
    shared = f"{queue_name}-shared"
    r = ok(http.post("/api/v1/traces", json={
        "transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
        "consumerGroup": None, "traceNames": [name, shared, name], "eventType": "step",
        "data": {"text": "picked"}}), 201)
    assert r["success"] is True and uuid.UUID(r["traceId"])
    ok(http.post("/api/v1/traces", json={
        "transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
        "consumerGroup": "grp", "traceNames": shared, "data": {"text": "packed"}}), 201)

    body = ok(http.get(f"/api/v1/traces/{msg['partitionId']}/{msg['transactionId']}"))
    assert [t["data"] for t in body["traces"]] == [{"text": "picked"}, {"text": "packed"}]
    first, second = body["traces"]
    assert first["trace_names"] == sorted([name, shared]) and first["event_type"] == "step"
    assert first["consumer_group"] == QUEUE_MODE and first["id"] == r["traceId"]
    assert second["trace_names"] == [shared] and second["event_type"] == "info"
    assert second["consumer_group"] == "grp"

    by_name = ok(http.get(f"/api/v1/traces/by-name/{quote(name)}"))
    assert by_name["total"] == 1 and by_name["traces"][0]["data"] == {"text": "picked"}
    assert by_name["traces"][0]["queue_name"] == queue_name
    by_shared = ok(http.get(f"/api/v1/traces/by-name/{quote(shared)}",
                            params={"limit": 1, "offset": 1}))
    assert by_shared["total"] == 2 and len(by_shared["traces"]) == 1
    assert by_shared["traces"][0]["data"] == {"text": "packed"}   # oldest first

    names = ok(http.get("/api/v1/traces/names", params={"search": queue_name}))
    got = {n["trace_name"]: n for n in names["trace_names"]}
    assert set(got) == {name, shared}
    assert got[shared]["trace_count"] == 2 and got[shared]["message_count"] == 1
    assert ok(http.get("/api/v1/traces/names", params={"limit": 1}))["pagination"]["limit"] == 1

    missing = http.post("/api/v1/traces", json={
        "transactionId": "nope", "partitionId": msg["partitionId"], "data": {}})
    assert missing.status_code == 404
    assert missing.json() == {"success": False, "error": "Message not found"}
    for bad in ({"partitionId": msg["partitionId"], "data": {}},
                {"transactionId": msg["transactionId"], "data": {}},
                {"transactionId": msg["transactionId"], "partitionId": msg["partitionId"]},
                {"transactionId": msg["transactionId"], "partitionId": "x", "data": {}},
                {"transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
                 "data": {}, "traceNames": [1]}):
        r = http.post("/api/v1/traces", json=bad)
        assert r.status_code == 400 and "error" in r.json(), bad
    assert http.post("/api/v1/traces").status_code == 400
    r = http.get(f"/api/v1/traces/{msg['partitionId']}/nope")
    assert r.status_code == 404
    assert http.get("/api/v1/traces/bad/nope").status_code == 400
    assert ok(http.get(f"/api/v1/traces/by-name/{queue_name}-unknown"))["traces"] == []


# -- status and analytics ---------------------------------------------------

def flush_metrics(http):
    """The collector writes its rows now (instead of at METRICS_FLUSH_MS)."""
    r = ok(http.post("/api/v1/system/jobs/metrics/run"))
    assert r.get("skipped") is False and "error" not in r, r


def test_status_routes(http, database, queue_name):
    s = scenario(http, queue_name)
    flush_metrics(http)
    body = ok(http.get("/api/v1/status", params={"queue": queue_name}))
    for key in ("timeRange", "bucketMinutes", "pointCount", "throughput", "queues", "messages",
                "leases", "deadLetterQueue", "workers", "errors", "statsAge"):
        assert key in body
    assert body["pointCount"] == len(body["throughput"]) > 0
    # measured by the collector: the queue's 5 pushed messages, 4 acks (2 + 1 dlq + ga's 3
    # ... counted per ack request row: queue mode 2 completed + 1 dlq, ga 3 completed)
    assert sum(p["ingested"] for p in body["throughput"]) == 5
    assert sum(p["processed"] for p in body["throughput"]) == 6
    assert sum(p["ackFailed"] for p in body["throughput"]) == 1
    assert sum(p["popMessages"] for p in body["throughput"]) == 2 + 1 + 1 + 3 + 2
    assert body["leases"]["active"] >= 2 and body["leases"]["partitionsWithLeases"] >= 2
    assert body["deadLetterQueue"]["totalMessages"] == 1
    assert body["deadLetterQueue"]["topErrors"] == [{"error": "boom", "count": 1}]
    assert http.get("/api/v1/status", params={"from": "x"}).status_code == 400

    body = ok(http.get("/api/v1/status/queues", params={"namespace": s["ns"]}))
    assert [q["name"] for q in body["queues"]] == [queue_name]
    assert body["queues"][0]["partitions"] == 3
    assert set(body["queues"][0]["messages"]) >= {"total", "pending", "processing"}
    assert body["pagination"]["limit"] == 100

    body = ok(http.get(f"/api/v1/status/queues/{quote(queue_name)}"))
    assert body["queue"]["name"] == queue_name and body["queue"]["config"]["leaseTime"] == 120
    assert set(body["queue"]["config"]) >= {"leaseTime", "retryLimit", "retryDelay", "ttl",
                                            "maxQueueSize", "deadLetterQueue"}
    assert body["totals"]["total"] == 5 and body["totals"]["deadLetter"] == 1
    assert body["totals"]["messages"]["total"] == 5
    parts = {p["name"]: p for p in body["partitions"]}
    # each group once: queue mode consumed 2 of p1, ga 3
    assert parts["p1"]["cursor"]["totalConsumed"] == 5
    assert set(parts["p1"]["cursor"]) >= {"totalConsumed", "batchesConsumed", "lastActivity"}
    assert http.get(f"/api/v1/status/queues/{queue_name}-missing").status_code == 404

    msgs = ok(http.get(f"/api/v1/status/queues/{queue_name}/messages", params={"limit": 3}))
    assert isinstance(msgs, list) and len(msgs) == 3
    assert set(msgs[0]) == {"id", "transactionId", "partitionId", "queuePath", "queue",
                            "partition", "status", "createdAt"}
    assert http.get(f"/api/v1/status/queues/{queue_name}-missing/messages").status_code == 404

    a = ok(http.get("/api/v1/status/analytics", params={"queue": queue_name,
                                                        "interval": "minute"}))
    assert a["interval"] == "minute" and a["totals"]["ingested"] == 5
    assert sum(p["messages"] for p in a["dataPoints"]) == 5
    assert a["totals"]["deadLettered"] == 1 and len(a["timestamps"]) == len(a["dataPoints"])
    assert http.get("/api/v1/status/analytics", params={"interval": "fortnight"}).status_code == 400
    assert ok(http.get("/api/v1/status/analytics"))["interval"] == "hour"

    ops_ = ok(http.get("/api/v1/analytics/queue-ops", params={"queue": queue_name}))
    assert sum(p["pushMessages"] for p in ops_["series"]) == 5
    assert sum(p["partitionsCreated"] for p in ops_["series"]) == 3   # Default, p1, p2
    assert ops_["queues"] == [queue_name]
    lag = ok(http.get("/api/v1/analytics/queue-lag", params={"queue": queue_name}))
    assert sum(r["popCount"] for r in lag) == 9

    buffers = ok(http.get("/api/v1/status/buffers"))
    assert {"pendingCount", "failedCount", "dbHealthy"} <= set(buffers["fileBuffer"])
    assert buffers["dbHealthy"] is True and buffers["pending"] == 0
    pg = ok(http.get("/api/v1/analytics/postgres-stats"))
    assert "messages" in {t["table"] for t in pg["tableSizes"]}
    assert pg["database"] and pg["databaseCache"]["database"] == pg["database"]


def test_metric_tables_are_read_with_filters(http, database, queue_name):
    host = f"host-{queue_name}"
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    leaf = '{"cpu": {"user_us": {"avg": 500, "min": 400, "max": 600, "last": 550}}}'
    db_fetch(database, "INSERT INTO queen.system_metrics (timestamp, hostname, port, worker_id, "
                       "sample_count, metrics) VALUES ($1, $2, 1, 'w1', 60, $3::jsonb), "
                       "($1 - interval '3 hours', $2, 1, 'w1', 60, $3::jsonb)", now, host, leaf)
    db_fetch(database, "INSERT INTO queen.worker_metrics (bucket_time, hostname, worker_id, pid, "
                       "counters) VALUES ($1, $2, 'w1', 7, '{\"ops.ack_success\": 4, "
                       "\"ops.pop_messages\": 9}')", now, host)
    db_fetch(database, "INSERT INTO queen.retention_history (queue_name, partition_name, "
                       "messages_deleted, retention_type) VALUES ($1, 'p', 3, 'retention')",
             queue_name)
    try:
        sm = ok(http.get("/api/v1/analytics/system-metrics", params={"hostname": host}))
        assert sm["replicaCount"] == 1 and sm["pointCount"] == 1              # last hour only
        point = sm["replicas"][0]["timeSeries"][0]
        assert point["metrics"]["cpu"]["user_us"] == {"avg": 500, "min": 400, "max": 600,
                                                      "last": 550}
        sm = ok(http.get("/api/v1/analytics/system-metrics", params={
            "hostname": host, "from": (now - dt.timedelta(hours=4)).isoformat()}))
        assert sm["pointCount"] == 2
        wm = ok(http.get("/api/v1/analytics/worker-metrics", params={"hostname": host,
                                                                     "workerId": "7"}))
        assert [(p["ackSuccess"], p["popMessages"]) for p in wm["timeSeries"]] == [(4, 9)]
        ret = ok(http.get("/api/v1/analytics/retention", params={"queue": queue_name}))
        assert ret["totals"]["retentionMsgs"] == 3 and ret["totals"]["eventCount"] == 1
        assert ret["series"][0]["retentionMsgs"] == 3
        st = ok(http.get("/api/v1/status"))
        assert sum(p["processed"] for p in st["throughput"]) >= 4
        assert http.get("/api/v1/analytics/system-metrics",
                        params={"to": "bad"}).status_code == 400
        assert http.get("/api/v1/analytics/worker-metrics",
                        params={"workerId": "w1"}).status_code == 400
    finally:
        db_fetch(database, "DELETE FROM queen.system_metrics WHERE hostname = $1", host)
        db_fetch(database, "DELETE FROM queen.worker_metrics WHERE hostname = $1", host)
        db_fetch(database, "DELETE FROM queen.retention_history WHERE queue_name = $1", queue_name)


# -- metrics ----------------------------------------------------------------

def test_metrics_json(http):
    body = ok(http.get("/metrics"))
    assert body["uptime"] > 0
    assert body["requests"]["total"] > 0 and body["requests"]["rate"] >= 0
    assert set(body["messages"]) >= {"total", "rate"}
    assert body["database"]["poolSize"] >= 1
    assert set(body["database"]) >= {"poolSize", "idleConnections", "waitingRequests"}
    assert body["memory"]["rss"] > 0 and "cpu" in body


def test_metrics_prometheus(http, queue_name):
    scenario(http, queue_name)
    r = http.get("/metrics/prometheus")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("queen_uptime_seconds", "queen_db_pool_size", "queen_db_pool_idle",
                 "queen_file_buffer_pending", "queen_file_buffer_failed",
                 "queen_file_buffer_db_healthy", "queen_maintenance_mode_enabled",
                 "queen_pop_maintenance_mode_enabled", "queen_queue_pending",
                 "queen_queue_processing", "queen_dlq_depth", "queen_dlq_depth_by_queue",
                 "queen_messages", "queen_leases_active", "queen_http_request_duration_seconds"):
        assert name in families, name
    assert families["queen_http_request_duration_seconds"].type == "histogram"
    routes = {s.labels.get("route") for s in families["queen_http_request_duration_seconds"].samples}
    assert any(route and "pop" in route for route in routes)
    by_queue = {s.labels["queue"]: s.value for s in families["queen_dlq_depth_by_queue"].samples}
    assert by_queue[queue_name] == 1
    assert families["queen_leases_active"].samples[0].value >= 2
    statuses = {s.labels["status"] for s in families["queen_messages"].samples}
    assert {"queued", "popped"} <= statuses
    assert families["queen_file_buffer_db_healthy"].samples[0].value == 1
    assert "queen_transport_messages" not in families       # no mesh on this broker


def test_prometheus_render_with_mesh():
    """The mesh families appear when the mesh runs (rendered from a snapshot)."""
    from broker.http.routes.ops.metrics import render
    snap = {"gauges": {"db_pool_size": 2, "db_pool_idle": 1, "db_pool_max": 10,
                       "maintenance_mode": True, "pop_maintenance_mode": False,
                       "long_polls_in_flight": 0,
                       "mesh": {"messages_sent": 5, "messages_received": 4,
                                "messages_dropped": 1, "servers_alive": 2, "servers_dead": 1}},
            "telemetry": {"uptime_s": 3.0, "requests": {"r": 1}, "errors": {},
                          "messages": {"queued": 2}, "stream_cycles": {"committed": 7}},
            "process": {}, "pool_waiting": 0, "spool": None,
            "db": {"queues": {"q": {"total": 6, "pending": 3, "processing": 1, "completed": 0,
                                    "deadLetter": 2}},
                   "dlq": [("q", 2)], "leases": 1,
                   "streams": [{"name": "sums", "state_rows": 4, "state_bytes": 512,
                                "state_partitions": 2, "cycle_partitions": 2, "cycles": 9,
                                "last_cycle_at": None}]}}
    families = {f.name: f for f in text_string_to_metric_families(render(snap).decode())}
    sent = {s.labels["dir"]: s.value for s in families["queen_transport_messages"].samples
            if s.name.endswith("_total")}
    assert sent == {"sent": 5, "received": 4, "dropped": 1}
    servers = {s.labels["state"]: s.value for s in families["queen_servers"].samples}
    assert servers == {"alive": 2, "dead": 1}
    assert families["queen_maintenance_mode_enabled"].samples[0].value == 1
    assert {s.labels["queue"]: s.value for s in families["queen_queue_pending"].samples} == {"q": 3}
    assert families["queen_dlq_depth"].samples[0].value == 2
    assert "queen_file_buffer_pending" not in families
    assert {s.labels["query"]: s.value for s in families["queen_stream_state_rows"].samples} == {
        "sums": 4}
    assert [s.value for s in families["queen_stream_cycles"].samples
            if s.name.endswith("_total")] == [7]
    assert [s.value for s in families["queen_stream_query_cycles"].samples
            if s.name.endswith("_total")] == [9]
    assert "queen_stream_last_cycle_timestamp_seconds" not in families or not \
        families["queen_stream_last_cycle_timestamp_seconds"].samples  # no cycle yet


async def test_counters_come_from_stats_table_once_populated(fresh_database):
    """Once the stats job wrote its roll-up, namespace/task/status counters read queen.stats."""
    from broker.store import ops
    from broker.store.db import Store
    store = await Store.connect(fresh_database.dsn, pool_size=2, connect_timeout_ms=5000,
                                statement_timeout_ms=5000, lock_timeout_ms=5000,
                                idle_timeout_ms=5000)
    try:
        async with store.connection() as conn:
            await conn.execute("INSERT INTO queen.queues (name, namespace, task) "
                               "VALUES ('qa', 'ns1', 't1')")
            await conn.execute("INSERT INTO queen.partitions (queue_id) "
                               "SELECT id FROM queen.queues WHERE name = 'qa'")
        rows, age = await ops.dimension(store, "namespace")
        assert age is None and rows[0]["total"] == 0            # live: empty queue
        async with store.connection() as conn:
            await conn.execute(
                "INSERT INTO queen.stats (stat_type, stat_key, total_messages, pending_messages, "
                "processing_messages, completed_messages, dead_letter_messages) VALUES "
                "('system', 'system', 10, 4, 1, 6, 2), ('namespace', 'ns1', 10, 4, 1, 6, 2), "
                "('task', 't1', 10, 4, 1, 6, 2), ('queue', 'qa', 10, 4, 1, 6, 2)")
        rows, age = await ops.dimension(store, "namespace")
        assert age is not None and age >= 0
        assert (rows[0]["key"], rows[0]["queues"], rows[0]["partitions"], rows[0]["total"],
                rows[0]["pending"], rows[0]["dead_letter"]) == ("ns1", 1, 1, 10, 4, 2)
        rows, _ = await ops.dimension(store, "task")
        assert rows[0]["key"] == "t1" and rows[0]["processing"] == 1
        totals = (await ops.overview(store))["totals"]  # what /resources/overview shows
        assert (totals["total"], totals["pending"], totals["completed"]) == (10, 4, 6)
        snap = await ops.metrics_snapshot(store)
        assert snap["queues"] == {"qa": {"total": 10, "pending": 4, "processing": 1,
                                         "completed": 6, "deadLetter": 2}}
        assert snap["leases"] == 0
        qs = await ops.queues_status(store, None, None, 10, 0)
        assert qs[0]["name"] == "qa" and qs[0]["pending"] == 4
    finally:
        await store.close()


def test_routes_answer_json_errors_for_bad_input(http):
    assert http.get("/api/v1/consumer-groups/lagging?minLagSeconds=-5").status_code == 200
    assert http.get("/api/v1/resources/partitions?limit=zz").status_code == 400
    assert http.get("/api/v1/traces/names?offset=zz").status_code == 400
    assert http.get("/api/v1/status/queues?limit=zz").status_code == 400
    assert http.get("/api/v1/analytics/retention?from=zz").status_code == 400
    long_name = "x" * 300
    assert http.get("/api/v1/resources/partitions", params={"queue": long_name}).status_code == 400
    assert http.get("/api/v1/messages", params={"queue": "a\x00b"}).status_code in (200, 400)


def test_metrics_serves_prometheus_text_to_a_scraper_and_json_to_everyone_else(http):
    """A Prometheus scrape of /metrics (Accept: text/plain or openmetrics) gets the text
    format, which parses cleanly; the official client (Accept: */*) keeps the JSON."""
    from prometheus_client.parser import text_string_to_metric_families

    scraped = http.get("/metrics", headers={
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"})
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(scraped.text)}
    assert {"queen_uptime_seconds", "queen_maintenance_mode_enabled"} <= names
    plain = http.get("/metrics", headers={"Accept": "*/*"})
    assert plain.headers["content-type"].startswith("application/json")
    assert "uptime" in plain.json()
