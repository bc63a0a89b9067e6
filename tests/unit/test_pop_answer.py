"""The JSON answer of a pop that found messages is written as text, with each payload's JSON
text (as PostgreSQL spells it) spliced in (broker/http/wire/pop.py). Invariant: whatever the
rows hold (any text in ids, names and subjects, any JSON payload), the answer is strict JSON
that parses to exactly the message objects of docs/wire-contract.md §5.3."""
from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import times
from broker.core.domain import PopRequest
from broker.http.wire.pop import pop_answer
from broker.service.pop import Popped, PopResult, Sizing

# What PostgreSQL's text can hold: any character but NUL (and no lone surrogates).
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
               max_size=30)
NAME = TEXT.filter(bool)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | TEXT
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
CREATED = st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9999, 1, 1),
                       timezones=st.just(dt.UTC))


@st.composite
def claims(draw) -> tuple[list[dict[str, Any]], list[Any]]:
    """Rows as the claim returns them: grouped by partition, one queue."""
    queue = draw(NAME)
    rows, values = [], []
    for _ in range(draw(st.integers(1, 3))):
        partition, partition_id = draw(NAME), uuid.uuid4()
        for _ in range(draw(st.integers(1, 4))):
            rows.append({
                "message_id": uuid.uuid4(), "transaction_id": draw(NAME),
                "trace_id": draw(st.none() | st.uuids()), "producer_sub": draw(st.none() | NAME),
                "created_us": micros(draw(CREATED)), "queue_name": queue,
                "partition_name": partition,
                "partition_id": partition_id, "retry_count": draw(st.none() | st.integers(0, 99)),
            })
            values.append(draw(JSON_VALUE))
    return rows, values


def request(group: str) -> PopRequest:
    return PopRequest(queue="q", partition=None, namespace=None, task=None, group=group,
                      batch=10, max_partitions=3, wait=False, timeout_ms=0, auto_ack=False,
                      subscription_mode=None, subscription_from=None)


def micros(ts: dt.datetime) -> int:
    return (ts - EPOCH) // dt.timedelta(microseconds=1)


def expected_message(row: dict[str, Any], value: Any, group: str, lease: str) -> dict:
    created = (EPOCH + dt.timedelta(microseconds=row["created_us"])).replace(
        tzinfo=None).isoformat(timespec="microseconds") + "Z"
    return {
        "id": str(row["message_id"]), "transactionId": row["transaction_id"],
        "traceId": str(row["trace_id"]) if row["trace_id"] else None, "data": value,
        "producerSub": row["producer_sub"], "createdAt": created,
        "queue": row["queue_name"], "partition": row["partition_name"],
        "partitionId": str(row["partition_id"]), "leaseId": lease, "consumerGroup": group,
        "retryCount": row["retry_count"] or 0,
    }


@settings(max_examples=300, deadline=None)
@given(claims(), NAME, st.booleans(), st.booleans())
def test_found_answer_is_strict_json_of_the_messages(claim, group, pg_spacing, autopilot):
    rows, values = claim
    # PostgreSQL writes jsonb as '{"a": 1, "b": [1, 2]}'; a decrypted payload is written
    # compactly by ujson. Both are spliced in as they are.
    separators = (", ", ": ") if pg_spacing else (",", ":")
    texts = [json.dumps(v, separators=separators, ensure_ascii=False) for v in values]
    lease = str(uuid.uuid4())
    sizing = Sizing(2, 50, 100) if autopilot else None
    result = PopResult(Popped(rows, texts, lease), sizing=sizing)

    answer = json.loads(pop_answer(request(group), result))  # strict: no raw control chars

    assert answer["messages"] == [expected_message(r, v, group, lease)
                                  for r, v in zip(rows, values)]
    partitions = list(dict.fromkeys(r["partition_id"] for r in rows))
    rest = {k: v for k, v in answer.items() if k != "messages"}
    assert rest == {"success": True, "queue": rows[0]["queue_name"],
                    "partition": rows[0]["partition_name"], "partitionId": str(partitions[0]),
                    "leaseId": lease, "consumerGroup": group,
                    "partitionsClaimed": len(partitions),
                    **({"autopilot": {"partitions": 2, "batch": 50, "waitMs": 100}}
                       if autopilot else {})}


def test_empty_answers_keep_their_shapes():
    req = request("g")
    assert json.loads(pop_answer(req, PopResult(None, "empty"))) == {
        "success": False, "error": "no_available_partition", "messages": []}
    assert json.loads(pop_answer(req, PopResult(None, "paused"))) == {
        "messages": [], "paused": True}


@settings(max_examples=500, deadline=None)
@given(st.lists(CREATED, min_size=1, max_size=50))
def test_creation_times_from_microseconds_spell_as_from_datetimes(created):
    """The pop's ``createdAt`` comes from microseconds through a cache of whole seconds: it
    spells every time as iso_micro spells the datetime, cached or not, and after the
    cache is emptied at its bound."""
    for ts in created:
        assert times.iso_micro_us(micros(ts)) == times.iso_micro(ts)
        assert times.iso_micro_us(micros(ts)) == times.iso_micro(ts)  # now from the cache


def test_the_seconds_cache_is_bounded():
    base = micros(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    for n in range(times._SECONDS_KEPT * 2 + 10):
        times.iso_micro_us(base + n * 1_000_000 + 7)
        assert len(times._SECONDS) <= times._SECONDS_KEPT


def test_delivery_lag_is_counted_in_milliseconds_from_microseconds():
    """A pop's lag figures (queues' avg/max lag) come from ``created_us``: a message created
    1.5 s ago counts ~1,500 ms, not 1.5 or 1,500,000 (bounds wide enough for a slow machine,
    narrow enough for a unit slip)."""
    from broker.core.telemetry import Telemetry

    t = Telemetry()
    now_us = micros(dt.datetime.now(dt.UTC))
    t.delivered("q", [now_us - 1_500_000, now_us - 500_000])
    lag = t.queues["q"]
    assert lag["pop_messages"] == 2 and lag["lag_count"] == 2
    assert 2_000 <= lag["lag_sum_ms"] < 2_000 + 60_000
    assert 1_500 <= t.lag_max_ms["q"] < 1_500 + 30_000
