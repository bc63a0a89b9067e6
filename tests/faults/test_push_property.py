"""Property: for any push body, on the direct path and on the spool
path alike, either the whole request is refused with a 4xx and nothing of it
is stored, or every item it acknowledged is stored exactly once.

Hypothesis generates the bodies, hostile ones included: NUL characters, lone
surrogates, NaN and Infinity, braced or malformed trace ids, long names, deep
and wide payloads. Broker A pushes straight to PostgreSQL; broker B, on a
database of its own, is in push maintenance, so everything it acknowledges is
``buffered`` and only reaches PostgreSQL through the spool's replay. At the
end B's maintenance is turned off, the spool drains, and every acknowledged
item must be in PostgreSQL, with nothing left in the quarantine.
"""
from __future__ import annotations

import itertools
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import db_fetch, start_broker
from tests.waiting import wait_until

EXAMPLES = 60
_counter = itertools.count()

hostile_text = st.one_of(
    st.text(st.characters(codec=None, categories=None), max_size=12),  # surrogates, NUL...
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "é", "x" * 256, "{}", "Default"]),
)
numbers = st.one_of(st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True))
payloads = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, hostile_text),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(hostile_text, children, max_size=4)),
    max_leaves=12)
trace_ids = st.one_of(st.none(), st.just(""), st.uuids().map(str),
                      st.uuids().map(lambda u: "{%s}" % u), st.uuids().map(lambda u: u.hex),
                      hostile_text)


@st.composite
def push_bodies(draw):
    n = next(_counter)
    items = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        item = {"queue": f"prop-{n}-" + draw(st.one_of(st.just("q"), hostile_text)),
                "payload": draw(payloads)}
        if draw(st.booleans()):
            item["partition"] = draw(hostile_text)
        if draw(st.booleans()):
            item["transactionId"] = draw(hostile_text)
        if draw(st.booleans()):
            item["traceId"] = draw(trace_ids)
        items.append(item)
    return {"items": items}


def encode(body) -> bytes:
    # NaN/Infinity literals and \ud800 escapes, as a hostile client would send them.
    return json.dumps(body, allow_nan=True, ensure_ascii=True).encode()


def count_stored(database, queue: str, partition: str, txid: str) -> int:
    rows = db_fetch(database, (
        "SELECT count(*) AS n FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id "
        "JOIN queen.queues q ON q.id = p.queue_id "
        "WHERE q.name = $1 AND p.name = $2 AND m.transaction_id = $3"), queue, partition, txid)
    return rows[0]["n"]


def queue_rows(database, prefix: str) -> int:
    rows = db_fetch(database, (
        "SELECT count(*) AS n FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id "
        "JOIN queen.queues q ON q.id = p.queue_id WHERE starts_with(q.name, $1)"), prefix)
    return rows[0]["n"]


@pytest.fixture
def two_paths(database, fresh_database, tmp_path):
    direct = start_broker(database, tmp_path)
    spooled = start_broker(fresh_database, tmp_path)
    try:
        with httpx.Client(base_url=spooled.url, timeout=30) as http:
            assert http.post("/api/v1/system/maintenance", json={"enabled": True}).status_code == 200
        yield (database, direct), (fresh_database, spooled)
    finally:
        direct.stop()
        spooled.stop()


def test_any_push_is_refused_whole_or_stored_exactly_once(two_paths):
    (direct_db, direct), (spool_db, spooled) = two_paths
    acknowledged: list[tuple[str, str, str]] = []  # buffered through B

    with httpx.Client(base_url=direct.url, timeout=30) as a, \
            httpx.Client(base_url=spooled.url, timeout=30) as b:

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])
        @given(body=push_bodies())
        def check(body):
            raw = encode(body)
            prefix = body["items"][0]["queue"].split("-", 2)[:2]
            prefix = "-".join(prefix) + "-"
            r = a.post("/api/v1/push", content=raw, headers={"content-type": "application/json"})
            if 400 <= r.status_code < 500:
                assert "error" in r.json()
                assert queue_rows(direct_db, prefix) == 0, "a refused push stored something"
            else:
                assert r.status_code == 200, (r.status_code, r.text)
                for item, result in zip(body["items"], r.json()):
                    assert result["status"] in ("queued", "duplicate"), result
                    partition = item.get("partition") or "Default"
                    assert count_stored(direct_db, item["queue"], partition,
                                        result["transaction_id"]) == 1
            r = b.post("/api/v1/push", content=raw, headers={"content-type": "application/json"})
            if 400 <= r.status_code < 500:
                assert "error" in r.json()
            else:
                assert r.status_code == 201, (r.status_code, r.text)
                for item, result in zip(body["items"], r.json()):
                    assert result["status"] == "buffered", result
                    acknowledged.append((item["queue"], item.get("partition") or "Default",
                                         result["transactionId"]))

        check()
        assert b.post("/api/v1/system/maintenance", json={"enabled": False}).status_code == 200
        wait_until(lambda: b.get("/health").json()["spool"]["pendingCount"] == 0, 60,
                   "the spool drained")
        spool = b.get("/health").json()["spool"]
        assert spool["pendingCount"] == 0 and spool["quarantinedEvents"] == 0, spool
    assert acknowledged, "no generated push was accepted: the property checked nothing"
    for queue, partition, txid in acknowledged:
        assert count_stored(spool_db, queue, partition, txid) == 1, (queue, partition, txid)
