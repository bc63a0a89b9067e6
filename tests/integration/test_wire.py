"""Wire-level contract of the broker (docs/wire-contract.md §0, §1, §3–§10, §12).

Every test talks HTTP to a real broker process backed by a real PostgreSQL; where the
contract is about what gets stored, the database is read directly with asyncpg.
Each test's docstring names the invariant it checks.
"""
from __future__ import annotations

import datetime as dt
import re
import time
import uuid

import pytest

from tests.conftest import WAKE_BOUND_S, db_fetch, db_val, parked_pops
from tests.waiting import wait_until

QUEUE_MODE = "__QUEUE_MODE__"
MICRO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
MILLI_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


# -- helpers ----------------------------------------------------------------

def push(http, queue, *payloads, partition=None, txids=None):
    items = []
    for n, payload in enumerate(payloads):
        item = {"queue": queue, "payload": payload}
        if partition is not None:
            item["partition"] = partition
        if txids is not None:
            item["transactionId"] = txids[n]
        items.append(item)
    r = http.post("/api/v1/push", json={"items": items})
    assert r.status_code == 200, r.text
    return r.json()


def pop(http, queue, partition=None, **params):
    params.setdefault("wait", "false")
    path = f"/api/v1/pop/queue/{queue}"
    if partition is not None:
        path += f"/partition/{partition}"
    r = http.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def configure(http, queue, **options):
    r = http.post("/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


def ack(http, msg, status="completed", **extra):
    body = {"transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
            "status": status, **extra}
    r = http.post("/api/v1/ack", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 1
    return out[0]


def counts_for_queue(database, queue: str) -> dict:
    return dict(db_fetch(database, """
        SELECT (SELECT count(*) FROM queen.queues WHERE name = $1) AS queues,
               (SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                 WHERE q.name = $1) AS partitions
    """, queue)[0])


def rows_for_partitions(database, pids: list[str]) -> dict:
    ids = [uuid.UUID(p) for p in pids]
    return dict(db_fetch(database, """
        SELECT (SELECT count(*) FROM queen.partitions WHERE id = ANY($1::uuid[])) AS partitions,
               (SELECT count(*) FROM queen.messages WHERE partition_id = ANY($1::uuid[])) AS messages,
               (SELECT count(*) FROM queen.log_consumers WHERE partition_id = ANY($1::uuid[])) AS log_consumers,
               (SELECT count(*) FROM queen.dead_letter_queue WHERE partition_id = ANY($1::uuid[])) AS dlq
    """, ids)[0])


def parse_z(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts[:-1] + "+00:00")


# -- push -------------------------------------------------------------------

def test_push_answers_200_with_snake_case_array_of_queued_items(http, database, queue_name):
    """Push: 200 + JSON array, one snake_case object per item, in input order, status queued;
    the rows are really in queen.messages."""
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue_name, "payload": {"a": 1}, "transactionId": "t-a"},
        {"queue": queue_name, "payload": [1, 2], "transactionId": "t-b"},
    ]})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert isinstance(body, list) and len(body) == 2
    for n, (item, txid) in enumerate(zip(body, ["t-a", "t-b"])):
        assert item["index"] == n
        assert item["status"] == "queued"
        assert item["transaction_id"] == txid
        uuid.UUID(item["message_id"])
        uuid.UUID(item["partition_id"])
        assert "messageId" not in item and "transactionId" not in item
    assert body[0]["partition_id"] == body[1]["partition_id"]
    stored = db_fetch(database, "SELECT id::text, transaction_id, payload::text FROM queen.messages "
                                "WHERE partition_id = $1::uuid ORDER BY seq",
                      uuid.UUID(body[0]["partition_id"]))
    assert [(r["id"], r["transaction_id"]) for r in stored] == \
        [(body[0]["message_id"], "t-a"), (body[1]["message_id"], "t-b")]


def test_push_generates_transaction_id_when_absent(http, queue_name):
    """Push: an item without transactionId (or with "") gets a broker-minted one."""
    r = http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1},
                                                  {"queue": queue_name, "payload": 2,
                                                   "transactionId": ""}]})
    assert r.status_code == 200
    a, b = r.json()
    assert a["status"] == b["status"] == "queued"
    assert a["transaction_id"] and b["transaction_id"] and a["transaction_id"] != b["transaction_id"]


def test_push_repeated_transaction_id_across_requests_is_duplicate(http, database, queue_name):
    """Dedup across requests: the second push of (partition, transactionId) answers
    status "duplicate" with the original message_id, and stores nothing new."""
    first = push(http, queue_name, {"v": 1}, txids=["dup-1"])[0]
    second = push(http, queue_name, {"v": 2}, txids=["dup-1"])[0]
    assert first["status"] == "queued"
    assert second["status"] == "duplicate"
    assert second["message_id"] == first["message_id"]
    assert second["transaction_id"] == "dup-1"
    n = db_val(database, "SELECT count(*) FROM queen.messages WHERE partition_id = $1::uuid",
               uuid.UUID(first["partition_id"]))
    assert n == 1
    # and the stored payload is the first one
    msg = pop(http, queue_name)["messages"][0]
    assert msg["data"] == {"v": 1}


def test_push_repeated_transaction_id_within_one_request_is_duplicate(http, database, queue_name):
    """Dedup within one request: first occurrence wins, later ones are "duplicate" with the
    first one's message_id."""
    res = push(http, queue_name, "x", "y", "z", txids=["same", "other", "same"])
    assert [r["status"] for r in res] == ["queued", "queued", "duplicate"]
    assert res[2]["message_id"] == res[0]["message_id"]
    assert [r["index"] for r in res] == [0, 1, 2]
    n = db_val(database, "SELECT count(*) FROM queen.messages WHERE partition_id = $1::uuid",
               uuid.UUID(res[0]["partition_id"]))
    assert n == 2


def test_same_transaction_id_in_different_partitions_is_not_duplicate(http, queue_name):
    """Dedup key is (partition, transactionId): another partition accepts the same id."""
    a = push(http, queue_name, 1, partition="p1", txids=["t"])[0]
    b = push(http, queue_name, 2, partition="p2", txids=["t"])[0]
    assert a["status"] == b["status"] == "queued"
    assert a["message_id"] != b["message_id"]


def test_push_empty_items_answers_201_with_empty_array(http):
    """Push with items: [] answers 201 and []."""
    r = http.post("/api/v1/push", json={"items": []})
    assert r.status_code == 201
    assert r.json() == []


def test_push_missing_queue_answers_400_queue_must_be_a_string(http):
    """Push: an item without queue → 400 {"error":"Queue must be a string"}."""
    r = http.post("/api/v1/push", json={"items": [{"payload": 1}]})
    assert r.status_code == 400
    assert r.json() == {"error": "Queue must be a string"}


def test_push_to_unknown_queue_creates_it_with_namespace_and_task_from_dotted_name(http, database,
                                                                                   queue_name):
    """Push auto-creates the queue; namespace = first dotted segment, task = second."""
    dotted = f"{queue_name}.orders.eu"
    assert counts_for_queue(database, dotted)["queues"] == 0
    push(http, dotted, {"x": 1})
    r = http.get(f"/api/v1/resources/queues/{dotted}")
    assert r.status_code == 200
    q = r.json()
    assert q["name"] == dotted
    assert q["namespace"] == queue_name
    assert q["task"] == "orders"
    assert [p["name"] for p in q["partitions"]] == ["Default"]
    row = db_fetch(database, "SELECT namespace, task, lease_time, retry_limit FROM queen.queues "
                             "WHERE name = $1", dotted)[0]
    assert (row["namespace"], row["task"]) == (queue_name, "orders")
    assert (row["lease_time"], row["retry_limit"]) == (300, 3)  # defaults


def test_push_to_undotted_queue_namespace_is_whole_name_task_empty(http, queue_name):
    """Auto-created queue without a dot: namespace = whole name, task = ""."""
    push(http, queue_name, 1)
    q = http.get(f"/api/v1/resources/queues/{queue_name}").json()
    assert (q["namespace"], q["task"]) == (queue_name, "")


def test_push_stores_any_json_payload_verbatim(http, queue_name):
    """Payloads are stored verbatim: objects, arrays, scalars, null, unicode; missing → null."""
    payloads = [{"nested": {"k": [1, 2.5, None]}}, [1, "two"], "text ✓ ünï", 42, 3.25, True, None]
    push(http, queue_name, *payloads)
    http.post("/api/v1/push", json={"items": [{"queue": queue_name}]})
    got = pop(http, queue_name, batch=20)["messages"]
    assert [m["data"] for m in got] == payloads + [None]


# -- pop --------------------------------------------------------------------

def test_pop_answers_camel_case_with_data_ids_lease_and_queue_mode_group(http, queue_name):
    """Pop: 200, camelCase; data holds the payload; transactionId, partitionId, leaseId,
    partition per message; consumerGroup __QUEUE_MODE__; createdAt has microseconds + Z."""
    pushed = push(http, queue_name, {"a": 1}, txids=["tx-1"])[0]
    body = pop(http, queue_name)
    assert body["success"] is True
    assert body["queue"] == queue_name
    assert body["partition"] == "Default"
    assert body["partitionId"] == pushed["partition_id"]
    assert body["consumerGroup"] == QUEUE_MODE
    uuid.UUID(body["leaseId"])
    assert len(body["messages"]) == 1
    m = body["messages"][0]
    assert m["data"] == {"a": 1}
    assert m["transactionId"] == "tx-1"
    assert m["id"] == pushed["message_id"]
    assert m["partitionId"] == pushed["partition_id"]
    assert m["partition"] == "Default"
    assert m["leaseId"] == body["leaseId"]
    assert m["consumerGroup"] == QUEUE_MODE
    assert MICRO_Z.match(m["createdAt"]), m["createdAt"]
    assert abs((dt.datetime.now(dt.UTC) - parse_z(m["createdAt"])).total_seconds()) < 120
    assert "transaction_id" not in m


def test_pop_delivers_in_push_order(http, queue_name):
    """A partition is a FIFO lane: a batch pop returns messages in push order."""
    push(http, queue_name, *range(10))
    got = pop(http, queue_name, batch=10)["messages"]
    assert [m["data"] for m in got] == list(range(10))


def test_pop_nothing_available_without_wait(http, queue_name):
    """wait=false with nothing available → 200 {"success":false,"error":"no_available_partition",
    "messages":[]} — for an existing, empty queue; an unknown one adds queueExists: false."""
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"})
    assert r.status_code == 200
    assert r.json() == {"success": False, "error": "no_available_partition", "messages": [],
                        "queueExists": False}
    configure(http, queue_name)
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"})
    assert r.status_code == 200
    assert r.json() == {"success": False, "error": "no_available_partition", "messages": []}


def test_pop_wildcard_on_leased_partition_is_no_available_partition(http, queue_name):
    """The only partition is leased → wildcard pop answers no_available_partition."""
    push(http, queue_name, 1, 2)
    assert len(pop(http, queue_name)["messages"]) == 1
    assert pop(http, queue_name) == {"success": False, "error": "no_available_partition",
                                     "messages": []}


def test_long_poll_timeout_answers_success_true_empty_and_null_lease(http, queue_name):
    """Long poll reaching its deadline → 200 {"success":true,"messages":[],"leaseId":null,...}."""
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "true", "timeout": "300"})
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is True
    assert body["messages"] == []
    assert body["leaseId"] is None


def test_long_poll_is_woken_by_a_push(slow_timer_broker, queue_name):
    """A parked long poll returns the message pushed while it waits, woken by that push: on
    slow_timer_broker its own re-check timer is 8 s away and its deadline 20 s."""
    import threading

    import httpx
    result = {}

    def waiter():
        with httpx.Client(base_url=slow_timer_broker.url, timeout=30) as c:
            result["body"] = c.get(f"/api/v1/pop/queue/{queue_name}",
                                   params={"wait": "true", "timeout": "20000"}).json()
            result["answered"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: parked_pops(slow_timer_broker.url) == 1, 15, "the pop to park")
    with httpx.Client(base_url=slow_timer_broker.url, timeout=30) as http:
        pushed = time.monotonic()
        push(http, queue_name, {"woke": True})
    t.join(25)
    assert result["body"]["messages"][0]["data"] == {"woke": True}
    # Only a wake answers within WAKE_BOUND_S of the push: the timer fires ~8 s after the park.
    elapsed = result["answered"] - pushed
    assert elapsed < WAKE_BOUND_S, f"answered {elapsed:.1f} s after the push: the timer, no wake"


def test_partition_route_on_leased_partition_is_lease_held(http, queue_name):
    """Partition route while another consumer holds the partition's lease → lease_held."""
    push(http, queue_name, 1, 2, partition="p1")
    first = pop(http, queue_name, "p1")
    assert first["success"] is True and first["partition"] == "p1"
    assert pop(http, queue_name, "p1") == {"success": False, "error": "lease_held", "messages": []}


def test_partition_route_unknown_partition_is_partition_not_found(http, queue_name):
    """Partition route on an unknown partition (or queue) → partition_not_found, 200."""
    assert pop(http, queue_name, "nope") == {"success": False, "error": "partition_not_found",
                                             "messages": []}
    push(http, queue_name, 1, partition="p1")
    assert pop(http, queue_name, "nope") == {"success": False, "error": "partition_not_found",
                                             "messages": []}


def test_pop_does_not_create_queue(http, database, queue_name):
    """Popping an unknown queue (any route) writes nothing."""
    pop(http, queue_name)
    pop(http, queue_name, "p")
    pop(http, queue_name, wait="true", timeout="100")
    assert counts_for_queue(database, queue_name) == {"queues": 0, "partitions": 0}


def test_batch_budget_is_shared_across_claimed_partitions(http, queue_name):
    """batch is the total budget of one pop across the partitions it claims (partitions=N),
    all claimed partitions share one leaseId, messages grouped per partition in order."""
    for p in ("p1", "p2", "p3"):
        push(http, queue_name, *[f"{p}-{i}" for i in range(3)], partition=p)
    body = pop(http, queue_name, batch=4, partitions=3)
    msgs = body["messages"]
    assert len(msgs) == 4
    assert body["partitionsClaimed"] >= 2
    assert {m["leaseId"] for m in msgs} == {body["leaseId"]}
    by_part: dict[str, list] = {}
    for m in msgs:
        by_part.setdefault(m["partition"], []).append(m["data"])
        assert m["data"].startswith(m["partition"] + "-")
    assert len(by_part) == body["partitionsClaimed"]
    for p, data in by_part.items():
        assert data == [f"{p}-{i}" for i in range(len(data))]
    # grouped: partitions are contiguous in the list
    seen = [m["partition"] for m in msgs]
    assert seen == sorted(seen, key=lambda p: seen.index(p))
    # the top-level partition/partitionId describe the first claimed partition
    assert body["partition"] == msgs[0]["partition"]
    assert body["partitionId"] == msgs[0]["partitionId"]


def test_partitions_param_defaults_to_one(http, queue_name):
    """Without partitions=N a wildcard pop claims one partition even with a large batch."""
    push(http, queue_name, 1, 2, partition="a")
    push(http, queue_name, 3, 4, partition="b")
    body = pop(http, queue_name, batch=10)
    assert body["partitionsClaimed"] == 1
    assert len({m["partition"] for m in body["messages"]}) == 1
    assert len(body["messages"]) == 2


def test_default_batch_size_comes_from_env(broker_factory, queue_name):
    """DEFAULT_BATCH_SIZE is the batch of a pop that does not say."""
    import httpx
    b = broker_factory(DEFAULT_BATCH_SIZE="3")
    with httpx.Client(base_url=b.url, timeout=30) as c:
        push(c, queue_name, *range(5))
        assert len(pop(c, queue_name)["messages"]) == 3


def test_auto_ack_returns_empty_lease_and_is_not_redelivered(http, database, queue_name):
    """autoAck=true: leaseId "" (top-level and per message), no lease left behind, cursor
    advanced: the message is never handed out again."""
    push(http, queue_name, {"once": True})
    body = pop(http, queue_name, autoAck="true")
    assert body["leaseId"] == ""
    assert [m["leaseId"] for m in body["messages"]] == [""]
    assert body["messages"][0]["data"] == {"once": True}
    assert pop(http, queue_name)["messages"] == []
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "true", "timeout": "200"})
    assert r.json()["messages"] == []
    leases = db_val(database, """SELECT count(*) FROM queen.log_consumers lc
        JOIN queen.partitions p ON p.id = lc.partition_id JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1 AND lc.lease_id IS NOT NULL AND lc.lease_expires_at > now()""", queue_name)
    assert leases == 0


def test_delayed_processing_hides_young_messages(http, queue_name):
    """delayedProcessing=N: a message is not visible until it is N seconds old."""
    configure(http, queue_name, delayedProcessing=1)
    push(http, queue_name, "late")
    assert pop(http, queue_name)["messages"] == []
    deadline = time.monotonic() + 10
    got = []
    while time.monotonic() < deadline and not got:
        got = pop(http, queue_name, wait="true", timeout="3000")["messages"]
    assert got and got[0]["data"] == "late"
    age = (dt.datetime.now(dt.UTC) - parse_z(got[0]["createdAt"])).total_seconds()
    assert age >= 0.9


def test_window_buffer_on_partition_route_reports_window_buffer_active(http, queue_name):
    """windowBuffer=N: partition route answers success:true, leaseId "", messages [],
    windowBufferActive:true while the partition has had a push in the last N seconds;
    the messages are served once the partition is quiet."""
    configure(http, queue_name, windowBuffer=1)
    push(http, queue_name, "w", partition="p")
    body = pop(http, queue_name, "p")
    assert body["success"] is True
    assert body["windowBufferActive"] is True
    assert body["messages"] == []
    assert body["leaseId"] == ""
    # wildcard: the buffered partition is not eligible
    assert pop(http, queue_name)["messages"] == []
    deadline = time.monotonic() + 10
    got = []
    while time.monotonic() < deadline and not got:
        got = pop(http, queue_name, "p", wait="true", timeout="3000")["messages"]
    assert [m["data"] for m in got] == ["w"]


# -- ack --------------------------------------------------------------------

def test_ack_requires_partition_id(http, queue_name):
    """Ack without partitionId → 400 with an error, message stays leased/unacked."""
    push(http, queue_name, 1)
    m = pop(http, queue_name)["messages"][0]
    r = http.post("/api/v1/ack", json={"transactionId": m["transactionId"], "status": "completed",
                                       "leaseId": m["leaseId"]})
    assert r.status_code == 400
    assert isinstance(r.json()["error"], str) and "partitionId" in r.json()["error"]


def test_ack_answers_one_element_array(http, queue_name):
    """Ack: JSON array with one element {index, transactionId, success, error:null, queueName,
    partitionName, leaseReleased, dlq}; the lease is released once the batch is acked."""
    push(http, queue_name, 1, partition="p")
    m = pop(http, queue_name)["messages"][0]
    res = ack(http, m, leaseId=m["leaseId"])
    assert res["index"] == 0
    assert res["transactionId"] == m["transactionId"]
    assert res["success"] is True and res["error"] is None
    assert res["queueName"] == queue_name and res["partitionName"] == "p"
    assert res["leaseReleased"] is True
    assert res["dlq"] is False


def test_ack_batch_answers_per_item_array(http, database, queue_name):
    """ack/batch: array sorted by input index, each with success, error:null, leaseReleased;
    the lease is released when the last message of the batch is acked; cursor moves."""
    push(http, queue_name, "a", "b", "c")
    msgs = pop(http, queue_name, batch=2)["messages"]
    r = http.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "status": "completed", "leaseId": m["leaseId"]} for m in msgs]})
    assert r.status_code == 200
    res = r.json()
    assert isinstance(res, list) and [x["index"] for x in res] == [0, 1]
    assert [x["transactionId"] for x in res] == [m["transactionId"] for m in msgs]
    for x in res:
        assert x["success"] is True
        assert x["error"] is None
        assert "leaseReleased" in x
    assert res[-1]["leaseReleased"] is True
    # lease released ⇒ the remaining message is immediately poppable
    assert [m["data"] for m in pop(http, queue_name)["messages"]] == ["c"]


def test_ack_batch_empty_list_answers_empty_array(http):
    """ack/batch with acknowledgments: [] → 200 []."""
    r = http.post("/api/v1/ack/batch", json={"acknowledgments": []})
    assert r.status_code == 200
    assert r.json() == []


def test_ack_of_already_completed_message_answers_success_again(http, queue_name):
    """Acking an already-completed message answers success:true again."""
    push(http, queue_name, 1)
    m = pop(http, queue_name)["messages"][0]
    assert ack(http, m, leaseId=m["leaseId"])["success"] is True
    again = ack(http, m)
    assert again["success"] is True
    assert again["error"] is None


def test_ack_with_wrong_lease_is_invalid_or_expired_lease(http, queue_name):
    """Ack with a leaseId that is not the live lease → success:false, "Invalid or expired
    lease"; the message stays leased (not acked)."""
    push(http, queue_name, 1, 2)
    m = pop(http, queue_name)["messages"][0]
    res = ack(http, m, leaseId=str(uuid.uuid4()))
    assert res["success"] is False
    assert res["error"] == "Invalid or expired lease"
    # still acked-able with the real lease
    assert ack(http, m, leaseId=m["leaseId"])["success"] is True


def test_ack_unknown_transaction_id_is_message_not_found(http, queue_name):
    """Ack of a transactionId not in that partition → success:false, "Message not found"."""
    pid = push(http, queue_name, 1)[0]["partition_id"]
    res = ack(http, {"transactionId": "no-such-tx", "partitionId": pid})
    assert res["success"] is False
    assert res["error"] == "Message not found"
    res = ack(http, {"transactionId": "no-such-tx", "partitionId": str(uuid.uuid4())})
    assert res["success"] is False
    assert res["error"] == "Message not found"


def test_nack_redelivers_and_dlq_after_retry_limit(http, queue_name):
    """failed ack: redelivered while retries remain (leaseReleased), then dead-lettered
    (dlq:true) once retryLimit is reached; retryLimit=1 ⇒ delivered at most 2 times."""
    configure(http, queue_name, retryLimit=1)
    push(http, queue_name, {"boom": 1})
    deliveries = 0
    last = None
    for _ in range(4):
        msgs = pop(http, queue_name)["messages"]
        if not msgs:
            break
        deliveries += 1
        last = ack(http, msgs[0], status="failed", error="kaput", leaseId=msgs[0]["leaseId"])
        assert last["success"] is True
    assert deliveries == 2
    assert last["dlq"] is True
    dlq = http.get("/api/v1/dlq", params={"queue": queue_name}).json()
    assert dlq["total"] == 1
    assert dlq["messages"][0]["errorMessage"] == "kaput"
    assert dlq["messages"][0]["data"] == {"boom": 1}


# -- lease ------------------------------------------------------------------

def test_lease_extend_with_empty_body_and_no_content_type(http, database, queue_name):
    """docs/wire-contract.md §1.4: lease extend with no body / no Content-Type works
    (default 60 s) and answers an object with success, expiresAt and newExpiresAt (ms + Z)."""
    configure(http, queue_name, leaseTime=5)
    push(http, queue_name, 1)
    lease = pop(http, queue_name)["leaseId"]
    r = http.post(f"/api/v1/lease/{lease}/extend", content=b"")
    assert r.status_code == 200
    assert "content-type" not in {k.lower() for k in r.request.headers.keys()}
    body = r.json()
    assert isinstance(body, dict)
    assert body["success"] is True
    assert body["error"] is None
    assert body["leaseId"] == lease
    assert MILLI_Z.match(body["expiresAt"]), body["expiresAt"]
    assert body["newExpiresAt"] == body["expiresAt"]
    remaining = (parse_z(body["expiresAt"]) - dt.datetime.now(dt.UTC)).total_seconds()
    assert 30 < remaining <= 65  # default 60 s, not the 5 s leaseTime
    stored = db_val(database, "SELECT max(lease_expires_at) FROM queen.log_consumers "
                              "WHERE lease_id = $1::uuid", uuid.UUID(lease))
    assert abs((stored - parse_z(body["expiresAt"])).total_seconds()) < 1


def test_lease_extend_with_seconds(http, queue_name):
    """Lease extend {"seconds": N}: expiry = max(current, now + N)."""
    configure(http, queue_name, leaseTime=5)
    push(http, queue_name, 1)
    lease = pop(http, queue_name)["leaseId"]
    body = http.post(f"/api/v1/lease/{lease}/extend", json={"seconds": 600}).json()
    assert body["success"] is True
    remaining = (parse_z(body["expiresAt"]) - dt.datetime.now(dt.UTC)).total_seconds()
    assert 500 < remaining <= 605


def test_lease_extend_unknown_lease_is_lease_not_found(http):
    """Extend of an unknown (well-formed) lease → 200, success:false, "Lease not found"."""
    lease = str(uuid.uuid4())
    r = http.post(f"/api/v1/lease/{lease}/extend")
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is False
    assert body["error"] == "Lease not found"
    assert body["expiresAt"] is None


def test_lease_extend_after_release_does_not_revive_lease(http, queue_name):
    """After the batch is acked (lease released) extending that lease fails."""
    push(http, queue_name, 1)
    m = pop(http, queue_name)["messages"][0]
    assert ack(http, m, leaseId=m["leaseId"])["leaseReleased"] is True
    body = http.post(f"/api/v1/lease/{m['leaseId']}/extend").json()
    assert body["success"] is False
    assert body["error"]


# -- configure --------------------------------------------------------------

def test_configure_response_shape(http, database, queue_name):
    """Configure: {"configured":true, queueId, partitionId (Default), queue, namespace, task,
    options{...all 15...}}; creates the Default partition."""
    r = http.post("/api/v1/configure", json={"queue": queue_name, "namespace": "ns", "task": "tk",
                                             "options": {"leaseTime": 30, "encryptionEnabled": False}})
    assert r.status_code == 200
    body = r.json()
    assert body["configured"] is True
    assert body["queue"] == queue_name
    assert (body["namespace"], body["task"]) == ("ns", "tk")
    uuid.UUID(body["queueId"])
    uuid.UUID(body["partitionId"])
    opts = body["options"]
    for key in ("priority", "leaseTime", "retryLimit", "retryDelay", "maxSize", "ttl",
                "deadLetterQueue", "dlqAfterMaxRetries", "delayedProcessing", "windowBuffer",
                "retentionSeconds", "completedRetentionSeconds", "retentionEnabled",
                "encryptionEnabled", "maxWaitTimeSeconds"):
        assert key in opts, key
    assert opts["leaseTime"] == 30
    assert opts["retryLimit"] == 3
    pid = db_val(database, "SELECT p.id::text FROM queen.partitions p JOIN queen.queues q "
                           "ON q.id = p.queue_id WHERE q.name = $1 AND p.name = 'Default'", queue_name)
    assert pid == body["partitionId"]


def test_configure_keeps_options_that_are_left_out(http, database, queue_name):
    """Configure merges, where the reference overwrites every option: configure leaseTime=10,
    then configure retryLimit=1 only → leaseTime is still 10."""
    assert configure(http, queue_name, leaseTime=10)["options"]["leaseTime"] == 10
    second = configure(http, queue_name, retryLimit=1)
    assert second["options"]["retryLimit"] == 1
    assert second["options"]["leaseTime"] == 10
    row = db_fetch(database, "SELECT lease_time, retry_limit FROM queen.queues WHERE name = $1",
                   queue_name)[0]
    assert (row["lease_time"], row["retry_limit"]) == (10, 1)
    # and the lease a pop takes uses it
    push(http, queue_name, 1)
    lease = pop(http, queue_name)["leaseId"]
    exp = db_val(database, "SELECT max(lease_expires_at) FROM queen.log_consumers "
                           "WHERE lease_id = $1::uuid", uuid.UUID(lease))
    remaining = (exp - dt.datetime.now(dt.UTC)).total_seconds()
    assert 0 < remaining <= 11


def test_configure_without_namespace_keeps_namespace(http, queue_name):
    """Configure leaving namespace/task out keeps the stored ones (left-out ⇒ unchanged)."""
    http.post("/api/v1/configure", json={"queue": queue_name, "namespace": "n1", "task": "t1"})
    body = configure(http, queue_name, priority=5)
    assert (body["namespace"], body["task"]) == ("n1", "t1")
    assert body["options"]["priority"] == 5


# -- queue resources / delete ----------------------------------------------

def _populate(http, queue_name) -> list[str]:
    """Two partitions with messages, a cursor row, a lease and a DLQ row."""
    configure(http, queue_name, retryLimit=0)
    pids = [push(http, queue_name, 1, 2, partition="p1")[0]["partition_id"],
            push(http, queue_name, 3, partition="p2")[0]["partition_id"]]
    m = pop(http, queue_name, "p1")["messages"][0]
    ack(http, m, status="failed", leaseId=m["leaseId"])          # → DLQ
    pop(http, queue_name, "p2")                                  # live lease
    http.get("/api/v1/pop/queue/" + queue_name, params={"consumerGroup": "g1", "wait": "false"})
    return pids


def test_delete_queue_route_cascades_to_everything(http, database, queue_name):
    """DELETE /resources/queues/{q}: {"deleted":true,"existed":true}; no partitions, messages,
    log_consumers or DLQ rows remain for it; deleting again → existed:false."""
    pids = _populate(http, queue_name)
    before = rows_for_partitions(database, pids)
    assert before["partitions"] == 2 and before["messages"] == 3
    assert before["log_consumers"] >= 2 and before["dlq"] == 1
    r = http.delete(f"/api/v1/resources/queues/{queue_name}")
    assert r.status_code == 200
    assert r.json() == {"deleted": True, "queue": queue_name, "existed": True}
    assert rows_for_partitions(database, pids) == {"partitions": 0, "messages": 0,
                                                   "log_consumers": 0, "dlq": 0}
    assert counts_for_queue(database, queue_name)["queues"] == 0
    r = http.delete(f"/api/v1/resources/queues/{queue_name}")
    assert r.status_code == 200
    assert r.json()["existed"] is False
    r = http.get(f"/api/v1/resources/queues/{queue_name}")
    assert r.status_code == 404
    assert r.json() == {"error": "Queue not found"}


def test_sql_delete_of_queue_row_cascades(http, database, queue_name):
    """Test cleanup style `DELETE FROM queen.queues WHERE name LIKE 'test-%'` cascades to
    partitions, messages, log_consumers and DLQ rows."""
    pids = _populate(http, queue_name)
    db_fetch(database, "DELETE FROM queen.queues WHERE name LIKE $1", queue_name + "%")
    assert rows_for_partitions(database, pids) == {"partitions": 0, "messages": 0,
                                                   "log_consumers": 0, "dlq": 0}


def test_queue_can_be_reused_after_delete(http, queue_name):
    """After a delete the name is fresh: a push creates it anew and old transactionIds are
    no longer duplicates."""
    push(http, queue_name, "old", txids=["t1"])
    http.delete(f"/api/v1/resources/queues/{queue_name}")
    res = push(http, queue_name, "new", txids=["t1"])[0]
    assert res["status"] == "queued"
    assert [m["data"] for m in pop(http, queue_name, batch=5)["messages"]] == ["new"]


def test_list_queues_contains_pushed_queue(http, queue_name):
    """GET /resources/queues lists queues with id, name, namespace, task, partitions, messages."""
    push(http, queue_name, 1)
    body = http.get("/api/v1/resources/queues").json()
    mine = [q for q in body["queues"] if q["name"] == queue_name]
    assert len(mine) == 1
    assert set(mine[0]) >= {"id", "name", "namespace", "task", "createdAt", "partitions", "messages"}


# -- HTTP conventions -------------------------------------------------------

CORS = {
    "access-control-allow-origin": "*",
    "access-control-allow-methods": "GET, POST, PUT, DELETE, OPTIONS",
    "access-control-allow-headers": "Content-Type, Authorization",
}


@pytest.mark.parametrize("method,path,kwargs", [
    ("GET", "/health", {}),
    ("POST", "/api/v1/push", {"json": {"items": []}}),
    ("POST", "/api/v1/push", {"json": {"items": "x"}}),       # error responses too
    ("GET", "/api/v1/pop/queue/test-cors-none", {"params": {"wait": "false"}}),
    ("GET", "/api/v1/no/such/route", {}),
])
def test_cors_headers_on_every_response(http, method, path, kwargs):
    """CORS: every JSON response carries the three Access-Control-* headers."""
    r = http.request(method, path, **kwargs)
    for k, v in CORS.items():
        assert r.headers.get(k) == v, (k, r.status_code)


@pytest.mark.parametrize("path", ["/api/v1/push", "/api/v1/pop/queue/x", "/anything/at/all"])
def test_options_preflight_is_204_without_body(http, path):
    """OPTIONS /* → 204 with CORS headers, Access-Control-Max-Age 86400, and no body."""
    r = http.options(path, headers={"Origin": "http://example.com",
                                    "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert r.content == b""
    for k, v in CORS.items():
        assert r.headers.get(k) == v
    assert r.headers.get("access-control-max-age") == "86400"
    # connection still usable after a 204 (no stray body mis-framing the next response)
    assert http.get("/health").status_code == 200


def test_unknown_route_is_404_no_such_route(http):
    """Unknown route → 404 {"error":"no_such_route"}. (``/`` is the dashboard's page.)"""
    for path in ("/api/v1/nothing", "/nothing", "/api/v2/push"):
        r = http.get(path)
        assert r.status_code == 404
        assert r.json() == {"error": "no_such_route"}


def test_health(http):
    """GET /health → 200 {"status":"healthy","database":"connected",...}."""
    r = http.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "healthy"
    assert body["database"] == "connected"
    assert body["version"] == body["brokerVersion"]  # this broker's release, not "1.0.0"
    assert "worker_id" in body and "queen" in body


def test_responses_are_json_content_type(http, queue_name):
    """Responses are application/json."""
    push(http, queue_name, 1)
    for r in (http.get("/health"), http.get(f"/api/v1/pop/queue/{queue_name}"),
              http.get("/api/v1/dlq")):
        assert r.headers["content-type"].startswith("application/json")


def test_percent_encoded_queue_name_in_path_is_decoded(http, queue_name):
    """Path segments are percent-decoded (docs/wire-contract.md §1.5): a queue with a space is
    reachable."""
    name = queue_name + " spaced"
    push(http, name, "s")
    r = http.get(f"/api/v1/pop/queue/{name.replace(' ', '%20')}", params={"wait": "false"})
    assert r.json()["messages"][0]["data"] == "s"
    assert r.json()["queue"] == name


def test_percent_encoded_queue_name_in_admin_route_is_decoded(http, queue_name):
    """The 2.6 admin client quote()s queue names: GET/DELETE /resources/queues/{quoted} must
    find the queue (docs/wire-contract.md §1.5)."""
    from urllib.parse import quote
    name = queue_name + " a/b"
    push(http, name, 1)
    r = http.get(f"/api/v1/resources/queues/{quote(name, safe='')}")
    assert r.status_code == 200, r.text
    assert r.json()["name"] == name
    r = http.delete(f"/api/v1/resources/queues/{quote(name, safe='')}")
    assert r.json()["existed"] is True


# -- dead letters -----------------------------------------------------------

def _dead_letter(http, queue_name, n: int) -> list[dict]:
    push(http, queue_name, *[{"n": i} for i in range(n)], txids=[f"d{i}" for i in range(n)])
    msgs = pop(http, queue_name, batch=n)["messages"]
    assert len(msgs) == n
    r = http.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "dlq",
         "error": f"bad {m['data']['n']}", "leaseId": m["leaseId"]} for m in msgs]})
    assert all(x["success"] and x["dlq"] for x in r.json()), r.text
    return msgs


def test_dlq_listing_total_limit_offset_and_queue_filter(http, queue_name):
    """GET /dlq: {"messages", "total", "pagination"}; total counts all matching rows;
    limit/offset page over rows; queue filter excludes other queues."""
    _dead_letter(http, queue_name, 3)
    body = http.get("/api/v1/dlq", params={"queue": queue_name}).json()
    assert body["total"] == 3
    assert len(body["messages"]) == 3
    assert {m["transactionId"] for m in body["messages"]} == {"d0", "d1", "d2"}
    for m in body["messages"]:
        assert m["queue"] == queue_name
        assert m["consumerGroup"] == QUEUE_MODE
        assert m["errorMessage"].startswith("bad ")
        assert MILLI_Z.match(m["failedAt"])
    page = http.get("/api/v1/dlq", params={"queue": queue_name, "limit": 1}).json()
    assert page["total"] == 3 and len(page["messages"]) == 1
    assert page["pagination"] == {"limit": 1, "offset": 0}
    tail = http.get("/api/v1/dlq", params={"queue": queue_name, "limit": 10, "offset": 2}).json()
    assert tail["total"] == 3 and len(tail["messages"]) == 1
    pages = [http.get("/api/v1/dlq", params={"queue": queue_name, "limit": 1, "offset": o})
             .json()["messages"][0]["transactionId"] for o in range(3)]
    assert sorted(pages) == ["d0", "d1", "d2"]
    other = http.get("/api/v1/dlq", params={"queue": queue_name + "-other"}).json()
    assert other["total"] == 0 and other["messages"] == []
    grp = http.get("/api/v1/dlq", params={"queue": queue_name, "consumerGroup": "nobody"}).json()
    assert grp["total"] == 0


def test_dlq_retry_reenqueues_a_copy_and_404_when_not_dead(http, queue_name):
    """POST /messages/{p}/{t}/retry (empty body) removes the DLQ row and re-enqueues the message:
    a later pop gets a copy with the same data; retrying a message not in the DLQ → 404."""
    msgs = _dead_letter(http, queue_name, 2)
    target = msgs[0]
    r = http.post(f"/api/v1/messages/{target['partitionId']}/{target['transactionId']}/retry")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["retried"] is True
    assert body["transactionId"] == target["transactionId"]
    dlq = http.get("/api/v1/dlq", params={"queue": queue_name}).json()
    assert dlq["total"] == 1
    assert dlq["messages"][0]["transactionId"] == msgs[1]["transactionId"]
    again = pop(http, queue_name, batch=5)["messages"]
    assert [m["data"] for m in again] == [target["data"]]
    # second retry of the same message: no longer in the DLQ
    r = http.post(f"/api/v1/messages/{target['partitionId']}/{target['transactionId']}/retry")
    assert r.status_code == 404
    assert isinstance(r.json()["error"], str)
    # never dead-lettered at all
    pid = push(http, queue_name, 1, txids=["alive"])[0]["partition_id"]
    r = http.post(f"/api/v1/messages/{pid}/alive/retry")
    assert r.status_code == 404


# -- namespace / task pop ---------------------------------------------------

def test_namespace_task_pop_returns_messages_from_matching_queues(http, queue_name):
    """GET /api/v1/pop?namespace=&task=: messages from every queue whose namespace/task match,
    each with its `queue`; queues of another task are not touched."""
    ns = queue_name
    qa, qb, qc = f"{ns}.t1.a", f"{ns}.t1.b", f"{ns}.t2.c"
    push(http, qa, "A")
    push(http, qb, "B")
    push(http, qc, "C")
    seen = []
    for _ in range(5):
        r = http.get("/api/v1/pop", params={"namespace": ns, "task": "t1", "batch": 10,
                                            "partitions": 10, "wait": "false"})
        assert r.status_code == 200
        msgs = r.json()["messages"]
        if not msgs:
            break
        for m in msgs:
            seen.append((m["queue"], m["data"]))
            ack(http, m, leaseId=m["leaseId"])
    assert sorted(seen) == [(qa, "A"), (qb, "B")]
    # namespace only: now reaches the t2 queue too
    r = http.get("/api/v1/pop", params={"namespace": ns, "wait": "false"})
    msgs = r.json()["messages"]
    assert [(m["queue"], m["data"]) for m in msgs] == [(qc, "C")]


def test_namespace_pop_without_namespace_or_task_is_400(http):
    """GET /api/v1/pop with neither namespace nor task → 400 with an error."""
    r = http.get("/api/v1/pop", params={"wait": "false"})
    assert r.status_code == 400
    assert "error" in r.json()


def test_namespace_pop_nothing_matching(http, queue_name):
    """Namespace pop with no matching queue → 200, empty messages (never 4xx/5xx)."""
    r = http.get("/api/v1/pop", params={"namespace": queue_name, "wait": "false"})
    assert r.status_code == 200
    assert r.json()["messages"] == []


# -- transaction (happy path) -----------------------------------------------

def test_transaction_acks_and_pushes_atomically(http, queue_name):
    """POST /transaction: ack + push in one go → {"transactionId","success":true,"results":[...]}
    with flattened indexes; the pushed message is poppable and the acked one is not."""
    src, dst = queue_name, queue_name + "-next"
    push(http, src, "in")
    m = pop(http, src)["messages"][0]
    r = http.post("/api/v1/transaction", json={"operations": [
        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "status": "completed", "leaseId": m["leaseId"]},
        {"type": "push", "items": [{"queue": dst, "payload": {"out": 1}, "transactionId": "o1"},
                                   {"queue": dst, "transactionId": "o2"}]},
    ], "requiredLeases": [m["leaseId"]]})
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is True
    uuid.UUID(body["transactionId"])
    res = body["results"]
    assert [x["index"] for x in res] == [0, 1, 2]
    assert [x["type"] for x in res] == ["ack", "push", "push"]
    assert all(x["success"] for x in res)
    got = pop(http, dst, batch=5)["messages"]
    assert [m2["data"] for m2 in got] == [{"out": 1}, {}]  # missing payload ⇒ {} in transactions
    assert pop(http, src)["messages"] == []


def test_transaction_with_duplicate_push_reports_duplicate_and_commits(http, queue_name):
    """docs/wire-contract.md §7: a transactional push of an existing (partition,
    transactionId) is reported as duplicate and the transaction still commits (idempotent
    retries)."""
    first = push(http, queue_name, "orig", txids=["tx-d"])[0]
    r = http.post("/api/v1/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": queue_name, "payload": "again", "transactionId": "tx-d"},
                                   {"queue": queue_name, "payload": "fresh", "transactionId": "tx-f"}]}]})
    body = r.json()
    assert body["success"] is True
    assert body["results"][0]["status"] == "duplicate"
    assert body["results"][0]["messageId"] == first["message_id"]
    assert [m["data"] for m in pop(http, queue_name, batch=5)["messages"]] == ["orig", "fresh"]


def test_transaction_with_failed_lease_commits_nothing(http, database, queue_name):
    """A transaction whose ack is fenced out (wrong lease) fails as a whole: success:false,
    error set, and its push is not committed."""
    push(http, queue_name, "in")
    m = pop(http, queue_name)["messages"][0]
    dst = queue_name + "-out"
    r = http.post("/api/v1/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": dst, "payload": 1}]},
        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "status": "completed", "leaseId": str(uuid.uuid4())},
    ]})
    assert r.status_code < 500
    body = r.json()
    assert body["success"] is False
    assert body["error"]
    assert db_val(database, """SELECT count(*) FROM queen.messages m JOIN queen.partitions p
        ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1""",
                  dst) == 0
