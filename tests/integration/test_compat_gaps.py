"""Compatibility gaps with the official clients and consistency of the operator figures:
subscription modes as the clients send them, values the clients send that we
used to refuse, one meaning of pending on every surface, truthful transaction answers
after a rollback, and HEAD on GET routes.

Real broker processes on a real PostgreSQL; the client tests go through ``queen.Queen``.
"""
from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from queen import Queen

from tests.conftest import db_fetch
from tests.waiting import wait_until_async

pytestmark = pytest.mark.timeout(90)




def push(http: httpx.Client, queue: str, values, partition: str = "Default") -> list[dict]:
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "payload": v} for v in values]})
    assert r.status_code in (200, 201), r.text
    return r.json()


async def consume_all(client: Queen, queue: str, expected: int, *, group: str | None,
                      mode: str) -> list:
    """consume() with ``subscription_mode(mode)`` until ``expected`` messages were handled
    (bounded by wait_for; the consumer stops by its limit, not by a clock)."""
    seen: list = []

    async def handler(message):
        seen.append(message["data"])

    builder = client.queue(queue).subscription_mode(mode).batch(1).limit(expected) \
        .timeout_millis(1000)
    if group:
        builder = builder.group(group)
    await asyncio.wait_for(builder.consume(handler), 30)
    return seen


# -- 1. subscription modes ---------------------------------------------------------------

@pytest.mark.parametrize("group", [None, "g-from-beginning"])
async def test_consume_from_beginning_gets_existing_messages(client, http, queue_name, group):
    """consume() with subscription_mode('from_beginning') (what the clients' docs use), with
    and without a consumer group, on a queue that already holds messages gets all of them."""
    push(http, queue_name, list(range(5)))
    assert await consume_all(client, queue_name, 5, group=group,
                             mode="from_beginning") == list(range(5))


async def test_consume_new_gets_only_later_messages(client, http, queue_name):
    """subscription_mode('new'): the group starts at its first pop, so only messages pushed
    after it are handled."""
    push(http, queue_name, ["old-1", "old-2"])
    # the group's first pop (empty) stores its subscription
    first = http.get(f"/api/v1/pop/queue/{queue_name}",
                     params={"consumerGroup": "g-new", "subscriptionMode": "new"}).json()
    assert first["messages"] == []
    push(http, queue_name, ["new-1", "new-2"])
    assert await consume_all(client, queue_name, 2, group="g-new", mode="new") == [
        "new-1", "new-2"]
    rest = http.get(f"/api/v1/pop/queue/{queue_name}",
                    params={"consumerGroup": "g-new", "subscriptionMode": "new"}).json()
    assert rest["messages"] == []


@pytest.mark.parametrize("mode", ["from_beginning", "all", "earliest", "ALL", "whatever", ""])
@pytest.mark.parametrize("route", ["wildcard", "partition", "namespace"])
def test_every_mode_but_new_starts_at_the_beginning(http, queue_name, mode, route):
    """On all three pop routes, any subscriptionMode other than new/new-only starts a new
    group at the oldest message."""
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    assert http.post("/api/v1/configure", json={"queue": queue_name, "namespace": ns}) \
        .status_code == 200
    push(http, queue_name, ["a", "b"])
    url, params = {
        "wildcard": (f"/api/v1/pop/queue/{queue_name}", {}),
        "partition": (f"/api/v1/pop/queue/{queue_name}/partition/Default", {}),
        "namespace": ("/api/v1/pop", {"namespace": ns}),
    }[route]
    r = http.get(url, params={**params, "consumerGroup": "g", "subscriptionMode": mode,
                              "batch": 10})
    assert r.status_code == 200, r.text
    assert [m["data"] for m in r.json()["messages"]] == ["a", "b"]


@pytest.mark.parametrize("mode", ["new", "new-only", "NEW"])
def test_new_modes_start_at_the_newest_message(http, queue_name, mode):
    push(http, queue_name, ["old"])
    params = {"consumerGroup": "g", "subscriptionMode": mode, "batch": 10}
    assert http.get(f"/api/v1/pop/queue/{queue_name}", params=params).json()["messages"] == []
    push(http, queue_name, ["new"])
    got = http.get(f"/api/v1/pop/queue/{queue_name}", params=params).json()["messages"]
    assert [m["data"] for m in got] == ["new"]


def test_subscription_from_wins_over_mode(http, queue_name):
    """subscriptionFrom=now wins over subscriptionMode=from_beginning."""
    push(http, queue_name, ["old"])
    params = {"consumerGroup": "g", "subscriptionMode": "from_beginning",
              "subscriptionFrom": "now", "batch": 10}
    assert http.get(f"/api/v1/pop/queue/{queue_name}", params=params).json()["messages"] == []
    push(http, queue_name, ["new"])
    got = http.get(f"/api/v1/pop/queue/{queue_name}", params=params).json()["messages"]
    assert [m["data"] for m in got] == ["new"]


def test_default_subscription_mode_accepts_every_mode(broker_factory, queue_name):
    """DEFAULT_SUBSCRIPTION_MODE takes the same values as the pop parameter: a broker
    started with from_beginning starts new groups at the oldest message, one with new-only
    at the newest."""
    for mode, expected in (("from_beginning", ["a"]), ("new-only", [])):
        b = broker_factory(DEFAULT_SUBSCRIPTION_MODE=mode)
        queue = f"{queue_name}-{mode}"
        with httpx.Client(base_url=b.url, timeout=30) as http:
            push(http, queue, ["a"])
            got = http.get(f"/api/v1/pop/queue/{queue}",
                           params={"consumerGroup": "g", "batch": 10}).json()["messages"]
            assert [m["data"] for m in got] == expected, mode
        b.stop()


# -- 4. HEAD ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/health", "/metrics", "/api/v1/resources/queues",
                                  "/api/v1/status", "/api/v1/consumer-groups"])
def test_head_answers_like_get_without_a_body(http, path):
    get = http.get(path)
    head = http.head(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert int(head.headers["content-length"]) > 0


def test_head_on_a_queue_route_and_unknown_queue(http, queue_name):
    push(http, queue_name, [1])
    assert http.head(f"/api/v1/resources/queues/{queue_name}").status_code == 200
    assert http.head("/api/v1/resources/queues/no-such-queue-" + queue_name).status_code == 404


# -- 3. transaction answers after a rollback ------------------------------------------------

def _pop_one(http: httpx.Client, queue: str) -> dict:
    body = http.get(f"/api/v1/pop/queue/{queue}", params={"batch": 1}).json()
    assert body["messages"], body
    return body["messages"][0]


def test_rolled_back_transaction_reports_no_item_as_committed(http, database, queue_name):
    """A transaction whose ack fails rolls back; its answer reports every item as rolled
    back (no messageId, nothing 'queued'), with the reason on the ack that failed."""
    push(http, queue_name, ["m"])
    msg = _pop_one(http, queue_name)
    out = f"{queue_name}-out"
    r = http.post("/api/v1/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": out, "payload": 1, "transactionId": "p-1"},
                                   {"queue": out, "payload": 2, "transactionId": "p-2"}]},
        {"type": "ack", "transactionId": msg["transactionId"],
         "partitionId": msg["partitionId"], "leaseId": msg["leaseId"]},
        {"type": "ack", "transactionId": "no-such-message", "partitionId": msg["partitionId"],
         "leaseId": msg["leaseId"]},
    ]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is False and body["error"]
    results = body["results"]
    assert [(x["index"], x["type"]) for x in results] == [
        (0, "push"), (1, "push"), (2, "ack"), (3, "ack")]
    for x in results:
        assert x["success"] is False and x["status"] == "rolled_back", x
        assert "messageId" not in x and "partitionId" not in x, x
    assert [x["transactionId"] for x in results] == [
        "p-1", "p-2", msg["transactionId"], "no-such-message"]
    assert results[2]["error"] is None
    assert results[3]["error"] == body["error"]
    # nothing was committed
    assert db_fetch(database, "SELECT count(*) FROM queen.queues WHERE name = $1", out)[0][0] \
        == 0


def test_transaction_with_dead_required_lease_reports_every_item_rolled_back(
        http, queue_name):
    """A required lease that is not live rolls the transaction back before anything runs:
    the acks under that lease carry the reason, pushes say rolled_back."""
    push(http, queue_name, ["m"])
    msg = _pop_one(http, queue_name)
    dead = str(uuid.uuid4())
    r = http.post("/api/v1/transaction", json={"requiredLeases": [dead], "operations": [
        {"type": "ack", "transactionId": msg["transactionId"],
         "partitionId": msg["partitionId"], "leaseId": dead},
        {"type": "push", "items": [{"queue": f"{queue_name}-out", "payload": 1}]},
    ]}).json()
    assert r["success"] is False and dead in r["error"]
    assert [(x["type"], x["status"], x["success"]) for x in r["results"]] == [
        ("ack", "rolled_back", False), ("push", "rolled_back", False)]
    assert r["results"][0]["error"] == r["error"]
    assert "messageId" not in r["results"][1]


# -- 2. one meaning of pending, on every surface -----------------------------------------------

FIGURES = ("total", "pending", "processing", "completed", "deadLetter")


def _figures(d: dict, names=FIGURES) -> dict:
    out = {k: d[k] for k in names}
    assert all(type(v) is int for v in out.values()), out  # integers, never floats
    return out


def _pop(http, queue, partition, group=None, batch=10) -> list[dict]:
    params = {"batch": batch, "wait": "false"}
    if group:
        params["consumerGroup"] = group
    body = http.get(f"/api/v1/pop/queue/{queue}/partition/{partition}", params=params).json()
    return body["messages"]


def _ack(http, msg, group=None, status="completed"):
    r = http.post("/api/v1/ack", json={
        "transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
        "leaseId": msg["leaseId"], "status": status, "consumerGroup": group}).json()
    assert r[0]["success"] is True, r


def _refresh_stats(http) -> None:
    """Force a stats cycle that ran after everything above committed (another broker of
    the suite may hold the stats lock for a moment: then its cycle is a skip here)."""
    for _ in range(100):
        r = http.post("/api/v1/stats/refresh").json()
        assert r["success"] is True, r
        if not r["skipped"]:
            return
    raise AssertionError("the stats lock stayed taken")


def test_every_surface_reports_the_same_figures(http, queue_name):
    """Queue mode and group A consume everything, queue mode dead-letters one message,
    group B completes one and holds two under its lease. Every surface (resources list
    and detail, partitions, status, status of the queue, namespaces, /metrics JSON,
    Prometheus) reports the same integers, per the definition in docs/operations/metrics.md."""
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    assert http.post("/api/v1/configure", json={
        "queue": queue_name, "namespace": ns, "options": {"leaseTime": 600}}).status_code == 200
    push(http, queue_name, list(range(6)))
    push(http, queue_name, ["p2-a", "p2-b"], partition="p2")
    # queue mode: completes 0..4 and p2, dead-letters 5
    msgs = _pop(http, queue_name, "Default")
    assert [m["data"] for m in msgs] == list(range(6))
    for m in msgs[:5]:
        _ack(http, m)
    _ack(http, msgs[5], status="dlq")
    for m in _pop(http, queue_name, "p2"):
        _ack(http, m)
    # group A: completes everything
    for partition in ("Default", "p2"):
        for m in _pop(http, queue_name, partition, group="A"):
            _ack(http, m, group="A")
    # group B: completes 0, holds 1 and 2; never reads p2
    _ack(http, _pop(http, queue_name, "Default", group="B", batch=1)[0], group="B")
    assert [m["data"] for m in _pop(http, queue_name, "Default", group="B", batch=2)] == [1, 2]

    # Default: 0 completed (everyone past it), 1 and 2 processing (B's lease), 3 and 4
    # pending (B has still to take them), 5 dead-lettered; p2: both completed.
    default = {"total": 6, "pending": 2, "processing": 2, "completed": 1, "deadLetter": 1}
    p2 = {"total": 2, "pending": 0, "processing": 0, "completed": 2, "deadLetter": 0}
    queue = {k: default[k] + p2[k] for k in FIGURES}
    assert queue["total"] == sum(queue[k] for k in FIGURES[1:])

    _refresh_stats(http)

    listed = [q for q in http.get("/api/v1/resources/queues").json()["queues"]
              if q["name"] == queue_name]
    assert _figures(listed[0]["messages"]) == queue

    detail = http.get(f"/api/v1/resources/queues/{queue_name}").json()
    assert _figures(detail["totals"]) == queue
    by_name = {p["name"]: _figures(p["stats"]) for p in detail["partitions"]}
    assert by_name == {"Default": default, "p2": p2}

    parts = http.get("/api/v1/resources/partitions", params={"queue": queue_name}).json()
    assert {p["name"]: (p["total"], p["depth"], p["processing"], p["deadLetter"])
            for p in parts["partitions"]} == {
        n: (f["total"], f["pending"], f["processing"], f["deadLetter"])
        for n, f in (("Default", default), ("p2", p2))}

    status_q = http.get(f"/api/v1/status/queues/{queue_name}").json()
    assert _figures(status_q["totals"]) == queue
    assert {p["name"]: _figures(p["messages"]) for p in status_q["partitions"]} == by_name

    listed = http.get("/api/v1/status/queues", params={"namespace": ns}).json()["queues"]
    assert [q["name"] for q in listed] == [queue_name]
    assert _figures(listed[0]["messages"]) == queue

    status = http.get("/api/v1/status", params={"queue": queue_name}).json()
    assert _figures(status["messages"]) == queue
    assert status["deadLetterQueue"]["totalMessages"] == queue["deadLetter"]

    namespaces = http.get("/api/v1/resources/namespaces").json()["namespaces"]
    mine = [n for n in namespaces if n["namespace"] == ns]
    assert _figures(mine[0]["messages"]) == queue

    analytics = http.get("/api/v1/status/analytics",
                         params={"queue": queue_name, "interval": "minute"}).json()
    assert analytics["totals"]["ingested"] == queue["total"]
    assert analytics["totals"]["deadLettered"] == queue["deadLetter"]

    metrics = http.get("/metrics").json()
    assert _figures(metrics["queues"][queue_name]) == queue

    from prometheus_client.parser import text_string_to_metric_families
    text = http.get("/metrics/prometheus").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    prom = {}
    for name, key in (("queen_queue_messages", "total"), ("queen_queue_pending", "pending"),
                      ("queen_queue_processing", "processing"),
                      ("queen_queue_completed", "completed"),
                      ("queen_queue_dead_letter", "deadLetter")):
        values = [s.value for s in families[name].samples if s.labels["queue"] == queue_name]
        prom[key] = int(values[0])
    assert prom == queue
    dlq = [s.value for s in families["queen_dlq_depth_by_queue"].samples
           if s.labels["queue"] == queue_name]
    assert dlq == [queue["deadLetter"]]


# -- 1b. values the clients send that the reference accepts ------------------------------------

def test_configure_accepts_a_negative_priority(http, queue_name):
    """queue(...).config({"priority": -5}).create(): the reference stores any integer
    priority; so do we (other integer options stay non-negative)."""
    r = http.post("/api/v1/configure", json={"queue": queue_name, "namespace": None,
                                             "task": None, "options": {"priority": -5}})
    assert r.status_code == 200, r.text
    assert r.json()["options"]["priority"] == -5
    assert http.post("/api/v1/configure", json={
        "queue": queue_name, "options": {"leaseTime": -1}}).status_code == 400


async def test_client_config_with_negative_priority_creates_the_queue(client, queue_name):
    result = await client.queue(queue_name).config({"priority": -1}).create()
    assert result["configured"] is True and result["options"]["priority"] == -1


def test_head_on_a_pop_route_takes_nothing(http, queue_name):
    """A pop is not safe (it takes a lease), so HEAD there is 405 and the message stays
    available to the next GET."""
    push(http, queue_name, ["m"])
    assert http.head(f"/api/v1/pop/queue/{queue_name}").status_code == 405
    got = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"}).json()
    assert [m["data"] for m in got["messages"]] == ["m"]


# -- a pop of a queue that does not exist -------------------------------------------------

def test_pop_of_a_missing_queue_says_so_in_a_200_the_clients_read_as_empty(
        http, broker, queue_name):
    """A misspelt queue answers the empty pop's 200 with queueExists: false, waiting or not,
    and logs a warning naming it; an empty queue that exists answers without the key."""
    missing = f"{queue_name}-nowhere"
    r = http.get(f"/api/v1/pop/queue/{missing}")
    assert r.status_code == 200
    assert r.json() == {"success": False, "error": "no_available_partition", "messages": [],
                        "queueExists": False}
    r = http.get(f"/api/v1/pop/queue/{missing}", params={"wait": "true", "timeout": 200})
    assert r.status_code == 200 and r.json()["queueExists"] is False
    assert f"pop on '{missing}': no such queue" in broker.log()
    http.post("/api/v1/configure", json={"queue": queue_name}).raise_for_status()
    for _ in range(2):  # the second answered from the cache of queues seen
        r = http.get(f"/api/v1/pop/queue/{queue_name}")
        assert r.status_code == 200 and "queueExists" not in r.json()


async def test_the_official_client_pops_and_consumes_a_missing_queue_unchanged(
        client, http, broker, queue_name):
    """queen-mq 2.6 reads the missing queue's answer as no message: a consume() started
    before its queue exists keeps polling (a 404 would stop it), then gets the queue's first
    message; pop() gives []."""
    seen: list = []

    async def handler(message):
        seen.append(message["data"])

    async def consume() -> None:
        await client.queue(queue_name).batch(1).limit(1).timeout_millis(300).consume(handler)

    consumer = asyncio.create_task(consume())
    await wait_until_async(lambda: f"pop on '{queue_name}': no such queue" in broker.log(), 30,
                           "the consumer's pop answered: no such queue", interval=0.1)
    assert not consumer.done()
    push(http, queue_name, [{"first": True}])
    await asyncio.wait_for(consumer, 30)
    assert seen == [{"first": True}]
    # the client's default pop long-polls: a short deadline, not the default 30 s
    assert await client.queue(f"{queue_name}-nowhere").batch(1).timeout_millis(300).pop() == []
