"""Offset reads and partition discovery on the wire: the bodies of ``POST /api/v1/fetch``
and ``POST /api/v1/partitions/changed``, and the discovery's answer."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import parse_timestamp
from broker.http.wire.common import array_field, body_object, is_int, name_field
from broker.service.reads import ChangedQuery, FetchEntry

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


def changed_answer(pages: list[tuple[str | None, dict]]) -> dict:
    """The pages of one discovery call, each with its query's safe time: the earliest
    page's safe time holds for every later page of this call."""
    safe = [safe_time for safe_time, _ in pages if safe_time is not None]
    return {"entries": [answer for _, answer in pages], "safeTime": min(safe) if safe else None}
