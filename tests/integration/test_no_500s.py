"""Requests that used to answer 500: a caller's mistake is a 4xx naming it, a busy
database is a 503 with Retry-After, and no stored value can make a read route fail.

Every case talks to real broker processes and a real PostgreSQL.
"""
from __future__ import annotations

import socket
import uuid

import asyncpg
import httpx
import pytest

from tests.conftest import db_fetch, db_val


def assert_error(r: httpx.Response, status: int) -> str:
    """The expected status and a JSON ``{"error": "..."}`` body; returns the message."""
    assert r.status_code == status, f"{r.status_code}: {r.text[:300]}"
    body = r.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    return body["error"]


def assert_no_driver_internals(message: str) -> None:
    for internal in ("$", "query argument", "asyncpg", "Error:", "datetime.datetime"):
        assert internal not in message, message


def stored_messages(database, queue: str) -> int:
    return db_val(database, """SELECT count(*) FROM queen.messages m
        JOIN queen.partitions p ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1""", queue)


# -- configure: non-finite numbers ----------------------------------------------------------

@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_configure_with_a_non_finite_option_is_a_400(http, database, queue_name, literal):
    body = '{"queue": "%s", "options": {"leaseTime": %s}}' % (queue_name, literal)
    r = http.post("/api/v1/configure", content=body, headers={"content-type": "application/json"})
    message = assert_error(r, 400)
    assert "leaseTime" in message
    assert db_val(database, "SELECT count(*) FROM queen.queues WHERE name = $1", queue_name) == 0


# -- timestamps outside the accepted range --------------------------------------------------

OUT_OF_RANGE = ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00", "1969-12-31T23:59:59Z",
                "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59Z"]


@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("name", ["from", "to"])
def test_status_with_a_timestamp_out_of_range_is_a_400(http, name, value):
    message = assert_error(http.get("/api/v1/status", params={name: value}), 400)
    assert name in message and "1970" in message


def test_status_over_the_whole_accepted_range_answers(http):
    r = http.get("/api/v1/status", params={"from": "1970-01-01T00:00:00Z",
                                            "to": "9999-12-30T00:00:00Z"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_pop_with_a_subscription_from_out_of_range_is_a_400_and_stores_nothing(
        http, database, queue_name, value):
    assert http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]}
                     ).status_code == 200
    group = f"g-{uuid.uuid4().hex[:8]}"
    r = http.get(f"/api/v1/pop/queue/{queue_name}",
                 params={"consumerGroup": group, "subscriptionFrom": value})
    assert "subscriptionFrom" in assert_error(r, 400)
    assert db_val(database, "SELECT count(*) FROM queen.consumer_groups_metadata "
                            "WHERE consumer_group = $1", group) == 0
    assert http.get("/api/v1/consumer-groups").status_code == 200


# -- stored values a reader cannot format ---------------------------------------------------

READ_ROUTES = [
    "/api/v1/consumer-groups", "/api/v1/consumer-groups/lagging?minLagSeconds=0",
    "/api/v1/consumer-groups/{group}", "/api/v1/resources/queues",
    "/api/v1/resources/queues/{queue}", "/api/v1/resources/overview", "/api/v1/status",
    "/api/v1/status/queues", "/api/v1/status/queues/{queue}", "/api/v1/messages",
    "/api/v1/dlq", "/metrics", "/health",
]


@pytest.fixture
def bad_timestamp_rows(http, database, queue_name):
    """A group with a cursor, and stored subscriptions at -infinity, infinity and year 1,
    as an older broker (or a hand-written row) could have left them."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]}
                     ).status_code == 200
    assert http.get(f"/api/v1/pop/queue/{queue_name}",
                    params={"consumerGroup": group}).status_code == 200
    rows = [(group, queue_name, "-infinity"), (group, "", "infinity"),
            (group + "-old", queue_name, "0001-01-01 00:00:00+00")]
    for g, q, ts in rows:
        db_fetch(database, "INSERT INTO queen.consumer_groups_metadata "
                           "(consumer_group, queue_name, namespace, subscription_mode, "
                           " subscription_timestamp) VALUES ($1, $2, $3, 'timestamp', $4::text::timestamptz)",
                 g, q, "" if q else queue_name, ts)
    yield group
    db_fetch(database, "DELETE FROM queen.consumer_groups_metadata WHERE consumer_group IN ($1, $2)",
             group, group + "-old")


def test_read_routes_report_infinite_and_ancient_stored_timestamps(http, queue_name,
                                                                   bad_timestamp_rows):
    group = bad_timestamp_rows
    for route in READ_ROUTES:
        r = http.get(route.format(group=group, queue=queue_name))
        assert r.status_code < 500, f"{route}: {r.status_code} {r.text}"
    listed = {(g["name"], g["queueName"]): g for g in http.get("/api/v1/consumer-groups").json()}
    assert listed[(group, queue_name)]["subscriptionTimestamp"] == "-infinity"
    assert listed[(group + "-old", queue_name)]["subscriptionTimestamp"] == \
        "0001-01-01T00:00:00.000Z"


# -- a request line without a leading slash -------------------------------------------------

def raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        received = b""
        while chunk := s.recv(65536):  # the broker closes after a malformed request
            received += chunk
    return received


def test_a_request_line_without_a_leading_slash_is_a_400_without_a_traceback(broker):
    before = broker.log()
    for _ in range(3):
        answer = raw_request(broker.port, b"GET health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert httpx.get(broker.url + "/health").status_code == 200  # a marker after the requests
    added = broker.log()[len(before):]
    assert "Traceback" not in added, added
    assert len(added.splitlines()) <= 3, added


# -- a busy database: 503 with Retry-After, nothing stored ----------------------------------

@pytest.fixture
async def held_partition(http, database, queue_name):
    """The queue's Default partition row locked by another session (as a long push holds it)."""
    assert http.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": 0}]}
                     ).status_code == 200
    conn = await asyncpg.connect(database.dsn)
    tx = conn.transaction()
    await tx.start()
    await conn.execute("""SELECT 1 FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                          WHERE q.name = $1 FOR UPDATE OF p""", queue_name)
    yield
    await tx.rollback()
    await conn.close()


def assert_busy(r: httpx.Response) -> None:
    message = assert_error(r, 503)
    assert r.headers.get("retry-after") == "1", r.headers
    assert_no_driver_internals(message)


def push_body(queue: str, txid: str) -> dict:
    return {"items": [{"queue": queue, "transactionId": txid, "payload": 1}]}


@pytest.mark.parametrize("timeouts", [
    {"DB_LOCK_TIMEOUT": "200"},                                   # LockNotAvailableError
    {"DB_STATEMENT_TIMEOUT": "300", "DB_LOCK_TIMEOUT": "600000"},  # QueryCanceledError
], ids=["lock_timeout", "statement_timeout"])
async def test_a_push_or_transaction_that_waits_too_long_for_a_lock_is_a_503(
        broker_factory, database, queue_name, held_partition, timeouts):
    busy = broker_factory(**timeouts)
    async with httpx.AsyncClient(base_url=busy.url, timeout=30) as client:
        assert_busy(await client.post("/api/v1/push", json=push_body(queue_name, "busy-push")))
        assert_busy(await client.post("/api/v1/transaction", json={"operations": [
            {"type": "push", **push_body(queue_name, "busy-txn")}]}))
    conn = await asyncpg.connect(database.dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM queen.messages WHERE transaction_id "
                                   "IN ('busy-push', 'busy-txn')") == 0
    finally:
        await conn.close()
    assert "Traceback" not in busy.log()


# -- values PostgreSQL refuses: the message says what was wrong, not where ------------------

def test_a_nul_character_postgresql_refuses_is_a_400_without_driver_internals(http, database,
                                                                            queue_name):
    r = http.post("/api/v1/configure", json={"queue": queue_name, "namespace": "a\u0000b"})
    message = assert_error(r, 400)
    assert "NUL" in message
    assert_no_driver_internals(message)
    r = http.post("/api/v1/ack", json={"transactionId": "t", "partitionId": str(uuid.uuid4()),
                                       "status": "failed", "error": "bad\u0000"})
    assert "NUL" in assert_error(r, 400)


# -- one request, bounded -------------------------------------------------------------------

def assert_too_many(r: httpx.Response, count: int, limit: int) -> None:
    message = assert_error(r, 413)
    assert "PUSH_MAX_ITEMS_PER_REQUEST" in message and str(limit) in message
    assert str(count) in message


def test_a_150000_item_push_is_a_413_and_stores_nothing(http, database, queue_name):
    items = [{"queue": queue_name, "payload": n} for n in range(150_000)]
    assert_too_many(http.post("/api/v1/push", json={"items": items}), 150_000, 10_000)
    assert db_val(database, "SELECT count(*) FROM queen.queues WHERE name = $1", queue_name) == 0


@pytest.fixture(scope="module")
def small_limit_broker(module_broker_factory):
    return module_broker_factory(PUSH_MAX_ITEMS_PER_REQUEST="5")


def test_push_and_transaction_item_limit_is_inclusive(small_limit_broker, database, queue_name):
    url = small_limit_broker.url
    five = [{"queue": queue_name, "payload": n} for n in range(5)]
    assert httpx.post(url + "/api/v1/push", json={"items": five}).status_code == 200
    assert_too_many(httpx.post(url + "/api/v1/push", json={"items": five + five[:1]}), 6, 5)
    # A transaction counts every pushed item of every operation, and its acks.
    ops = [{"type": "push", "items": five[:3]}, {"type": "push", "items": five[:3]}]
    assert_too_many(httpx.post(url + "/api/v1/transaction", json={"operations": ops}), 6, 5)
    assert stored_messages(database, queue_name) == 5
    r = httpx.post(url + "/api/v1/transaction", json={"operations": ops[:1]})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert stored_messages(database, queue_name) == 8
