"""The binary push and transaction bodies the official client sends with ``binary_push``
(docs/wire-contract.md §4.2): parsed into the same items as the JSON bodies, with the same
acceptance rule, so everything after parsing is the JSON path.

    push:        "QPB1" | u8 flags | [u32 raw_len, flag 1] | body
    body:        u32 groups | per group: u16 len, queue | u16 len, partition | u32 n
                 | n x ([u16 len, transactionId, flag 4] | u32 len, payload)
    flag 8 body: u32 groups | per group: u16 len, queue | u16 len, partition | u32 n
                 | u32 z_len | z, one zstd frame of n x
                 (u32 len | u8 0 | u8[16] message id | u16 len, transactionId | payload)
    transaction: "QTB1" | u8 flags | u32 len, head (JSON) | the groups, as with flag 8

Integers are little-endian. Flags: 1 the body is one zstd frame of raw_len bytes, 2 answer
with counts, 4 every item carries a transaction id ("" = the broker mints one), 8 the groups
are zstd-compressed frames. A payload is one JSON document (empty: null).

What this broker does differently from the reference: a framed message's id, minted by the
client, is not kept; the broker mints its own, as for a JSON push (a client-chosen primary
key would let one client's forged or repeated id fail a statement that folds other clients'
pushes). The answer names the stored id. A framed message without its own transaction id
carries the client's id text as its transaction id, as the client writes it.

Every zstd frame must declare its content size (the client's do), and no frame or body may
unpack past the request's byte limit (MAX_BODY_BYTES): a small body cannot make the broker
allocate a large one.
"""
from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

import ujson

from broker.core.domain import PushItem
from broker.core.errors import BadRequest
from broker.http.wire.push import parse_push_item
from broker.http.wire.zstd import Budget, refused, unzstd

CONTENT_TYPE = "application/x-queen-push"
PUSH_MAGIC = b"QPB1"
TRANSACTION_MAGIC = b"QTB1"
FLAG_ZSTD = 1
FLAG_COUNTS = 2
FLAG_TXN = 4
FLAG_FRAMES = 8
PUSH_FLAGS = FLAG_ZSTD | FLAG_COUNTS | FLAG_TXN | FLAG_FRAMES
TRANSACTION_FLAGS = FLAG_COUNTS

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class BinaryPush:
    items: list[PushItem]
    counts: bool          # flag 2: answer {"count", "queued", "duplicate", "error"}


@dataclass(frozen=True)
class BinaryTransaction:
    head: dict[str, Any]  # the JSON transaction body without its pushes
    items: list[PushItem]  # the pushes, in the order written (after the head's operations)
    counts: bool          # flag 2: count the pushes' and acks' results instead of listing them


def is_binary(request: Any) -> bool:
    """Whether a request carries a binary body (its Content-Type; the magic says which)."""
    kind = request.headers.get("content-type") or ""
    return kind.split(";", 1)[0].strip().lower() == CONTENT_TYPE


class _Reader:
    """Little-endian fields off a body; a read past its end is the caller's mistake."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, length: int, what: str) -> bytes:
        end = self.at + length
        if end > len(self.data):
            raise refused(f"{what} runs past the end (at byte {self.at}, {length} byte(s) "
                          f"wanted, {len(self.data) - self.at} left)")
        piece = self.data[self.at:end]
        self.at = end
        return piece

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(_U16.unpack(self.take(2, what))[0])

    def u32(self, what: str) -> int:
        return int(_U32.unpack(self.take(4, what))[0])

    def text(self, what: str) -> str:
        raw = self.take(self.u16(what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise refused(f"{what} is not UTF-8") from None

    def done(self) -> bool:
        return self.at == len(self.data)


def _payload(raw: bytes, where: str) -> Any:
    if not raw:
        return None
    try:
        return ujson.loads(raw)
    except ValueError:
        raise refused(f"{where}: the payload is not one JSON document") from None


def _item(queue: str, partition: str, txid: str, payload: Any, index: int) -> PushItem:
    # The JSON path's parse: names, transaction id, the acceptance rule; "" mints an id.
    return parse_push_item({"queue": queue, "partition": partition, "transactionId": txid,
                            "payload": payload}, index)


def _plain_groups(body: _Reader, with_txn: bool, items: list[PushItem]) -> None:
    for g in range(body.u32("the group count")):
        queue = body.text(f"group {g}'s queue")
        partition = body.text(f"group {g}'s partition")
        for _ in range(body.u32(f"group {g}'s message count")):
            n = len(items)
            txid = body.text(f"item {n}'s transactionId") if with_txn else ""
            payload = _payload(body.take(body.u32(f"item {n}'s payload"), f"item {n}'s payload"),
                               f"item {n}")
            items.append(_item(queue, partition, txid, payload, n))


def _framed_groups(body: _Reader, budget: Budget, items: list[PushItem]) -> None:
    for g in range(body.u32("the group count")):
        queue = body.text(f"group {g}'s queue")
        partition = body.text(f"group {g}'s partition")
        count = body.u32(f"group {g}'s message count")
        frames = _Reader(unzstd(body.take(body.u32(f"group {g}'s frames"), f"group {g}'s frames"),
                                budget, f"group {g}'s frames"))
        for _ in range(count):
            n = len(items)
            frame = _Reader(frames.take(frames.u32(f"item {n}'s frame"), f"item {n}'s frame"))
            if frame.u8(f"item {n}'s flags") != 0:
                raise refused(f"item {n}'s frame has flags this broker does not know")
            client_id = str(uuid.UUID(bytes=frame.take(16, f"item {n}'s message id")))
            txid = frame.text(f"item {n}'s transactionId") or client_id
            payload = _payload(frame.data[frame.at:], f"item {n}")
            items.append(_item(queue, partition, txid, payload, n))
        if not frames.done():
            raise refused(f"group {g}'s frames hold more than its {count} messages")


def parse_binary_push(data: bytes, limit: int) -> BinaryPush:
    """A ``QPB1`` body as the items of a push; ``limit``: the most bytes any part may unpack to."""
    body = _Reader(data)
    if body.take(4, "the magic") != PUSH_MAGIC:
        raise refused("it does not start with QPB1")
    flags = body.u8("the flags")
    budget = Budget(limit)
    if flags & ~PUSH_FLAGS:
        raise refused(f"unknown flags {flags & ~PUSH_FLAGS:#x}")
    if flags & FLAG_ZSTD:
        if flags & FLAG_FRAMES:
            raise refused("flags 1 (zstd body) and 8 (zstd frames) exclude each other")
        body.u32("the raw length")  # the frame declares it too, and that is what is checked
        body = _Reader(unzstd(data[body.at:], budget, "the body"))
    items: list[PushItem] = []
    if flags & FLAG_FRAMES:
        _framed_groups(body, budget, items)
    else:
        _plain_groups(body, bool(flags & FLAG_TXN), items)
    if not body.done():
        raise refused(f"bytes after the last group (from byte {body.at})")
    if not items:
        raise BadRequest("items array is required")
    return BinaryPush(items, bool(flags & FLAG_COUNTS))


def parse_binary_transaction(data: bytes, limit: int) -> BinaryTransaction:
    """A ``QTB1`` body: the JSON head (acks, required leases, riders) and the pushes."""
    body = _Reader(data)
    if body.take(4, "the magic") != TRANSACTION_MAGIC:
        raise refused("it does not start with QTB1")
    flags = body.u8("the flags")
    if flags & ~TRANSACTION_FLAGS:
        raise refused(f"unknown flags {flags & ~TRANSACTION_FLAGS:#x}")
    raw_head = body.take(body.u32("the head"), "the head")
    head: Any = {}
    if raw_head:
        try:
            head = ujson.loads(raw_head)
        except ValueError:
            raise refused("the head is not JSON") from None
        if not isinstance(head, dict):
            raise refused("the head must be a JSON object")
    items: list[PushItem] = []
    _framed_groups(body, Budget(limit), items)
    if not body.done():
        raise refused("bytes after the last group")
    return BinaryTransaction(head, items, bool(flags & FLAG_COUNTS))


def counts_answer(statuses: list[str]) -> dict[str, int]:
    """Flag 2's answer: how many items there were and how they ended. This broker adds
    ``buffered`` (acknowledged, stored in order later), so the four parts add up to ``count``."""
    tally = {s: 0 for s in ("queued", "buffered", "duplicate")}
    for s in statuses:
        if s in tally:
            tally[s] += 1
    return {"count": len(statuses), **tally, "error": len(statuses) - sum(tally.values())}
