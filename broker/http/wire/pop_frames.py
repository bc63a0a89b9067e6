"""The framed pop answer (docs/wire-contract.md §5.9): what a pop with ``frames=true`` gets
when it found messages, instead of the JSON of §5.3. The official client unpacks it into
the dict the JSON answer parses to (its ``queen/http/pop_frames.py``).

    "QPF1" | u8 1 | u32 len, the answer's own keys as one JSON object
    u16 len, queue | u16 len, leaseId | u16 len, consumerGroup | u32 claims
    per claim:  u64 partition handle | u16 len, partition | u64 first | u64 last
                | u32 deliveryAttempt | u32 records
    per record: u64 offset | i64 createdAt (µs) | u32 count | u8 codec | u32 len | frames
    per frame:  u32 len | u8 flags | u8[16] message id | [u8[16] trace id, flag 1]
                | u16 len, transactionId | [u16 len, producerSub, flag 2] | payload

Little-endian. This broker writes one record per message (count 1, codec 0: raw), so each
message keeps its own creation time; the offset is the message's position in its partition.
The payload is the stored JSON text as PostgreSQL gave it, copied, not parsed. A partition is
named by its handle (migration 0012), which every ack route takes in place of its UUID.

Not framed (answered as JSON, which the client reads too): empty answers, and a discovery
pop whose messages come from more than one queue (the frame names one queue).
"""
from __future__ import annotations

import struct
from typing import Any

import ujson

from broker.core.domain import PopRequest
from broker.service.pop import PopResult

CONTENT_TYPE = "application/x-queen-pop"
MAGIC_V1 = b"QPF1\x01"

_FLAG_TRACE = 1
_FLAG_PRODUCER = 2

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<I")
_CLAIM = struct.Struct("<QH")           # handle, partition name's length
_CLAIM_TAIL = struct.Struct("<QQII")    # first, last, deliveryAttempt, records
# offset, createdAt, count 1, codec 0, record length, frame length, flags, message id
_RECORD = struct.Struct("<qqIBIIB16s")


def framed_answer(req: PopRequest, result: PopResult, own: dict[str, Any]) -> bytes | None:
    """The QPF1 bytes of a framed pop that found messages, or None: answer JSON instead
    (the service found no partition handles: see service/pop.py's _with_handles). ``own``:
    the JSON answer's keys besides its messages (the autopilot echo)."""
    popped = result.popped
    if popped is None or popped.handles is None:
        return None
    rows, payloads, handles = popped.rows, popped.payloads, popped.handles
    queue = rows[0]["queue_name"]
    out = [MAGIC_V1]
    own_json = ujson.dumps(own, ensure_ascii=False).encode() if own else b""
    out.append(_HEAD.pack(len(own_json)))
    out.append(own_json)
    out.append(_text(queue))
    out.append(_text(popped.lease_id))
    out.append(_text(req.group))
    claims: list[tuple[int, int]] = []  # each claim's [start, end) in rows
    start = 0
    for n in range(1, len(rows) + 1):
        if n == len(rows) or rows[n]["partition_id"] != rows[start]["partition_id"]:
            claims.append((start, n))
            start = n
    out.append(_U32.pack(len(claims)))
    for first, end in claims:
        head = rows[first]
        name = head["partition_name"].encode()
        out.append(_CLAIM.pack(handles[head["partition_id"]], len(name)))
        out.append(name)
        out.append(_CLAIM_TAIL.pack(head["seq"], rows[end - 1]["seq"],
                                    (head["retry_count"] or 0) + 1, end - first))
        for row, payload in zip(rows[first:end], payloads[first:end]):
            out += _record(row, payload)
    return b"".join(out)


def _record(row: Any, payload: str) -> list[bytes]:
    flags = 0
    middle = b""
    trace = row["trace_id"]
    if trace is not None:
        flags |= _FLAG_TRACE
        middle = trace.bytes
    txid = row["transaction_id"].encode()
    middle += _U16.pack(len(txid)) + txid
    producer = row["producer_sub"]
    if producer is not None:
        flags |= _FLAG_PRODUCER
        sub = producer.encode()
        middle += _U16.pack(len(sub)) + sub
    body = payload.encode()
    frame_len = 1 + 16 + len(middle) + len(body)
    return [_RECORD.pack(row["seq"], row["created_us"], 1, 0,
                         4 + frame_len, frame_len, flags, row["message_id"].bytes),
            middle, body]


def _text(value: str) -> bytes:
    raw = value.encode()
    return _U16.pack(len(raw)) + raw
