"""Request parsing for the state surfaces (offset reads, key/value, locks, timers) and
their transaction riders: every malformed body is a :class:`BadRequest` (400) raised
before anything is read or written. Shared by several route modules (``routes/reads``,
``routes/kv``, ``routes/locks``, ``routes/timers`` and the transaction in
``routes/ack``), which is why it is not in any one of them."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from broker.service.reads import ChangedQuery, FetchEntry
from broker.validate import MAX_NAME, text_problem
from broker.wire import BadRequest, body_object, is_uuid, parse_timestamp

FETCH_MAX_ENTRIES = 1024
FETCH_MAX_ENTRY_BYTES = 8 * 1024 * 1024
FETCH_MAX_CALL_BYTES = 32 * 1024 * 1024
CHANGED_MAX_ENTRIES = 100
CHANGED_PAGE_MAX = 1000


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def name_field(value: Any, where: str, *, max_len: int = MAX_NAME, code: str | None = None
               ) -> str:
    """A non-empty string PostgreSQL can store, at most ``max_len`` characters."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where} must be a non-empty string", code=code)
    if len(value) > max_len:
        raise BadRequest(f"{where} is longer than {max_len} characters", code=code)
    problem = text_problem(value)
    if problem:
        raise BadRequest(f"{where} {problem}", code=code)
    return value


def array_field(body: Mapping[str, Any], field: str, most: int, *, code: str | None = None,
                allow_empty: bool = False) -> list:
    items = body.get(field)
    if not isinstance(items, list):
        raise BadRequest(f"{field} must be an array", code=code)
    if not items and not allow_empty:
        raise BadRequest(f"{field} must not be empty", code=code)
    if len(items) > most:
        raise BadRequest(f"{field} holds {len(items)} elements, at most {most}", code=code)
    return items


def _clamped_bytes(value: Any, where: str, ceiling: int) -> int:
    if value is None:
        return ceiling
    if not is_int(value) or value < 1:
        raise BadRequest(f"{where} must be a positive integer")
    return min(value, ceiling)


# -- offset reads ------------------------------------------------------------------------

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
