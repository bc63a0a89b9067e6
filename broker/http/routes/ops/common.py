"""Helpers shared by the operator routes: time ranges, buckets, JSON shaping."""
from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Mapping
from typing import Any

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import iso_milli, parse_timestamp
from broker.http.wire.common import q_str

MAX_RANGE = dt.timedelta(days=92)


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def time_range(a: Mapping[str, str], default: dt.timedelta = dt.timedelta(hours=1),
               round_to_minute: bool = False) -> tuple[dt.datetime, dt.datetime]:
    """``from``/``to`` query parameters (any ISO-8601; default: the last ``default``).
    With ``round_to_minute`` a defaulted ``to`` is rounded up to the next minute
    (docs/wire-contract.md §13.1)."""
    raw_to, raw_from = q_str(a, "to"), q_str(a, "from")
    if raw_to is not None:
        until = parse_timestamp(raw_to, "to")
    else:
        until = now_utc()
        if round_to_minute:
            until = until.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    since = parse_timestamp(raw_from, "from") if raw_from is not None else until - default
    if since > until:
        raise BadRequest("from must not be after to")
    return since, until


INTERVALS = {"minute": 1, "hour": 60, "day": 1440}


def interval_minutes(a: Mapping[str, str], default: str = "hour") -> tuple[str, int]:
    name = (q_str(a, "interval") or default).lower()
    if name not in INTERVALS:
        raise BadRequest(f"interval must be one of {', '.join(INTERVALS)}, got {name!r}")
    return name, INTERVALS[name]


def series(rows, since: dt.datetime, until: dt.datetime, minutes: int) -> dict[str, Any]:
    """Bucket timestamps covering [since, until] and a {timestamp: value} map of ``rows``
    (``ts``, ``n``), so gaps read as zero."""
    width = minutes * 60
    start = int(since.timestamp() // width * width)
    stop = int(until.timestamp() // width * width)
    # Sliced as a range, before formatting: from=1970&to=9999 would be 400,000 buckets.
    stamps = [iso_milli(dt.datetime.fromtimestamp(t, dt.UTC))
              for t in range(start, stop + 1, width)[:5000]]
    values = {iso_milli(r["ts"]): (float(r["n"]) if isinstance(r["n"], float) else r["n"])
              for r in rows}
    return {"timestamps": stamps, "values": values}


def path_uuid(value: str, name: str) -> str:
    if not is_uuid(value):
        raise BadRequest(f"{name} must be a UUID, got {value!r}")
    return value


def plain(value: Any) -> Any:
    """Database values as JSON: timestamps ISO with milliseconds, UUIDs as strings."""
    if isinstance(value, dt.datetime):
        return iso_milli(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "items") and hasattr(value, "keys"):  # asyncpg.Record
        return {k: plain(v) for k, v in value.items()}
    return value
