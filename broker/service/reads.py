"""Offset reads (``POST /api/v1/fetch``) and partition discovery
(``POST /api/v1/partitions/changed``): no lease, no cursor, no ack, so two readers
asking the same question get the same answer and no consumer group notices.

Offsets are 0-based per partition: offset ``o`` is the message at position
``seq = o + 1`` (positions follow commit order, see ARCHITECTURE.md). A
partition's ``highWatermark`` is its ``last_seq`` (the next offset it will assign)
and ``logStartOffset`` the offset of its oldest kept message (``last_seq`` when
retention kept none)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from broker.core.times import iso_micro
from broker.service.context import BrokerContext
from broker.store import reads

OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"

MAX_RECORDS_PER_ENTRY = 10_000
"""Records one entry may return, whatever its byte budget."""


@dataclass(frozen=True)
class FetchEntry:
    queue: str
    partition: str
    offset: int
    max_bytes: int


@dataclass(frozen=True)
class ChangedQuery:
    queue: str
    since: dt.datetime | None
    after: tuple[dt.datetime, str] | None
    limit: int


def _log_start(last_seq: int, first_seq: int | None) -> int:
    return last_seq if first_seq is None else first_seq - 1


async def fetch(ctx: BrokerContext, entries: list[FetchEntry], call_budget: int) -> list[dict]:
    """One answer per entry, in order (Queen's ``fetch`` entry shape)."""
    rows = await reads.fetch(ctx.store, [e.queue for e in entries],
                             [e.partition for e in entries], [e.offset for e in entries],
                             [e.max_bytes for e in entries], call_budget,
                             MAX_RECORDS_PER_ENTRY)
    out: list[dict] = []
    for e in entries:
        out.append({"queue": e.queue, "partition": e.partition, "highWatermark": 0,
                    "logStartOffset": 0, "records": []})
    cipher = ctx.cipher
    for row in rows:
        entry = out[row["idx"]]
        if row["partition_id"] is None:
            entry["error"] = UNKNOWN_TOPIC_OR_PARTITION
            continue
        if row["seq"] is None:  # the entry's header row
            hwm = row["last_seq"]
            start = _log_start(hwm, row["first_seq"])
            entry["highWatermark"], entry["logStartOffset"] = hwm, start
            offset = entries[row["idx"]].offset
            if offset < start or offset > hwm:
                entry["error"] = OFFSET_OUT_OF_RANGE
            continue
        payload: Any = row["payload"]
        if row["is_encrypted"] and cipher is not None:
            payload = cipher.decrypt(payload)
        entry["records"].append({"offset": row["seq"] - 1, "transactionId": row["transaction_id"],
                                 "payload": payload, "ts": iso_micro(row["created_at"])})
    return out


def page_cursor(created_at: dt.datetime, partition_id: Any) -> str:
    """The opaque ``next`` of a discovery page: where the following page starts."""
    return f"{iso_micro(created_at)}|{partition_id}"


async def changed(ctx: BrokerContext, query: ChangedQuery) -> tuple[str | None, dict]:
    """(safe time, the entry's answer) for one discovery page."""
    safe, rows = await reads.changed(ctx.store, query.queue, query.since, query.after,
                                     query.limit)
    if rows is None:
        return iso_micro(safe), {"queue": query.queue, "partitions": [],
                                 "error": UNKNOWN_TOPIC_OR_PARTITION}
    partitions = [{"name": r["name"], "id": str(r["id"]), "lastOffset": r["last_seq"] - 1,
                   "logStart": _log_start(r["last_seq"], r["first_seq"]),
                   "lastWriteAt": iso_micro(r["last_message_at"])} for r in rows]
    answer: dict = {"queue": query.queue, "partitions": partitions}
    if len(rows) == query.limit:
        answer["next"] = page_cursor(rows[-1]["created_at"], rows[-1]["id"])
    return iso_micro(safe), answer
