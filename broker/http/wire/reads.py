"""Offset reads and partition discovery on the wire: the bodies of ``POST /api/v1/fetch``
and ``POST /api/v1/partitions/changed``, and their answers (Queen's entry shapes)."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import iso_micro, parse_timestamp
from broker.http.wire.common import array_field, body_object, is_int, name_field
from broker.service.reads import ChangedPage, ChangedQuery, Fetched, FetchEntry, log_start

FETCH_MAX_ENTRIES = 1024
FETCH_MAX_ENTRY_BYTES = 8 * 1024 * 1024
FETCH_MAX_CALL_BYTES = 32 * 1024 * 1024
CHANGED_MAX_ENTRIES = 100
CHANGED_PAGE_MAX = 1000


def _clamped_bytes(value: Any, where: str, ceiling: int) -> int:
    if value is None:
        return ceiling
    if not is_int(value) or value < 1:
        raise BadRequest(f"{where} must be a positive integer")
    return min(value, ceiling)


def parse_fetch(body: Any) -> tuple[list[FetchEntry], int]:
    """``{"entries": [{queue, partition, offset, maxBytes}], "maxBytes"}``."""
    body = body_object(body)
    entries = []
    for n, raw in enumerate(array_field(body, "entries", FETCH_MAX_ENTRIES)):
        if not isinstance(raw, dict):
            raise BadRequest(f"entries[{n}] must be an object")
        queue = name_field(raw.get("queue"), f"entries[{n}].queue")
        partition = raw.get("partition", "Default")
        partition = name_field(partition, f"entries[{n}].partition")
        offset = raw.get("offset", 0)
        if not is_int(offset) or not 0 <= offset < 2**62:
            raise BadRequest(f"entries[{n}].offset must be a non-negative integer")
        entries.append(FetchEntry(queue, partition, offset,
                                  _clamped_bytes(raw.get("maxBytes"), f"entries[{n}].maxBytes",
                                                 FETCH_MAX_ENTRY_BYTES)))
    return entries, _clamped_bytes(body.get("maxBytes"), "maxBytes", FETCH_MAX_CALL_BYTES)


def fetch_answer(fetched: list[Fetched]) -> dict:
    """One entry per requested entry, in order; ``error`` only on an entry that has one."""
    return {"entries": [_fetched(f) for f in fetched]}


def _fetched(f: Fetched) -> dict:
    out: dict = {"queue": f.entry.queue, "partition": f.entry.partition,
                 "highWatermark": f.high_watermark, "logStartOffset": f.log_start,
                 "records": [{"offset": r["seq"] - 1, "transactionId": r["transaction_id"],
                              "payload": payload, "ts": iso_micro(r["created_at"])}
                             for r, payload in zip(f.rows, f.payloads)]}
    if f.error is not None:
        out["error"] = f.error
    return out


def _next_cursor(created_at: dt.datetime, partition_id: Any) -> str:
    """The opaque ``next`` of a discovery page: where the following page starts (read
    back by :func:`_page_cursor`)."""
    return f"{iso_micro(created_at)}|{partition_id}"


def _page_cursor(value: Any, where: str) -> tuple[dt.datetime, str]:
    if not isinstance(value, str) or value.count("|") != 1:
        raise BadRequest(f"{where} must be the 'next' of a previous page")
    stamp, pid = value.split("|")
    if not is_uuid(pid):
        raise BadRequest(f"{where} must be the 'next' of a previous page")
    return parse_timestamp(stamp, where), pid


def parse_changed(body: Any) -> list[ChangedQuery]:
    """``{"entries": [{queue, since?, after?, limit?}]}``."""
    body = body_object(body)
    out = []
    for n, raw in enumerate(array_field(body, "entries", CHANGED_MAX_ENTRIES)):
        if not isinstance(raw, dict):
            raise BadRequest(f"entries[{n}] must be an object")
        queue = name_field(raw.get("queue"), f"entries[{n}].queue")
        since = raw.get("since")
        if since is not None:
            if not isinstance(since, str):
                raise BadRequest(f"entries[{n}].since must be an ISO-8601 timestamp")
            since = parse_timestamp(since, f"entries[{n}].since")
        after = raw.get("after")
        cursor = None if after is None else _page_cursor(after, f"entries[{n}].after")
        limit = raw.get("limit", CHANGED_PAGE_MAX)
        if not is_int(limit) or limit < 1:
            raise BadRequest(f"entries[{n}].limit must be a positive integer")
        out.append(ChangedQuery(queue, since, cursor, min(limit, CHANGED_PAGE_MAX)))
    return out


def changed_answer(pages: list[ChangedPage]) -> dict:
    """The pages of one discovery call, each read with its own safe time: the earliest
    page's safe time holds for every later page of this call."""
    safe = [s for s in (iso_micro(p.safe_time) for p in pages) if s is not None]
    return {"entries": [_changed(p) for p in pages], "safeTime": min(safe) if safe else None}


def _changed(page: ChangedPage) -> dict:
    queue = page.query.queue
    if page.error is not None:
        return {"queue": queue, "partitions": [], "error": page.error}
    rows = page.rows
    answer: dict = {"queue": queue, "partitions": [
        {"name": r["name"], "id": str(r["id"]), "lastOffset": r["last_seq"] - 1,
         "logStart": log_start(r["last_seq"], r["first_seq"]),
         "lastWriteAt": iso_micro(r["last_message_at"])} for r in rows]}
    if page.more:
        answer["next"] = _next_cursor(rows[-1]["created_at"], rows[-1]["id"])
    return answer
