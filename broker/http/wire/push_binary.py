"""The binary push and transaction bodies the official client sends with ``binary_push``
(docs/wire-contract.md §4.2): parsed into the same items as the JSON bodies, with the same
acceptance rule and refusals, so everything after parsing is the JSON path. A group's queue and
partition are checked once, not per item, and the items are read in place: a binary body costs
the broker less than the same push in JSON.

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
from broker.core.ids import new_uuid7
from broker.core.validate import MAX_NAME, Invalid, name_problem, payload_json
from broker.http.wire.common import required_name
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
    """Little-endian fields off a body; a read past its end is the caller's mistake. ``what``
    names the field in a refusal; with ``index``, ``what`` is a format ("item {}'s payload")
    filled in only when refusing, so a well-formed item costs no string formatting."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, length: int, what: str, index: int = -1) -> bytes:
        end = self.at + length
        if end > len(self.data):
            raise refused(f"{_named(what, index)} runs past the end (at byte {self.at}, "
                          f"{length} byte(s) wanted, {len(self.data) - self.at} left)")
        piece = self.data[self.at:end]
        self.at = end
        return piece

    def u8(self, what: str, index: int = -1) -> int:
        return self.take(1, what, index)[0]

    def u16(self, what: str, index: int = -1) -> int:
        return int(_U16.unpack(self.take(2, what, index))[0])

    def u32(self, what: str, index: int = -1) -> int:
        return int(_U32.unpack(self.take(4, what, index))[0])

    def text(self, what: str, index: int = -1) -> str:
        raw = self.take(self.u16(what, index), what, index)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise refused(f"{_named(what, index)} is not UTF-8") from None

    def done(self) -> bool:
        return self.at == len(self.data)


def _named(what: str, index: int) -> str:
    return what if index < 0 else what.format(index)


class _Group:
    """A group's queue and partition, checked as the JSON path checks every item's (the same
    rule and texts), but once: at the group's first item, where the JSON path would first
    refuse them."""

    __slots__ = ("queue", "partition", "checked")

    def __init__(self, queue: str, partition: str) -> None:
        self.queue = queue
        self.partition = partition
        self.checked = False

    def check(self, index: int) -> None:
        required_name(self.queue, "Queue must be a string")
        required_name(self.partition, "Partition must be a string")
        for field, name in (("queue", self.queue), ("partition", self.partition)):
            problem = name_problem(name)
            if problem is not None:
                raise BadRequest(f"items[{index}].{field}: {problem}")
        self.checked = True


def _item(group: _Group, txid: str, raw: bytes, index: int) -> PushItem:
    """One message, with parse_push_item's checks in its order: the payload is one JSON
    document, the names, the transaction id, the acceptance rule. ``txid`` is never empty."""
    if raw:
        try:
            payload = ujson.loads(raw)
        except ValueError:
            raise refused(f"item {index}: the payload is not one JSON document") from None
    else:
        payload = None
    if not group.checked:
        group.check(index)
    # txid is non-empty decoded UTF-8 (no lone surrogate): only these can fail name_problem
    if len(txid) > MAX_NAME or "\x00" in txid:
        problem = name_problem(txid)
        if problem is not None:
            raise BadRequest(f"items[{index}].transactionId: {problem}")
    try:
        text = payload_json(payload, f"items[{index}].payload")
    except Invalid as exc:
        raise BadRequest(str(exc)) from None
    return PushItem(group.queue, group.partition, payload, txid, None, text)


def _plain_groups(body: _Reader, with_txn: bool, items: list[PushItem]) -> None:
    data = body.data
    for g in range(body.u32("the group count")):
        group = _Group(body.text(f"group {g}'s queue"), body.text(f"group {g}'s partition"))
        for _ in range(body.u32(f"group {g}'s message count")):
            n = len(items)
            # [u16 length, transactionId] | u32 length, payload: read in place
            at, txid = body.at, ""
            try:
                if with_txn:
                    start = at + 2
                    at = start + _U16.unpack_from(data, at)[0]
                    txid = data[start:at].decode("utf-8")
                start = at + 4
                at = start + _U32.unpack_from(data, at)[0]
            except (struct.error, UnicodeDecodeError):
                at = len(data) + 1
            if at <= len(data):
                body.at = at
                raw = data[start:at]
            else:  # read again field by field, which names what is wrong and where
                txid = body.text("item {}'s transactionId", n) if with_txn else ""
                raw = body.take(body.u32("item {}'s payload", n), "item {}'s payload", n)
            # "" asks the broker for an id, as a JSON push without one does
            items.append(_item(group, txid or new_uuid7(), raw, n))


def _frame(frames: _Reader, index: int) -> tuple[str, bytes]:
    """One message's frame off its group's frames: its transaction id (the client's message
    id text when it has none) and its payload. Read in place; a frame that does not read whole
    is read again field by field, which names what is wrong and where."""
    data, at = frames.data, frames.at
    # u32 length | u8 flags (0) | u8[16] message id | u16 length, transactionId | payload
    try:
        end = at + 4 + _U32.unpack_from(data, at)[0]
        start = at + 23 + _U16.unpack_from(data, at + 21)[0]
        txid = data[at + 23:start].decode("utf-8")
    except (struct.error, UnicodeDecodeError):
        end = start = len(data) + 1
    if start <= end <= len(data) and data[at + 4] == 0:
        frames.at = end
        return txid or str(uuid.UUID(bytes=data[at + 5:at + 21])), data[start:end]
    frame = _Reader(frames.take(frames.u32("item {}'s frame", index), "item {}'s frame", index))
    if frame.u8("item {}'s flags", index) != 0:
        raise refused(f"item {index}'s frame has flags this broker does not know")
    client_id = str(uuid.UUID(bytes=frame.take(16, "item {}'s message id", index)))
    return frame.text("item {}'s transactionId", index) or client_id, frame.data[frame.at:]


def _framed_groups(body: _Reader, budget: Budget, items: list[PushItem]) -> None:
    for g in range(body.u32("the group count")):
        group = _Group(body.text(f"group {g}'s queue"), body.text(f"group {g}'s partition"))
        count = body.u32(f"group {g}'s message count")
        frames = _Reader(unzstd(body.take(body.u32(f"group {g}'s frames"), f"group {g}'s frames"),
                                budget, f"group {g}'s frames"))
        for _ in range(count):
            n = len(items)
            txid, raw = _frame(frames, n)
            items.append(_item(group, txid, raw, n))
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
