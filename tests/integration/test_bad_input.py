"""A caller's mistake gets a clear 4xx JSON {"error": ...} and writes NOTHING.

Every case asserts: status is the expected 4xx (and in any case < 500), the body is a JSON
object with a string `error`, and the database shows no trace of the request (no queue row,
no message, no cursor/lease change). Each test's docstring names the invariant it checks.
"""
from __future__ import annotations

import json
import threading
import uuid

import httpx
import pytest

from tests.conftest import db_fetch

# -- helpers ----------------------------------------------------------------

def assert_error(r: httpx.Response, status: int | tuple[int, ...] = 400) -> str:
    """A clear caller error: expected 4xx, JSON object with a string `error`, never 5xx."""
    assert r.status_code < 500, f"{r.status_code}: {r.text}"
    statuses = (status,) if isinstance(status, int) else status
    assert r.status_code in statuses, f"{r.status_code}: {r.text}"
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict), body
    assert isinstance(body.get("error"), str) and body["error"], body
    return body["error"]


def queue_trace(database, prefix: str) -> dict:
    """Everything stored under queues whose name starts with `prefix`."""
    return dict(db_fetch(database, """
        SELECT (SELECT count(*) FROM queen.queues WHERE starts_with(name, $1)) AS queues,
               (SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                 WHERE starts_with(q.name, $1)) AS partitions,
               (SELECT count(*) FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
                 JOIN queen.queues q ON q.id = p.queue_id WHERE starts_with(q.name, $1)) AS messages
    """, prefix)[0])


NOTHING = {"queues": 0, "partitions": 0, "messages": 0}


def consumer_state(database, queue: str) -> list[tuple]:
    """Cursor/lease/counters of every (partition, group) of a queue, plus its DLQ size."""
    rows = db_fetch(database, """
        SELECT lc.partition_id, lc.consumer_group, lc.cursor_seq, lc.lease_id, lc.lease_expires_at,
               lc.acked_count, lc.batch_retry_count, lc.total_messages_consumed
        FROM queen.log_consumers lc JOIN queen.partitions p ON p.id = lc.partition_id
        JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1
        ORDER BY 1, 2""", queue)
    dlq = db_fetch(database, """SELECT count(*) FROM queen.dead_letter_queue d
        JOIN queen.partitions p ON p.id = d.partition_id JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1""", queue)[0][0]
    return [tuple(r) for r in rows] + [("dlq", dlq)]


def queue_row(database, queue: str):
    rows = db_fetch(database, "SELECT * FROM queen.queues WHERE name = $1", queue)
    return dict(rows[0]) if rows else None


def post_raw(http, path: str, raw, content_type: str | None = "application/json"):
    headers = {"content-type": content_type} if content_type else {}
    if isinstance(raw, str):
        raw = raw.encode()
    return http.post(path, content=raw, headers=headers)


@pytest.fixture
def leased(http, queue_name):
    """A queue with two messages, the first one popped (leased) in queue mode."""
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue_name, "payload": 1, "transactionId": "m1"},
        {"queue": queue_name, "payload": 2, "transactionId": "m2"}]})
    assert r.status_code == 200
    body = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"}).json()
    return body["messages"][0]


# -- push: body shape -------------------------------------------------------

def _bad_push_bodies(q: str) -> list[tuple[str, object, str | None]]:
    """(case id, raw body or JSON-able object, expected error text or None)."""
    good = {"queue": q, "payload": {"ok": True}}
    return [
        ("malformed-json", '{"items":[{"queue":"%s","payload":1}' % q, None),
        ("trailing-garbage", '{"items":[{"queue":"%s","payload":1}]} xyz' % q, None),
        ("body-is-array", [{"items": [good]}], None),
        ("body-is-string", json.dumps(q), None),
        ("body-is-number", 42, None),
        ("body-is-null", None, None),
        ("items-missing", {"queue": q, "payload": 1}, "items array is required"),
        ("items-object", {"items": good}, "items array is required"),
        ("items-string", {"items": q}, "items array is required"),
        ("item-not-object", {"items": [good, "oops"]}, None),
        ("item-is-list", {"items": [good, [q]]}, None),
        ("queue-number", {"items": [good, {"queue": 123, "payload": 1}]}, "Queue must be a string"),
        ("queue-empty", {"items": [good, {"queue": "", "payload": 1}]}, "Queue must be a string"),
        ("queue-null", {"items": [good, {"queue": None, "payload": 1}]}, "Queue must be a string"),
        ("queue-list", {"items": [good, {"queue": [q], "payload": 1}]}, "Queue must be a string"),
        ("queue-too-long", {"items": [good, {"queue": q + "x" * 300, "payload": 1}]}, None),
        ("partition-number", {"items": [good, {"queue": q, "partition": 5}]}, "Partition must be a string"),
        ("partition-object", {"items": [good, {"queue": q, "partition": {"p": 1}}]}, "Partition must be a string"),
        ("partition-empty", {"items": [good, {"queue": q, "partition": ""}]}, None),
        ("txid-number", {"items": [good, {"queue": q, "transactionId": 7}]}, "TransactionId must be a string"),
        ("txid-bool", {"items": [good, {"queue": q, "transactionId": True}]}, "TransactionId must be a string"),
        ("txid-too-long", {"items": [good, {"queue": q, "transactionId": "t" * 300}]}, None),
        ("traceid-number", {"items": [good, {"queue": q, "traceId": 5}]}, "TraceId must be a string"),
        ("traceid-object", {"items": [good, {"queue": q, "traceId": {"id": 1}}]}, "TraceId must be a string"),
        ("traceid-not-uuid", {"items": [good, {"queue": q, "traceId": "not-a-uuid"}]}, None),
        ("traceid-not-uuid-first", {"items": [{"queue": q, "traceId": "abc"}, good]}, None),
    ]


_CASE_IDS = [c[0] for c in _bad_push_bodies("q")]


@pytest.mark.parametrize("case", _CASE_IDS)
def test_bad_push_body_is_400_and_writes_nothing(http, database, queue_name, case):
    """Push with a malformed body / invalid item → 400 {"error"}; no queue, partition or message
    row appears — not even for the valid items of the same request."""
    (_, body, expected), = [c for c in _bad_push_bodies(queue_name) if c[0] == case]
    if isinstance(body, str) and case in ("malformed-json", "trailing-garbage", "body-is-string"):
        r = post_raw(http, "/api/v1/push", body)
    else:
        r = http.post("/api/v1/push", json=body)
    err = assert_error(r, 400)
    if expected is not None:
        assert err == expected
    assert queue_trace(database, queue_name) == NOTHING


def test_non_uuid_trace_id_rejects_whole_request_across_queues(http, database, queue_name):
    """A non-UUID traceId anywhere → 400, and the valid items of the same request (other
    queues, earlier positions) are not written either."""
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue_name + "-a", "payload": 1, "traceId": str(uuid.uuid4())},
        {"queue": queue_name + "-b", "payload": 2},
        {"queue": queue_name + "-c", "payload": 3, "traceId": "1234"},
    ]})
    err = assert_error(r, 400)
    assert "TraceId" in err or "traceId" in err
    assert queue_trace(database, queue_name) == NOTHING


def test_push_valid_uuid_trace_id_is_accepted(http, database, queue_name):
    """Control case: a UUID traceId is accepted and stored."""
    trace = str(uuid.uuid4())
    r = http.post("/api/v1/push", json={"items": [{"queue": queue_name, "traceId": trace}]})
    assert r.status_code == 200 and r.json()[0]["status"] == "queued"
    stored = db_fetch(database, "SELECT trace_id::text FROM queen.messages WHERE id = $1::uuid",
                      uuid.UUID(r.json()[0]["message_id"]))
    assert stored[0][0] == trace


def test_push_body_not_utf8_is_400(http, database, queue_name):
    """Push with a body that is not UTF-8 → 400, nothing written."""
    raw = b'{"items":[{"queue":"' + queue_name.encode() + b'","payload":"\xff\xfe"}]}'
    assert_error(post_raw(http, "/api/v1/push", raw), 400)
    assert queue_trace(database, queue_name) == NOTHING


def test_push_empty_body_is_400(http, database):
    """Push with no body at all → 400 (items array is required), not 500."""
    assert_error(http.post("/api/v1/push"), 400)
    assert_error(post_raw(http, "/api/v1/push", b"   "), 400)


UNSTORABLE_PUSH = {
    "nul-in-string-payload": '{"items":[{"queue":"%(q)s","payload":"a\\u0000b"}]}',
    "nul-in-payload-key": '{"items":[{"queue":"%(q)s","payload":{"k\\u0000":1}}]}',
    "nan-payload": '{"items":[{"queue":"%(q)s","payload":NaN}]}',
    "infinity-payload": '{"items":[{"queue":"%(q)s","payload":1e999}]}',
    "lone-surrogate": '{"items":[{"queue":"%(q)s","payload":"\\ud800"}]}',
    "nul-in-queue": '{"items":[{"queue":"%(q)s\\u0000x","payload":1}]}',
    "nul-in-partition": '{"items":[{"queue":"%(q)s","partition":"p\\u0000","payload":1}]}',
    "nul-in-transaction-id": '{"items":[{"queue":"%(q)s","transactionId":"t\\u0000","payload":1}]}',
}


@pytest.mark.parametrize("case", list(UNSTORABLE_PUSH))
def test_push_unstorable_values_are_4xx_not_500(http, database, queue_name, case):
    """Values PostgreSQL cannot store (NUL characters, NaN/Infinity, lone surrogates) are the
    caller's mistake: 4xx {"error"}, never 500, nothing written."""
    r = post_raw(http, "/api/v1/push", UNSTORABLE_PUSH[case] % {"q": queue_name})
    assert_error(r, (400, 422))
    assert queue_trace(database, queue_name) == NOTHING


def test_unstorable_push_does_not_fail_concurrent_good_pushes(http, base_url, database, queue_name):
    """Pushes are folded into shared round trips; one request the database rejects must not
    fail its neighbours: concurrent good pushes all answer 200 queued."""
    good_results: list[int] = []
    errors: list[BaseException] = []

    def good(n):
        try:
            with httpx.Client(base_url=base_url, timeout=30) as c:
                for i in range(5):
                    r = c.post("/api/v1/push", json={"items": [
                        {"queue": queue_name + "-ok", "payload": {"n": n, "i": i}}]})
                    good_results.append(r.status_code)
                    assert r.json()[0]["status"] == "queued"
        except BaseException as exc:  # reported below
            errors.append(exc)

    def bad():
        with httpx.Client(base_url=base_url, timeout=30) as c:
            for _ in range(5):
                c.post("/api/v1/push", content=('{"items":[{"queue":"%s-bad","payload":"\\u0000"}]}'
                                                 % queue_name).encode(),
                       headers={"content-type": "application/json"})

    threads = [threading.Thread(target=good, args=(n,)) for n in range(4)] + \
              [threading.Thread(target=bad) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert good_results == [200] * 20
    assert queue_trace(database, queue_name + "-ok")["messages"] == 20
    assert queue_trace(database, queue_name + "-bad")["messages"] == 0


def test_oversized_body_is_413_json_and_writes_nothing(broker_factory, database, queue_name):
    """MAX_BODY_BYTES: a larger body → 413 JSON {"error"}; nothing written. A body under the
    limit still works on the same broker."""
    b = broker_factory(MAX_BODY_BYTES="2048")
    with httpx.Client(base_url=b.url, timeout=30) as c:
        small_queue = queue_name.replace("test-", "test-small-", 1)
        small = c.post("/api/v1/push", json={"items": [{"queue": small_queue,
                                                        "payload": "x" * 500}]})
        assert small.status_code == 200, small.text
        big = c.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": "x" * 5000}]})
        message = assert_error(big, 413)
        assert "MAX_BODY_BYTES" in message and "2048" in message, message
    assert queue_trace(database, queue_name) == NOTHING
    # the broker is still healthy afterwards
    with httpx.Client(base_url=b.url, timeout=30) as c:
        assert c.get("/health").status_code == 200


# -- pop --------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    {"batch": "abc"},
    {"batch": "1.5"},
    {"partitions": "many"},
    {"timeout": "soon", "wait": "true"},
    {"wait": "perhaps"},
    {"autoAck": "yes please"},
    {"subscriptionFrom": "not a time", "consumerGroup": "g"},
    {"consumerGroup": "g" * 300},
])
def test_bad_pop_parameters_are_400_and_write_nothing(http, database, queue_name, params):
    """Pop with an unparsable parameter → 400 {"error"}; no queue/cursor/subscription written."""
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false", **params})
    assert_error(r, 400)
    assert queue_trace(database, queue_name) == NOTHING
    subs = db_fetch(database, "SELECT count(*) FROM queen.consumer_groups_metadata "
                              "WHERE queue_name = $1", queue_name)[0][0]
    assert subs == 0


@pytest.mark.parametrize("route", ["/api/v1/pop/queue/{q}", "/api/v1/pop/queue/{q}/partition/p",
                                   "/api/v1/pop"])
@pytest.mark.parametrize(("name", "value"), [
    ("batch", "-1"), ("batch", "0"), ("partitions", "0"), ("partitions", "-3"),
    ("timeout", "-5"),
])
def test_pop_numbers_out_of_range_are_400_naming_the_parameter(http, database, queue_name,
                                                               route, name, value):
    """batch and partitions below 1, a negative timeout: a 400 that names the parameter
    (they were served as the nearest allowed value), and nothing written."""
    params = {"wait": "true", name: value}
    if route == "/api/v1/pop":
        params["namespace"] = queue_name
    r = http.get(route.format(q=queue_name), params=params)
    message = assert_error(r, 400)
    assert message.startswith(f"{name} must be") and value in message, message
    assert queue_trace(database, queue_name) == NOTHING


def test_bad_pop_parameter_on_existing_queue_takes_no_lease(http, database, queue_name):
    """Pop with batch=abc on a queue with messages → 400 and no lease is taken."""
    http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]})
    before = consumer_state(database, queue_name)
    assert_error(http.get(f"/api/v1/pop/queue/{queue_name}", params={"batch": "abc"}), 400)
    assert_error(http.get(f"/api/v1/pop/queue/{queue_name}/partition/Default",
                          params={"batch": "abc"}), 400)
    assert consumer_state(database, queue_name) == before
    # and the message is still there for a correct pop
    ok = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"}).json()
    assert [m["data"] for m in ok["messages"]] == [1]


@pytest.mark.parametrize("params", [
    {"batch": "99999999999999"},
    {"partitions": "99999999999999"},
    {"batch": "-5"},
])
def test_out_of_range_pop_numbers_are_not_500(http, queue_name, params):
    """Huge/negative batch or partitions are clamped or rejected with 4xx — never 500."""
    http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]})
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false", **params})
    assert r.status_code < 500, r.text


def test_nul_in_consumer_group_or_namespace_is_not_500(http, queue_name):
    """A NUL character in a query-string name is a caller mistake → 4xx, not 500."""
    r = http.get(f"/api/v1/pop/queue/{queue_name}", params={"consumerGroup": "a\x00b", "wait": "false"})
    assert_error(r, 400)
    r = http.get("/api/v1/pop", params={"namespace": "a\x00b", "wait": "false"})
    assert_error(r, 400)


# -- ack --------------------------------------------------------------------

def _ack_body(msg, **overrides):
    body = {"transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
            "status": "completed", "leaseId": msg["leaseId"]}
    for k, v in overrides.items():
        if v is _DROP:
            body.pop(k)
        else:
            body[k] = v
    return body


_DROP = object()

ACK_CASES = {
    "missing-transactionId": dict(transactionId=_DROP),
    "empty-transactionId": dict(transactionId=""),
    "number-transactionId": dict(transactionId=12),
    "missing-partitionId": dict(partitionId=_DROP),
    "number-partitionId": dict(partitionId=5),
    "non-uuid-partitionId": dict(partitionId="partition-1"),
    "invalid-status": dict(status="done-ish"),
    "number-status": dict(status=1),
    "non-uuid-leaseId": dict(leaseId="lease-1"),
    "number-consumerGroup": dict(consumerGroup=5),
}


@pytest.mark.parametrize("case", list(ACK_CASES))
def test_bad_ack_is_400_and_changes_nothing(http, database, queue_name, leased, case):
    """Ack with a missing/invalid field → 400 {"error"}; cursor, lease and DLQ unchanged."""
    before = consumer_state(database, queue_name)
    r = http.post("/api/v1/ack", json=_ack_body(leased, **ACK_CASES[case]))
    err = assert_error(r, 400)
    if case == "missing-partitionId":
        assert "partitionId" in err
    if case == "missing-transactionId":
        assert "transactionId" in err
    assert consumer_state(database, queue_name) == before


@pytest.mark.parametrize("raw", ['{"transactionId": "x",', "[]", '"x"', "17"])
def test_ack_malformed_or_non_object_body_is_400(http, raw):
    """Ack whose body is malformed JSON or not an object → 400 {"error"}."""
    assert_error(post_raw(http, "/api/v1/ack", raw), 400)


def test_ack_empty_body_is_400(http):
    """Ack with no body at all (treated as {}) → 400 for the missing transactionId."""
    assert_error(http.post("/api/v1/ack"), 400)


def test_ack_nul_in_strings_is_not_500(http, database, queue_name, leased):
    """NUL characters in ack strings (transactionId, consumerGroup, error) → 4xx, not 500."""
    before = consumer_state(database, queue_name)
    for override in ({"transactionId": "m1\x00"}, {"consumerGroup": "g\x00"},
                     {"status": "failed", "error": "boom\x00"}):
        assert_error(http.post("/api/v1/ack", json=_ack_body(leased, **override)), 400)
    assert consumer_state(database, queue_name) == before


@pytest.mark.parametrize("body", [
    {},
    {"acknowledgments": None},
    {"acknowledgments": "all"},
    {"acknowledgments": {"transactionId": "m1"}},
])
def test_ack_batch_without_acknowledgments_array_is_400(http, body):
    """ack/batch without an acknowledgments array → 400 "acknowledgments array is required"."""
    assert assert_error(http.post("/api/v1/ack/batch", json=body), 400) == \
        "acknowledgments array is required"


@pytest.mark.parametrize("bad_item", [
    "not-an-object",
    {"partitionId": "PLACEHOLDER"},
    {"transactionId": "m2"},
    {"transactionId": "m2", "partitionId": "nope"},
    {"transactionId": "m2", "partitionId": "PLACEHOLDER", "status": "weird"},
])
def test_ack_batch_with_one_bad_item_is_400_and_applies_none(http, database, queue_name, leased,
                                                             bad_item):
    """ack/batch with one invalid item → 400; the valid items of the batch are not applied."""
    if isinstance(bad_item, dict) and bad_item.get("partitionId") == "PLACEHOLDER":
        bad_item = {**bad_item, "partitionId": leased["partitionId"]}
    before = consumer_state(database, queue_name)
    r = http.post("/api/v1/ack/batch", json={"acknowledgments": [_ack_body(leased), bad_item]})
    assert_error(r, 400)
    assert consumer_state(database, queue_name) == before


# -- transaction ------------------------------------------------------------

@pytest.mark.parametrize("case", [
    "no-operations", "operations-null", "operations-string", "operations-empty",
    "op-not-object", "unknown-type", "missing-type", "push-items-missing",
    "push-items-not-list", "push-bad-item", "push-bad-trace", "ack-missing-partition",
    "ack-bad-status", "required-leases-not-uuid", "required-leases-not-list",
])
def test_bad_transaction_is_400_and_commits_nothing(http, database, queue_name, leased, case):
    """Transaction with missing/empty operations, an unknown op type, or any invalid op → 400
    {"error"}; nothing is written — not the valid push that came before it in the list, and
    the valid ack is not applied."""
    dst = queue_name + "-txn"
    good_push = {"type": "push", "items": [{"queue": dst, "payload": {"ok": 1}}]}
    good_ack = {"type": "ack", **_ack_body(leased)}
    bodies = {
        "no-operations": {},
        "operations-null": {"operations": None},
        "operations-string": {"operations": "push"},
        "operations-empty": {"operations": []},
        "op-not-object": {"operations": [good_push, good_ack, "ack"]},
        "unknown-type": {"operations": [good_push, good_ack, {"type": "delete", "queue": dst}]},
        "missing-type": {"operations": [good_push, good_ack, {"items": [{"queue": dst}]}]},
        "push-items-missing": {"operations": [good_push, good_ack, {"type": "push"}]},
        "push-items-not-list": {"operations": [good_push, good_ack, {"type": "push", "items": {}}]},
        "push-bad-item": {"operations": [good_push, good_ack,
                                         {"type": "push", "items": [{"queue": 5}]}]},
        "push-bad-trace": {"operations": [good_push, good_ack,
                                          {"type": "push", "items": [{"queue": dst, "traceId": "x"}]}]},
        "ack-missing-partition": {"operations": [good_push, good_ack,
                                                 {"type": "ack", "transactionId": "m2"}]},
        "ack-bad-status": {"operations": [good_push, {**good_ack, "status": "meh"}]},
        "required-leases-not-uuid": {"operations": [good_push, good_ack], "requiredLeases": ["x"]},
        "required-leases-not-list": {"operations": [good_push, good_ack], "requiredLeases": "x"},
    }
    before = consumer_state(database, queue_name)
    r = http.post("/api/v1/transaction", json=bodies[case])
    err = assert_error(r, 400)
    if case in ("no-operations", "operations-null", "operations-string"):
        assert err == "operations array required"
    if case == "operations-empty":
        assert err == "operations array cannot be empty"
    assert queue_trace(database, dst) == NOTHING
    assert consumer_state(database, queue_name) == before


@pytest.mark.parametrize("raw", ['{"operations": [', "[]", '"x"'])
def test_transaction_malformed_or_non_object_body_is_400(http, raw):
    """Transaction whose body is malformed JSON or not an object → 400 {"error"}."""
    assert_error(post_raw(http, "/api/v1/transaction", raw), 400)


def test_transaction_with_unstorable_push_is_not_500(http, database, queue_name):
    """A transactional push with a NUL in its payload → 4xx, nothing written."""
    raw = ('{"operations":[{"type":"push","items":[{"queue":"%s","payload":1}]},'
           '{"type":"push","items":[{"queue":"%s","payload":"\\u0000"}]}]}' % (queue_name, queue_name))
    r = post_raw(http, "/api/v1/transaction", raw)
    assert r.status_code < 500, r.text
    if r.status_code == 200:  # reported in-band: must then be a failed, uncommitted transaction
        assert r.json()["success"] is False
    assert queue_trace(database, queue_name) == NOTHING


# -- lease extend -----------------------------------------------------------

def test_lease_extend_non_uuid_lease_is_400(http):
    """Lease extend with a non-UUID lease id → 400 {"error"}."""
    assert_error(http.post("/api/v1/lease/not-a-uuid/extend"), 400)
    assert_error(http.post("/api/v1/lease/12345/extend", json={"seconds": 30}), 400)


@pytest.mark.parametrize("seconds", ["30", 1.5, True, [30], {"s": 1}, 0, -5, 10**30])
def test_lease_extend_bad_seconds_is_400_and_lease_unchanged(http, database, queue_name, leased,
                                                             seconds):
    """Lease extend with non-integer or out-of-range seconds → 400; lease expiry unchanged."""
    before = consumer_state(database, queue_name)
    r = http.post(f"/api/v1/lease/{leased['leaseId']}/extend", json={"seconds": seconds})
    assert_error(r, 400)
    assert consumer_state(database, queue_name) == before


@pytest.mark.parametrize("raw", ['{"seconds": ', "[30]", '"x"'])
def test_lease_extend_malformed_or_non_object_body_is_400(http, raw):
    """Lease extend whose body is malformed JSON or not an object → 400 {"error"}."""
    assert_error(post_raw(http, f"/api/v1/lease/{uuid.uuid4()}/extend", raw), 400)


def test_lease_extend_unknown_lease_is_200_lease_not_found(http):
    """Unknown (well-formed) lease → 200 {"success":false,"error":"Lease not found"}."""
    r = http.post(f"/api/v1/lease/{uuid.uuid4()}/extend", json={"seconds": 30})
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is False
    assert body["error"] == "Lease not found"


# -- configure --------------------------------------------------------------

@pytest.mark.parametrize("case", [
    "no-queue", "queue-number", "queue-empty", "queue-too-long", "options-list",
    "options-string", "leaseTime-string", "leaseTime-float", "leaseTime-negative",
    "leaseTime-huge", "leaseTime-bool", "retryLimit-list", "encryptionEnabled-string",
    "retentionEnabled-int",
])
def test_bad_configure_is_400_and_writes_nothing(http, database, queue_name, case):
    """Configure without a queue or with options of the wrong type → 400 {"error"}; no queue
    row is created."""
    q = queue_name
    bodies = {
        "no-queue": {"options": {"leaseTime": 10}, "namespace": q},
        "queue-number": {"queue": 7},
        "queue-empty": {"queue": ""},
        "queue-too-long": {"queue": q + "x" * 300},
        "options-list": {"queue": q, "options": [1, 2]},
        "options-string": {"queue": q, "options": "leaseTime=10"},
        "leaseTime-string": {"queue": q, "options": {"leaseTime": "10"}},
        "leaseTime-float": {"queue": q, "options": {"leaseTime": 1.5}},
        "leaseTime-negative": {"queue": q, "options": {"leaseTime": -1}},
        "leaseTime-huge": {"queue": q, "options": {"leaseTime": 2**40}},
        "leaseTime-bool": {"queue": q, "options": {"leaseTime": True}},
        "retryLimit-list": {"queue": q, "options": {"retryLimit": [3]}},
        "encryptionEnabled-string": {"queue": q, "options": {"encryptionEnabled": "yes"}},
        "retentionEnabled-int": {"queue": q, "options": {"retentionEnabled": 1}},
    }
    r = http.post("/api/v1/configure", json=bodies[case])
    err = assert_error(r, 400)
    if case in ("no-queue", "queue-number", "queue-empty"):
        assert err == "queue is required"
    assert queue_trace(database, q) == NOTHING


def test_bad_configure_of_existing_queue_changes_nothing(http, database, queue_name):
    """A rejected configure leaves an existing queue's options untouched (no partial update)."""
    r = http.post("/api/v1/configure", json={"queue": queue_name, "options": {"leaseTime": 10}})
    assert r.status_code == 200
    before = queue_row(database, queue_name)
    r = http.post("/api/v1/configure", json={"queue": queue_name,
                                             "options": {"retryLimit": 1, "leaseTime": "x"}})
    assert_error(r, 400)
    after = queue_row(database, queue_name)
    assert after == before


@pytest.mark.parametrize("raw", ['{"queue": ', "[]", '"q"'])
def test_configure_malformed_or_non_object_body_is_400(http, raw):
    """Configure whose body is malformed JSON or not an object → 400 {"error"}."""
    assert_error(post_raw(http, "/api/v1/configure", raw), 400)


def test_configure_nul_in_names_is_not_500(http, database, queue_name):
    """NUL in the queue/namespace name → 4xx, nothing written."""
    assert_error(http.post("/api/v1/configure", json={"queue": queue_name + "\x00"}), 400)
    assert_error(http.post("/api/v1/configure", json={"queue": queue_name, "namespace": "n\x00"}),
                 400)
    assert queue_trace(database, queue_name) == NOTHING


# -- dlq / retry ------------------------------------------------------------

@pytest.mark.parametrize("params", [{"limit": "ten"}, {"offset": "x"}, {"from": "yesterday"},
                                    {"to": "2026-13-45"}])
def test_bad_dlq_query_is_400(http, params):
    """GET /dlq with an unparsable limit/offset/from/to → 400 {"error"}."""
    assert_error(http.get("/api/v1/dlq", params=params), 400)


@pytest.mark.parametrize("params", [{"offset": "99999999999999999999"}, {"queue": "a\x00b"}])
def test_out_of_range_dlq_query_is_not_500(http, params):
    """GET /dlq with a huge offset or a NUL in a name is clamped/rejected — never 500."""
    r = http.get("/api/v1/dlq", params=params)
    assert r.status_code < 500, r.text


def test_retry_with_non_uuid_partition_is_400(http):
    """POST /messages/{partitionId}/{tx}/retry with a non-UUID partitionId → 400 {"error"}."""
    assert_error(http.post("/api/v1/messages/not-a-uuid/tx/retry"), 400)


def test_retry_of_unknown_message_is_404(http):
    """Retry of a message not in the DLQ → 404 {"error"}."""
    assert_error(http.post(f"/api/v1/messages/{uuid.uuid4()}/tx/retry"), 404)


# -- routes / methods -------------------------------------------------------

@pytest.mark.parametrize("method,path", [
    ("GET", "/api/v1/push"),
    ("DELETE", "/api/v1/ack"),
    ("PUT", "/api/v1/configure"),
    ("POST", "/health"),
])
def test_wrong_method_is_4xx_json(http, method, path):
    """A known path with the wrong method → 4xx JSON {"error"}, never 500."""
    assert_error(http.request(method, path), (404, 405))
