"""The migration routes (the reference's upgrade path): a live broker's queen schema
is copied with pg_dump | pg_restore into a second embedded PostgreSQL started here;
validate reports every table matching, and a broker started on the copy serves the
same messages. The target's password never shows in an answer or the broker's log.

The routes are off unless MIGRATION_ROUTES=true (they make the broker connect where the caller
says and send it every message); a target that cannot be reached or resolved is the caller's
mistake, never a 5xx."""
from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import Database, free_port, start_broker
from tests.waiting import wait_until

SECRET = "s3cret-target-password"
QUIET = {"METRICS_FLUSH_MS": "3600000", "STATS_INTERVAL_MS": "3600000",
         "RETENTION_INTERVAL": "3600000"}   # no background writes while the copy is compared
ON = {"MIGRATION_ROUTES": "true"}
ROUTES = [("POST", "/api/v1/migration/test-connection"), ("POST", "/api/v1/migration/start"),
          ("GET", "/api/v1/migration/status"), ("POST", "/api/v1/migration/validate"),
          ("POST", "/api/v1/migration/reset")]


@pytest.fixture(scope="module")
def migration_http(module_broker_factory):
    """A broker with the migration routes on."""
    with httpx.Client(base_url=module_broker_factory(**ON).url, timeout=60) as client:
        yield client


@pytest.fixture
def target_pg():
    """A second embedded PostgreSQL on a free port; stopped and deleted afterwards."""
    from broker.store.embedded_pg import EmbeddedPostgres
    data_dir = Path(tempfile.mkdtemp(prefix="qmig", dir="/tmp")) / "data"
    pg = EmbeddedPostgres(data_dir, port=free_port())
    pg.start()
    try:
        yield pg
    finally:
        pg.stop(mode="immediate")
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def _push(http: httpx.Client, queue: str, n: int, partition: str) -> None:
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "payload": {"n": i}} for i in range(n)]})
    assert r.status_code == 200, r.text


def _pop(http: httpx.Client, queue: str, batch: int) -> list[dict]:
    r = http.get(f"/api/v1/pop/queue/{queue}", params={"wait": "false", "batch": batch})
    assert r.status_code in (200, 204), r.text
    return r.json().get("messages", []) if r.status_code == 200 else []


def test_migration_copies_the_schema_and_a_broker_on_the_copy_serves_it(
        fresh_database, target_pg, tmp_path, queue_name):
    source = start_broker(fresh_database, tmp_path, **QUIET, **ON)
    copy_broker = None
    try:
        with httpx.Client(base_url=source.url, timeout=60) as http:
            _push(http, queue_name, 6, "p1")
            _push(http, queue_name, 4, "p2")
            taken = _pop(http, queue_name, 3)
            for m in taken:   # three acknowledged, one of them dead-lettered
                status = "dlq" if m is taken[0] else "completed"
                assert http.post("/api/v1/ack", json={
                    "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"], "status": status}).status_code == 200
            assert http.post("/api/v1/traces", json={
                "transactionId": taken[1]["transactionId"], "partitionId": taken[1]["partitionId"],
                "traceNames": ["flow"], "data": {"text": "seen"}}).status_code in (200, 201)

            conn = {"host": target_pg.host, "port": str(target_pg.port), "database": "postgres",
                    "user": "postgres", "password": SECRET, "ssl": False}
            bad = http.post("/api/v1/migration/test-connection", json={"host": "x"})
            assert bad.status_code == 400
            assert bad.json()["error"] == "host, database, and user are required"
            r = http.post("/api/v1/migration/test-connection", json=conn)
            assert r.status_code == 200 and r.json()["success"] is True, r.text
            assert r.json()["version"].startswith("PostgreSQL")
            idle = http.get("/api/v1/migration/status").json()
            assert idle == {"status": "idle", "currentStep": "", "elapsedSeconds": 0.0}

            r = http.post("/api/v1/migration/start", json={**conn, "port": target_pg.port})
            assert r.status_code == 202 and r.json()["status"] == "started", r.text
            final = wait_until(
                lambda: (s := http.get("/api/v1/migration/status").json())["status"]
                in ("complete", "error") and s, 60)
            assert final["status"] == "complete", final
            assert final["currentStep"] == "Migration complete"
            assert isinstance(final["elapsedSeconds"], float)
            assert http.post("/api/v1/migration/reset").json()["status"] == "idle"

            v = http.post("/api/v1/migration/validate", json=conn)
            assert v.status_code == 200, v.text
            body = v.json()
            tables = {t["table"]: t for t in body["tables"]}
            assert body["allMatch"] is True, [t for t in body["tables"] if not t["match"]]
            assert {"messages", "dead_letter_queue", "log_consumers", "message_traces",
                    "schema_migrations"} <= set(tables)
            assert tables["messages"]["sourceCount"] == 10
            assert tables["dead_letter_queue"]["targetCount"] == 1
            for answer in (r.text, v.text, str(final)):
                assert SECRET not in answer
            unreachable = http.post("/api/v1/migration/validate",
                                    json={**conn, "port": str(free_port())})
            assert unreachable.status_code == 422  # the caller's mistake, not a 5xx
            assert unreachable.json()["error"].startswith("Failed to connect to target")

            listed = sorted(m["transactionId"] for m in http.get(
                "/api/v1/messages", params={"queue": queue_name}).json()["messages"])
            dlq_before = http.get("/api/v1/dlq", params={"queue": queue_name}).json()
        assert SECRET not in source.log()

        copy_db = Database(target_pg.host, target_pg.port, "postgres", "postgres", "postgres")
        copy_broker = start_broker(copy_db, tmp_path, **QUIET)
        with httpx.Client(base_url=copy_broker.url, timeout=60) as http:
            copied = sorted(m["transactionId"] for m in http.get(
                "/api/v1/messages", params={"queue": queue_name}).json()["messages"])
            assert copied == listed and len(copied) == 10
            dlq_after = http.get("/api/v1/dlq", params={"queue": queue_name}).json()
            assert [m["transactionId"] for m in dlq_after["messages"]] == \
                [m["transactionId"] for m in dlq_before["messages"]]
            # the copy carries the cursors: the seven messages not yet consumed, no others
            rest = []
            while batch := _pop(http, queue_name, 10):
                rest += batch
            untouched = {m["transactionId"] for m in taken}
            assert len(rest) == 7 and not untouched & {m["transactionId"] for m in rest}
    finally:
        source.stop()
        if copy_broker is not None:
            copy_broker.stop()


def test_migration_refuses_bad_input(migration_http):
    http = migration_http
    for body, status in (({}, 400), ({"host": "h", "database": "d"}, 400),
                         ({"host": "h", "database": "d", "user": "u", "port": "x"}, 400),
                         ({"host": "h", "database": "d", "user": "u", "schema": "a; drop"}, 400)):
        r = http.post("/api/v1/migration/start", json=body)
        assert r.status_code == status, (body, r.text)
    assert http.post("/api/v1/migration/start").status_code == 400
    assert http.post("/api/v1/migration/validate", json={"host": "h"}).json()["error"] == \
        "target host, database, and user are required"
    assert http.get("/api/v1/migration/status").json()["status"] in ("idle", "complete", "error")


def test_the_routes_are_off_by_default_and_connect_nowhere(http):
    """The shared broker has no MIGRATION_ROUTES: every route is a 404 naming the switch, and
    the target the body names (a listener here) sees no connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    target = {"host": "127.0.0.1", "port": listener.getsockname()[1], "database": "postgres",
              "user": "postgres"}
    try:
        for method, path in ROUTES:
            r = http.request(method, path, json=target if method == "POST" else None)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"] == "migration_routes_off", r.text
            assert "MIGRATION_ROUTES=true" in r.json()["detail"]
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.parametrize("host, why", [
    ("no such host", "Name or service not known"),   # refused by the resolver, locally
    ("a" * 64 + ".example", "label empty or too long"),
    ("127.0.0.1", "refused"),                         # on a port nobody listens on
])
def test_a_target_that_cannot_be_reached_is_the_callers_mistake(migration_http, host, why):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))   # bound, never listened on: connections are refused
    body = {"host": host, "port": closed.getsockname()[1], "database": "d", "user": "u",
            "password": "pw-never-shown"}
    try:
        r = migration_http.post("/api/v1/migration/validate", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["success"] is False
        assert r.json()["error"].startswith("Failed to connect to target: ")
        assert why in r.json()["error"] and "pw-never-shown" not in r.text

        r = migration_http.post("/api/v1/migration/test-connection", json=body)
        assert r.status_code == 200 and r.json()["success"] is False, r.text
        assert why in r.json()["error"]

        assert migration_http.post("/api/v1/migration/reset").status_code == 200
        r = migration_http.post("/api/v1/migration/start", json=body)
        assert r.status_code == 202, r.text
        final = wait_until(
            lambda: (s := migration_http.get("/api/v1/migration/status").json())["status"]
            in ("complete", "error") and s, 30, "the copy to end")
        assert final["status"] == "error", final
        assert final["error"].startswith("Cannot connect to target: ") and why in final["error"]
    finally:
        closed.close()
