"""Acknowledged means durable on every path, through HTTP against
real brokers and a real PostgreSQL.

* A push is acknowledged (``queued`` / ``buffered``) only if PostgreSQL will
  take it, on the direct path and the spool path alike; a bad push is refused
  up front and never costs another client its acknowledged pushes.
* Spooled events PostgreSQL still refuses (files of older versions) are set
  aside one by one in a quarantine an operator can list, replay and discard.
* The spool has a byte cap: past it a push answers 503, never ``buffered``.

Each test runs its brokers on a database of its own (maintenance flags are
cluster-wide state).
"""
from __future__ import annotations

import json as stdjson
import uuid
from pathlib import Path

import httpx
import pytest

from actors.spool.records import encode_legacy_records
from tests.conftest import db_fetch, db_val, start_broker
from tests.waiting import wait_until

POISON_BODIES = {
    "nul-payload": '{"items":[{"queue":"%(q)s","partition":"p1","payload":"a\\u0000b"}]}',
    "nan-payload": '{"items":[{"queue":"%(q)s","partition":"p1","payload":{"x":NaN}}]}',
    "nul-queue": '{"items":[{"queue":"%(q)s\\u0000","partition":"p1","payload":1}]}',
    "braced-trace": '{"items":[{"queue":"%(q)s","partition":"p1","payload":1,'
                    '"traceId":"{0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a}"}]}',
    "lone-surrogate": '{"items":[{"queue":"%(q)s","partition":"p1","payload":"\\ud800"}]}',
}


def stored(database, queue: str) -> list[tuple[str, str]]:
    rows = db_fetch(database, (
        "SELECT p.name, m.transaction_id FROM queen.messages m "
        "JOIN queen.partitions p ON p.id = m.partition_id "
        "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY p.name, m.seq"), queue)
    return [(r["name"], r["transaction_id"]) for r in rows]


def maintenance(http: httpx.Client, enabled: bool) -> None:
    assert http.post("/api/v1/system/maintenance", json={"enabled": enabled}).status_code == 200


@pytest.fixture
def lone_broker(fresh_database, tmp_path):
    started = []

    def make(**env: str):
        b = start_broker(fresh_database, tmp_path, **env)
        started.append(b)
        return b

    yield fresh_database, make
    for b in started:
        b.stop()


def test_poison_pushes_during_maintenance_are_refused_and_cost_nobody_anything(lone_broker):
    """Poison among honest pushes: honest producers get ``buffered`` during push
    maintenance, poison pushes between them; every poison push is refused with
    400 up front, and when maintenance ends every honest item lands exactly
    once, in per-partition order, with nothing quarantined."""
    database, make = lone_broker
    b = make()
    queue = f"poison-{uuid.uuid4().hex[:8]}"
    sent: dict[str, list[str]] = {"p1": [], "p2": [], "p3": []}
    with httpx.Client(base_url=b.url, timeout=30) as http:
        maintenance(http, True)
        for i in range(20):
            for partition in sent:
                txid = f"{partition}-{i:03d}"
                r = http.post("/api/v1/push", json={"items": [
                    {"queue": queue, "partition": partition, "transactionId": txid,
                     "payload": {"i": i}}]})
                assert r.status_code == 201 and r.json()[0]["status"] == "buffered"
                sent[partition].append(txid)
            name = list(POISON_BODIES)[i % len(POISON_BODIES)]
            r = http.post("/api/v1/push", content=(POISON_BODIES[name] % {"q": queue}).encode(),
                          headers={"content-type": "application/json"})
            assert r.status_code == 400, (name, r.text)
            assert "items[0]" in r.json()["error"], r.text  # names the item and the field
        assert http.get("/health").json()["spool"]["pendingCount"] == 60
        maintenance(http, False)
        wait_until(lambda: len(stored(database, queue)) >= 60, 30, "the drain")
        rows = stored(database, queue)
        for partition, txids in sent.items():
            assert [t for p, t in rows if p == partition] == txids
        assert len(rows) == 60
        health = http.get("/health").json()["spool"]
        assert health["quarantinedEvents"] == 0 and health["pendingCount"] == 0
        assert http.get("/api/v1/system/spool/quarantine").json() == {"count": 0, "entries": []}


def _write_spool_file(directory: Path, name: str, events: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(encode_legacy_records(events))


def _event(queue: str, partition: str, txid: str, payload) -> dict:
    return {"queue": queue, "partition": partition, "transactionId": txid, "payload": payload,
            "encrypted": False, "traceId": None, "producerSub": None}


def test_a_poison_event_left_by_an_older_version_is_quarantined_alone(lone_broker, tmp_path):
    """A spool file written before the acceptance rule (a NUL in one payload)
    drains everything else in order; the poison event alone is quarantined and
    can be looked at, is refused on replay while it is still bad, and can be
    discarded. A whole file set aside by an older version in failed/ becomes
    entries of their own, replayable one by one."""
    database, make = lone_broker
    queue = f"legacy-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool-legacy"
    poison = _event(queue, "p", "bad", "a\x00b")
    events = [_event(queue, "p", f"t{i}", {"i": i}) for i in range(5)]
    events.insert(2, poison)
    _write_spool_file(spool, "queen-1700000000000-00000000.buf", events)
    _write_spool_file(spool / "failed", "queen-1600000000000-00000000.buf",
                      [_event(queue, "old", "o1", 1), _event(queue, "old", "o2", 2)])
    b = make(FILE_BUFFER_DIR=str(spool))
    with httpx.Client(base_url=b.url, timeout=30) as http:
        wait_until(lambda: len(stored(database, queue)) >= 5, 30, "the drain")
        assert stored(database, queue) == [("p", f"t{i}") for i in range(5)]
        listing = http.get("/api/v1/system/spool/quarantine").json()
        assert listing["count"] == 3
        by_tid = {e["transactionId"]: e for e in listing["entries"]}
        assert by_tid["bad"]["reason"] == "invalid" and "NUL" in by_tid["bad"]["error"]
        assert {by_tid["o1"]["reason"], by_tid["o2"]["reason"]} == {"legacy"}
        assert "payload" not in stdjson.dumps(listing["entries"][0])  # the list has no payloads
        entry = http.get(f"/api/v1/system/spool/quarantine/{by_tid['bad']['id']}").json()
        assert entry["event"]["payload"] == "a\x00b"
        assert http.get("/health").json()["spool"]["quarantinedEvents"] == 3
        assert http.get("/api/v1/system/maintenance").json()["quarantinedEvents"] == 3
        assert http.get("/metrics").json()["spool"]["quarantinedEvents"] == 3
        prom = http.get("/metrics/prometheus").text
        assert "queen_file_buffer_quarantined_events 3.0" in prom

        r = http.post(f"/api/v1/system/spool/quarantine/{by_tid['bad']['id']}/replay")
        assert r.status_code == 409 and "NUL" in r.json()["error"]
        r = http.post(f"/api/v1/system/spool/quarantine/{by_tid['o1']['id']}/replay",
                      json={"partition": "restored"})
        assert r.status_code == 200 and r.json()["status"] == "queued", r.text
        assert ("restored", "o1") in stored(database, queue)
        r = http.post(f"/api/v1/system/spool/quarantine/{by_tid['o1']['id']}/replay")
        assert r.status_code == 404
        for tid in ("bad", "o2"):
            r = http.delete(f"/api/v1/system/spool/quarantine/{by_tid[tid]['id']}")
            assert r.status_code == 200 and r.json()["discarded"] is True
        assert http.get("/api/v1/system/spool/quarantine").json()["count"] == 0
        assert http.get("/api/v1/system/spool/quarantine/..%2Fetc").status_code in (400, 404)
        assert http.get("/api/v1/system/spool/quarantine/nope").status_code == 404
    assert not list((spool / "failed").iterdir())


def test_a_full_spool_answers_503_and_acknowledges_only_what_is_on_disk(lone_broker):
    database, make = lone_broker
    b = make(FILE_BUFFER_MAX_BYTES="4000")
    queue = f"cap-{uuid.uuid4().hex[:8]}"
    acknowledged, refused = [], 0
    with httpx.Client(base_url=b.url, timeout=30) as http:
        maintenance(http, True)
        for i in range(60):
            r = http.post("/api/v1/push", json={"items": [
                {"queue": queue, "partition": "p", "transactionId": f"c{i:03d}",
                 "payload": {"pad": "x" * 40}}]})
            if r.status_code == 201:
                assert r.json()[0]["status"] == "buffered"
                acknowledged.append(f"c{i:03d}")
            else:
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert "FILE_BUFFER_MAX_BYTES" in r.json()["error"]
                refused += 1
        assert acknowledged and refused
        stats = http.get("/health").json()["spool"]
        assert stats["rejectedFull"] == refused and stats["pendingBytes"] <= 4000
        assert stats["pendingCount"] == len(acknowledged)
        assert "queen_file_buffer_rejected_full_total %d.0" % refused in \
            http.get("/metrics/prometheus").text
        maintenance(http, False)
        wait_until(lambda: len(stored(database, queue)) >= len(acknowledged), 30, "the drain")
        assert [t for _, t in stored(database, queue)] == acknowledged


def test_an_oversized_transaction_or_push_item_is_refused_before_the_spool(lone_broker):
    """The spool path runs the same rule as the direct path: a name longer
    than 255 characters is a 400 in maintenance as well."""
    database, make = lone_broker
    b = make()
    with httpx.Client(base_url=b.url, timeout=30) as http:
        maintenance(http, True)
        queue = f"long-{uuid.uuid4().hex[:8]}"
        r = http.post("/api/v1/push", json={"items": [
            {"queue": queue, "transactionId": "t" * 256, "payload": 1}]})
        assert r.status_code == 400 and "items[0].transactionId" in r.json()["error"]
        assert http.get("/health").json()["spool"]["pendingCount"] == 0
        maintenance(http, False)
    assert db_val(database, "SELECT count(*) FROM queen.queues WHERE name = $1", queue) == 0
