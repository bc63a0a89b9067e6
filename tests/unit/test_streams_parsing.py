"""The /streams/v1 body parsers (broker/http/wire/streams.py), in-process: any JSON body is
either a well-formed request or a BadRequest (a 4xx), never another exception (a 500);
what they accept is what the store can take."""
from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.errors import BadRequest
from broker.http.wire.streams import (
    STATE_KEY_MAX_BYTES,
    STATE_VALUE_MAX_BYTES,
    parse_cycle,
    parse_state_get,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=16)

QID, PID = str(uuid.uuid4()), str(uuid.uuid4())
VALID_CYCLE = {
    "query_id": QID, "partition_id": PID, "consumer_group": "streams.q",
    "state_ops": [{"type": "upsert", "key": "k", "value": {"acc": 1}},
                  {"type": "delete", "key": "j"}],
    "push_items": [{"queue": "sink", "partition": "p", "payload": {"v": 1}}],
    "ack": {"transactionId": "t1", "leaseId": str(uuid.uuid4()), "status": "completed",
            "count": 3},
    "release_lease": True,
}


def test_the_sdk_body_parses():
    req = parse_cycle(VALID_CYCLE, 1000)
    assert (req.query_id, req.partition_id, req.group) == (QID, PID, "streams.q")
    assert [(o.type, o.key, o.value_json) for o in req.ops] == [
        ("upsert", "k", '{"acc":1}'), ("delete", "j", None)]
    assert req.pushes[0].queue == "sink" and req.ack is not None
    assert req.ack.partition_id == PID and req.ack.transaction_id == "t1"
    assert req.release_lease is True


def _accepts_or_400(parse, body) -> None:
    try:
        parse(body)
    except BadRequest as exc:
        assert 400 <= exc.status < 500


@settings(max_examples=300)
@given(field=st.sampled_from(sorted(VALID_CYCLE)), value=json_values)
def test_a_cycle_with_any_field_replaced_parses_or_is_a_4xx(field, value):
    _accepts_or_400(lambda b: parse_cycle(b, 1000), {**VALID_CYCLE, field: value})


@settings(max_examples=200)
@given(op=json_values | st.fixed_dictionaries({"type": st.sampled_from(["upsert", "delete"]),
                                               "key": st.text(max_size=20),
                                               "value": json_values}))
def test_any_state_op_parses_or_is_a_4xx(op):
    try:
        req = parse_cycle({**VALID_CYCLE, "state_ops": [op]}, 1000)
    except BadRequest as exc:
        assert exc.status == 400
        return
    (parsed,) = req.ops
    assert parsed.type in ("upsert", "delete") and parsed.key
    assert "\x00" not in parsed.key
    assert len(parsed.key.encode()) <= STATE_KEY_MAX_BYTES
    if parsed.value_json is not None:
        assert len(parsed.value_json.encode()) <= STATE_VALUE_MAX_BYTES


@settings(max_examples=200)
@given(body=json_values | st.fixed_dictionaries(
    {"query_id": st.just(QID), "partition_id": st.just(PID)},
    optional={"keys": json_values | st.lists(st.text(max_size=10), max_size=5),
              "key_prefix": json_values, "ripe_at_or_before": json_values}))
def test_any_state_read_parses_or_is_a_4xx(body):
    _accepts_or_400(parse_state_get, body)


def test_state_read_defaults():
    read = parse_state_get({"query_id": QID, "partition_id": PID})
    assert (read.keys, read.key_prefix, read.ripe_at_or_before) == ((), None, None)
