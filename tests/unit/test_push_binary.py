"""The binary push and transaction bodies (broker/http/wire/push_binary.py), judged by the
official client's own encoders (queen-mq 2.6.0, queen/http/push_binary.py):

* whatever the client encodes, with every flag it can set, parses back to the items it
  encoded, in order, with the transaction ids it chose ("" minted by the broker; a framed
  message without one carries the client's message id text);
* whatever else arrives (truncated bodies, random bytes, flipped bytes, zstd bombs) is a
  400/413 ``BadRequest`` and never another exception;
* an item's ``payload_json`` (the text PostgreSQL is sent) is one PostgreSQL's jsonb takes and
  means what ujson read from the payload; a payload jsonb would refuse as written (a raw
  control character in a string, ``01``, ``1.``) is stored as ujson read it, never as sent,
  and one that cannot be stored (``\\u0000``, a lone surrogate, NaN, ``1e400``) is a 400.
"""
from __future__ import annotations

import decimal
import json
import struct
import uuid

import pytest
import ujson
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


# -- the payload's text -------------------------------------------------------------------

def jsonb_takes(text: str) -> bool:
    """Whether PostgreSQL's jsonb takes ``text`` (what PostgreSQL 18 refuses, checked against a
    real server): strict JSON (no raw control character in a string, no 01, 1., bare -, NaN or
    Infinity), valid UTF-8 (no lone surrogate, escaped or not), no NUL in a string or key, and
    numbers within numeric's range (131072 digits before the point, 16383 after)."""
    def constant(name: str) -> None:
        raise ValueError(name)

    if not _utf8(text):
        return False
    try:
        value = json.loads(text, parse_constant=constant, parse_float=decimal.Decimal)
    except ValueError:
        return False
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v or not _utf8(v):
                return False
        elif isinstance(v, decimal.Decimal):
            digits, exponent = len(v.as_tuple().digits), int(v.as_tuple().exponent)
            if digits + exponent > 131072 or -exponent > 16383:
                return False
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bodies(raws: list[bytes]) -> list[bytes]:
    """The same payloads in a plain body (flag 4) and in a framed one (flag 8)."""
    batch = [PushBatch("q", "p", raws, [f"t{i}" for i in range(len(raws))])]
    return [encode_push_binary(batch), encode_push_frames(batch)]


def assert_stored_as_read(raws: list[bytes]) -> None:
    """Every body holding ``raws`` is refused with a 400, or each item's text is one jsonb
    takes and means what ujson read from its payload (so a raw payload jsonb refuses is never
    sent as it is)."""
    for body in _bodies(raws):
        try:
            items = parse_binary_push(body, LIMIT).items
        except BadRequest as exc:
            assert exc.status == 400, exc.message
            continue
        for item, raw in zip(items, raws, strict=True):
            assert item.payload_json is not None and jsonb_takes(item.payload_json), (raw, item)
            read = ujson.loads(raw) if raw else None
            assert ujson.loads(item.payload_json) == read == item.payload, (raw, item)


finite_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                max_size=8), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(finite_json, min_size=1, max_size=5))
def test_a_clients_payload_is_stored_as_the_value_it_encoded(values):
    raws = [_json(v) for v in values]
    for body in _bodies(raws):
        for item, v in zip(parse_binary_push(body, LIMIT).items, values, strict=True):
            assert item.payload_json is not None and jsonb_takes(item.payload_json)
            assert ujson.loads(item.payload_json) == ujson.loads(_json(v)) == item.payload


# What ujson reads but jsonb refuses as written, or cannot store at all, beside what both take.
HOSTILE = [b'"\\u0000"', b'"a\\u0000b"', b'{"\\u0000":1}', b'"\\ud800"', b'"x\\udc00"',
           b'"\\ud83d\\ude00"', b'"\xed\xa0\x80"', b'"\xff"', b'"\xc3\xa9"', b"\t", b"\n",
           b"\x01", b"\x1f", b"\x7f", b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400",
           b"1e-400", b"1E2", b"01", b"-01", b"00", b"-", b"1.", b"-.5", b"01.5", b"1.50",
           b"0." + b"0" * 20000 + b"1", b"12345678901234567890123", b"1.0000000000000000001",
           b"\\", b'\\"', b"\\n", b"\\/", b"\\b", b"true", b"null", b"0", b" ", b","]


@st.composite
def hostile_payloads(draw) -> bytes:
    """JSON-like text built from HOSTILE pieces: inside strings, as keys, as values, between
    tokens; most are not JSON at all (refused before anything else)."""
    def piece() -> bytes:
        return draw(st.sampled_from(HOSTILE))

    def string() -> bytes:
        return b'"' + b"".join(draw(st.lists(st.sampled_from(HOSTILE[:20] + [b"a", b" "]),
                                             max_size=3))) + b'"'

    def value(depth: int) -> bytes:
        kind = draw(st.integers(0, 5 if depth < 3 else 2))
        if kind == 0:
            return piece()
        if kind <= 2:
            return string()
        if kind == 3:
            return b"[" + b",".join(value(depth + 1) for _ in range(draw(st.integers(0, 3)))) + b"]"
        return b"{" + b",".join(string() + b":" + value(depth + 1)
                                for _ in range(draw(st.integers(0, 3)))) + b"}"

    space = st.sampled_from([b"", b" ", b"\t", b"\n", b"\r\n"])
    return draw(space) + value(0) + draw(space)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(raws=st.lists(hostile_payloads(), min_size=1, max_size=3))
def test_a_payload_jsonb_refuses_is_refused_or_stored_as_ujson_read_it(raws):
    assert_stored_as_read(raws)


@pytest.mark.parametrize("raw", [b'"a\\u0000b"', b'{"k\\u0000":1}', b'"\\ud800"', b'["\\udc00"]',
                                 b'"\xed\xa0\x80"', b"NaN", b"[Infinity]", b"-Infinity", b"1e400",
                                 b'{"a":-1e400}'])
def test_a_payload_postgresql_cannot_store_is_a_400(raw):
    for body in _bodies([b'{"fine":1}', raw]):
        with pytest.raises(BadRequest) as err:
            parse_binary_push(body, LIMIT)
        assert err.value.status == 400 and err.value.message.startswith("items[1].payload"), \
            err.value.message


@pytest.mark.parametrize("raw", [b'"a\tb"', b'"line\nbreak"', b'["\x01\x1f"]', b"01", b"-01", b"-",
                                 b"1.", b"-.5", b"01.5", b"1e-400", b'{"a":1,"a":2}', b"\t[1,\r\n2]\n",
                                 b'"\\ud83d\\ude00"', b"12345678901234567890123"])
def test_a_payload_jsonb_refuses_as_written_is_stored_as_ujson_read_it(raw):
    """ujson reads each of these; jsonb refuses those up to 01.5 as written (checked against
    PostgreSQL 18) and reads 1e-400 otherwise than ujson (0.0). The broker stores what ujson
    read, as the JSON path does, never the text as sent."""
    for body in _bodies([raw]):
        [item] = parse_binary_push(body, LIMIT).items
        assert item.payload_json is not None and jsonb_takes(item.payload_json)
        assert ujson.loads(item.payload_json) == ujson.loads(raw) == item.payload
    assert_stored_as_read([raw])


def test_the_jsonb_model_refuses_what_postgresql_refuses():
    """The judge above, on what PostgreSQL 18 answered (a real server, not a guess)."""
    for refused_by_postgresql in ['"a\tb"', "01", "-", "1.", "-.5", "NaN", "Infinity", '"\\u0000"',
                                  '"\\ud800"', "0." + "0" * 20000 + "1", "[1,]", "1 2"]:
        assert not jsonb_takes(refused_by_postgresql), refused_by_postgresql
    for taken_by_postgresql in ["1e400", "1e-400", '"\\ud83d\\ude00"', '{"a":1,"a":2}', "\t[1]\n",
                                '"\x7f"', "12345678901234567890123", "-0"]:
        assert jsonb_takes(taken_by_postgresql), taken_by_postgresql


def test_a_groups_names_are_checked_at_its_first_item_with_the_json_paths_texts():
    """Once per group, with the JSON path's texts; an empty group names nothing to refuse."""
    for queue, partition, text in [("", "p", "Queue must be a string"),
                                   ("q" * 256, "p", "Queue must be a string"),
                                   ("q", "", "Partition must be a string"),
                                   ("q\x00", "p", "items[1].queue: contains a NUL"),
                                   ("q", "p\x00", "items[1].partition: contains a NUL")]:
        batches = [PushBatch("ok", "p", [b"1"], ["a"]), PushBatch(queue, partition, [], []),
                   PushBatch(queue, partition, [b"2", b"3"], ["b", "c"])]
        for body in (encode_push_binary(batches), encode_push_frames(batches)):
            with pytest.raises(BadRequest) as err:
                parse_binary_push(body, LIMIT)
            assert err.value.message.startswith(text), err.value.message
    for txid, text in [("t" * 256, "items[0].transactionId: must be at most 255 characters"),
                       ("a\x00", "items[0].transactionId: contains a NUL")]:
        for body in _bodies_with_txid(txid):
            with pytest.raises(BadRequest) as err:
                parse_binary_push(body, LIMIT)
            assert err.value.message.startswith(text), err.value.message


def _bodies_with_txid(txid: str) -> list[bytes]:
    batch = [PushBatch("q", "p", [b"1"], [txid])]
    return [encode_push_binary(batch), encode_push_frames(batch)]
