"""The binary push and transaction bodies (broker/http/wire/push_binary.py), judged by the
official client's own encoders (queen-mq 2.6.0, queen/http/push_binary.py):

* whatever the client encodes, with every flag it can set, parses back to the items it
  encoded, in order, with the transaction ids it chose ("" minted by the broker; a framed
  message without one carries the client's message id text);
* whatever else arrives (truncated bodies, random bytes, flipped bytes, zstd bombs) is a
  400/413 ``BadRequest`` and never another exception.
"""
from __future__ import annotations

import struct
import uuid

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queen.http.push_binary import (
    PushBatch,
    encode_push_binary,
    encode_push_frames,
    encode_transaction_frames,
)

from broker.core.errors import BadRequest
from broker.http.wire.push_binary import (
    counts_answer,
    parse_binary_push,
    parse_binary_transaction,
)

LIMIT = 1 << 20

names = st.text(st.characters(codec="utf-8", exclude_characters="\x00",
                              exclude_categories=("Cs",)), min_size=1, max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53)
    | st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                max_size=8), inner, max_size=4),
    max_leaves=10)


def _json(value) -> bytes:
    import json
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@st.composite
def batches(draw):
    out = []
    for _ in range(draw(st.integers(1, 4))):
        payloads = draw(st.lists(json_values, min_size=1, max_size=5))
        txids = draw(st.none() | st.lists(
            st.one_of(st.just(""), st.text(st.characters(codec="ascii", min_codepoint=33),
                                           min_size=1, max_size=12)),
            min_size=len(payloads), max_size=len(payloads)))
        out.append((draw(names), draw(names), payloads, txids))
    return out


def to_batches(spec) -> list[PushBatch]:
    return [PushBatch(q, p, [_json(v) for v in payloads], txids) for q, p, payloads, txids in spec]


def expected(spec):
    for q, p, payloads, txids in spec:
        for i, v in enumerate(payloads):
            yield q, p, v, (txids[i] if txids else "")


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(spec=batches(), compress=st.booleans(), counts=st.booleans())
def test_the_clients_plain_body_parses_to_what_it_encoded(spec, compress, counts):
    got = parse_binary_push(encode_push_binary(to_batches(spec), compress=compress,
                                               counts=counts), LIMIT)
    assert got.counts is counts
    assert len(got.items) == sum(len(s[2]) for s in spec)
    for item, (q, p, v, txid) in zip(got.items, expected(spec)):
        assert (item.queue, item.partition, item.payload) == (q, p, v)
        if txid:
            assert item.transaction_id == txid
        else:  # the broker mints one, a uuid7
            assert uuid.UUID(item.transaction_id).version == 7


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(spec=batches(), counts=st.booleans())
def test_the_clients_framed_body_parses_to_what_it_encoded(spec, counts):
    got = parse_binary_push(encode_push_frames(to_batches(spec), counts=counts), LIMIT)
    assert got.counts is counts
    for item, (q, p, v, txid) in zip(got.items, expected(spec), strict=True):
        assert (item.queue, item.partition, item.payload) == (q, p, v)
        if txid:
            assert item.transaction_id == txid
        else:  # the client-minted message id's text
            assert uuid.UUID(item.transaction_id).version == 7


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(spec=batches(), head=st.fixed_dictionaries({
    "operations": st.just([{"type": "ack", "transactionId": "t", "partitionId": str(uuid.uuid4()),
                            "status": "completed"}]),
    "requiredLeases": st.lists(st.just(str(uuid.uuid4())), max_size=1)}))
def test_the_clients_transaction_body_parses_to_its_head_and_pushes(spec, head):
    got = parse_binary_transaction(encode_transaction_frames(_json(head), to_batches(spec)),
                                   LIMIT)
    assert got.head == head and got.counts is False
    assert [(i.queue, i.partition, i.payload) for i in got.items] == [
        (q, p, v) for q, p, v, _ in expected(spec)]


def a_body() -> bytes:
    return encode_push_binary([PushBatch("q", "p", [b'{"a":1}', b"[1,2]"], ["t1", ""])])


def test_every_truncation_of_a_body_is_a_400():
    body = a_body()
    for end in range(len(body)):
        with pytest.raises(BadRequest) as err:
            parse_binary_push(body[:end], LIMIT)
        assert err.value.status == 400


@settings(max_examples=400)
@given(data=st.binary(max_size=200), magic=st.sampled_from([b"", b"QPB1", b"QTB1"]))
def test_random_bytes_are_a_400_never_a_crash(data, magic):
    for parse in (parse_binary_push, parse_binary_transaction):
        try:
            parse(magic + data, LIMIT)
        except BadRequest as exc:
            assert exc.status in (400, 413)


@settings(max_examples=300)
@given(at=st.integers(0, 10_000), value=st.integers(0, 255))
def test_a_flipped_byte_is_parsed_or_refused_never_a_crash(at, value):
    body = bytearray(encode_push_frames([PushBatch("q", "p", [b'{"a":1}', b'"x"'], None)]))
    body[at % len(body)] = value
    try:
        parse_binary_push(bytes(body), LIMIT)
    except BadRequest:
        pass


def test_a_payload_that_is_not_one_json_document_is_refused():
    body = encode_push_binary([PushBatch("q", "p", [b"{1"], None)])
    with pytest.raises(BadRequest, match="not one JSON document"):
        parse_binary_push(body, LIMIT)


def test_a_zstd_bomb_is_a_413_before_it_is_unpacked():
    """A few hundred bytes that declare 64 MiB: refused from the frame's header."""
    raw = b"\x00" * (64 << 20)
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(raw)
    assert len(frame) < 10_000
    body = b"QPB1" + bytes([1]) + struct.pack("<I", len(raw)) + frame
    with pytest.raises(BadRequest) as err:
        parse_binary_push(body, LIMIT)
    assert err.value.status == 413 and "MAX_BODY_BYTES" in err.value.message


def test_the_limit_is_for_the_whole_request_not_each_group():
    """Two framed groups of 600 KiB each pass one by one but not together under 1 MiB."""
    big = b'"' + b"x" * (600 << 10) + b'"'
    body = encode_push_frames([PushBatch("q", "a", [big]), PushBatch("q", "b", [big])])
    with pytest.raises(BadRequest) as err:
        parse_binary_push(body, LIMIT)
    assert err.value.status == 413
    assert len(parse_binary_push(body, 2 * LIMIT).items) == 2


def test_a_frame_without_its_content_size_is_refused():
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * 10)
    body = b"QPB1" + bytes([1]) + struct.pack("<I", 10) + frame
    with pytest.raises(BadRequest, match="declare its content size"):
        parse_binary_push(body, LIMIT)


def test_unknown_flags_and_items_past_the_acceptance_rule_are_refused():
    with pytest.raises(BadRequest, match="unknown flags"):
        parse_binary_push(b"QPB1" + bytes([0x10]) + struct.pack("<I", 0), LIMIT)
    nul = encode_push_binary([PushBatch("q", "p", [b'"a\\u0000b"'], None)])
    with pytest.raises(BadRequest):  # PostgreSQL cannot store NUL in jsonb text
        parse_binary_push(nul, LIMIT)


def test_counts_add_up():
    assert counts_answer(["queued", "buffered", "duplicate", "failed", "queued"]) == {
        "count": 5, "queued": 2, "buffered": 1, "duplicate": 1, "error": 1}
