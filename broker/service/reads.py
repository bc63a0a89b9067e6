"""Offset reads (``POST /api/v1/fetch``) and partition discovery
(``POST /api/v1/partitions/changed``): no lease, no cursor, no ack, so two readers
asking the same question get the same answer and no consumer group notices.

Offsets are 0-based per partition: offset ``o`` is the message at position
``seq = o + 1`` (positions follow commit order, see ARCHITECTURE.md). A
partition's ``highWatermark`` is its ``last_seq`` (the next offset it will assign)
and ``logStartOffset`` the offset of its oldest kept message (``last_seq`` when
retention kept none). The answers are shaped by broker/http/wire/reads.py."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class Fetched:
    """What one entry read: its partition's figures, the rows of its records (from
    queen.fetch_v1) with their payloads decrypted, in offset order, or why none
    (``error``: one of the two codes above)."""
    entry: FetchEntry
    high_watermark: int = 0
    log_start: int = 0
    rows: list[Any] = field(default_factory=list)
    payloads: list[Any] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class ChangedPage:
    """One discovery page: the safe time read before the scan, the partitions' rows
    (name, id, last_seq, first_seq, last_message_at, created_at), whether a full page
    leaves more to read, or why none (``error``)."""
    query: ChangedQuery
    safe_time: dt.datetime | None
    rows: list[Any]
    more: bool = False
    error: str | None = None


def log_start(last_seq: int, first_seq: int | None) -> int:
    return last_seq if first_seq is None else first_seq - 1


async def fetch(ctx: BrokerContext, entries: list[FetchEntry], call_budget: int
                ) -> list[Fetched]:
    """One result per entry, in order."""
    rows = await reads.fetch(ctx.store, [e.queue for e in entries],
                             [e.partition for e in entries], [e.offset for e in entries],
                             [e.max_bytes for e in entries], call_budget,
                             MAX_RECORDS_PER_ENTRY)
    out = [Fetched(e) for e in entries]
    cipher = ctx.cipher
    for row in rows:
        got = out[row["idx"]]
        if row["partition_id"] is None:
            got.error = UNKNOWN_TOPIC_OR_PARTITION
            continue
        if row["seq"] is None:  # the entry's header row
            got.high_watermark = row["last_seq"]
            got.log_start = log_start(row["last_seq"], row["first_seq"])
            if not got.log_start <= got.entry.offset <= got.high_watermark:
                got.error = OFFSET_OUT_OF_RANGE
            continue
        payload: Any = row["payload"]
        if row["is_encrypted"] and cipher is not None:
            payload = cipher.decrypt(payload)
        got.rows.append(row)
        got.payloads.append(payload)
    return out


async def changed(ctx: BrokerContext, query: ChangedQuery) -> ChangedPage:
    """One discovery page of ``query``'s queue."""
    safe, rows = await reads.changed(ctx.store, query.queue, query.since, query.after,
                                     query.limit)
    if rows is None:
        return ChangedPage(query, safe, [], error=UNKNOWN_TOPIC_OR_PARTITION)
    return ChangedPage(query, safe, list(rows), more=len(rows) == query.limit)
