"""The acceptance rule (broker/core/validate.py): the fast screens agree with the
exact checks on every value, and both agree with what PostgreSQL refuses
(the latter is checked through HTTP in tests/faults/test_push_property.py)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.validate import Invalid, check_name, check_payload, check_push, payload_json

texts = st.one_of(st.text(st.characters(codec=None, exclude_categories=()), max_size=10),
                  st.sampled_from(["\x00", "a\x00", "\ud800", "NaN", "Infinity", "\\u0000"]))
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(texts, kids, max_size=4)),
    max_leaves=15)


def exact_ok(payload) -> bool:
    try:
        check_payload(payload, "p")
    except Invalid:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(values)
def test_the_serializing_screen_agrees_with_the_exact_walk(payload):
    try:
        text = payload_json(payload, "p")
    except Invalid:
        assert not exact_ok(payload)
    else:
        assert exact_ok(payload)
        text.encode("utf-8")  # what asyncpg will do with it


@settings(max_examples=300, deadline=None)
@given(texts, texts, texts)
def test_the_name_screen_agrees_with_the_exact_checks(queue, partition, txid):
    def exact() -> bool:
        try:
            for value in (queue, partition, txid):
                check_name(value, "n")
        except Invalid:
            return False
        return True

    try:
        check_push(queue, partition, txid, None, 1, "items[0]")
    except Invalid:
        assert not exact()
    else:
        assert exact()


@pytest.mark.parametrize("payload, where", [
    ({"a": [1, {"b": "x\x00"}]}, "items[0].payload.a[1].b"),
    ({"a": math.nan}, "items[0].payload.a"),
    ([1, 2, -math.inf], "items[0].payload[2]"),
    ({"k\ud800": 1}, "items[0].payload key"),
])
def test_errors_name_the_place(payload, where):
    with pytest.raises(Invalid) as err:
        check_push("q", "p", "t", None, payload, "items[0]")
    assert str(err.value).startswith(where)


@pytest.mark.parametrize("trace", ["{0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a}",
                                   "0190b7f26c3e7d2a9a413f5e8d1c2b7a",
                                   "urn:uuid:0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a", "x"])
def test_only_canonical_trace_ids(trace):
    with pytest.raises(Invalid, match="traceId"):
        check_push("q", "p", "t", trace, 1, "items[0]")
    check_push("q", "p", "t", "0190B7F2-6C3E-7D2A-9A41-3F5E8D1C2B7A", 1, "items[0]")
