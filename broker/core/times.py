"""Times on the wire: the ISO-8601 spellings of stored timestamps, and the parse of a
caller's timestamp."""
from __future__ import annotations

import datetime as dt

from broker.core.errors import BadRequest

# asyncpg decodes a stored timestamptz of +/-infinity as these naive stand-ins (every real
# value arrives timezone-aware); readers report them the way PostgreSQL spells them.
_STORED_INFINITY = {dt.datetime.max: "infinity", dt.datetime.min: "-infinity"}


def _iso(ts: dt.datetime, timespec: str) -> str:
    if ts.tzinfo is dt.UTC:
        # What asyncpg hands back for every timestamptz (the pool's timezone is UTC):
        # the isoformat ends "+00:00", which becomes the literal Z. A third cheaper than
        # the general path below, and a pop formats one per message.
        return ts.isoformat(timespec=timespec)[:-6] + "Z"
    if ts.tzinfo is None:
        return _STORED_INFINITY.get(ts) or ts.isoformat(timespec=timespec) + "Z"
    if ts.utcoffset():
        ts = ts.astimezone(dt.UTC)
    # isoformat, not strftime: strftime writes year 1 as "1", not "0001".
    return ts.replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


def iso_micro(ts: dt.datetime | None) -> str | None:
    """Pop messages: microseconds and a literal Z."""
    return None if ts is None else _iso(ts, "microseconds")


_UNIX_EPOCH = dt.datetime(1970, 1, 1)
_SECONDS: dict[int, str] = {}  # whole seconds since the epoch -> "YYYY-MM-DDTHH:MM:SS"
_SECONDS_KEPT = 4096


def iso_micro_us(us: int) -> str:
    """``iso_micro`` of a time given as microseconds since the Unix epoch (a pop's
    ``created_us``). The messages of one pop mostly share their seconds, whose text is
    kept (bounded): a pop formats one time per message, and the datetime way costs ~1 µs."""
    seconds, micros = divmod(us, 1_000_000)
    prefix = _SECONDS.get(seconds)
    if prefix is None:
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        prefix = _SECONDS[seconds] = (_UNIX_EPOCH + dt.timedelta(seconds=seconds)).isoformat()
    return f"{prefix}.{micros:06d}Z"


def iso_milli(ts: dt.datetime | None) -> str | None:
    """Every other route: milliseconds and a literal Z."""
    return None if ts is None else _iso(ts, "milliseconds")


# Timestamps a caller may send. The floor is the Unix epoch (no message is older, so an
# earlier subscription start means the same as the epoch); the ceiling is a day below Python's
# datetime.max, so converting any UTC offset and the routes' own arithmetic cannot overflow.
EARLIEST_TIMESTAMP = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


LATEST_TIMESTAMP = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)


def parse_timestamp(value: str, name: str) -> dt.datetime:
    """An ISO-8601 timestamp (naive means UTC) between EARLIEST_ and LATEST_TIMESTAMP, in UTC."""
    text = value.strip()
    if text.endswith("Z") or text.endswith("z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{name} must be an ISO-8601 timestamp, got {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    utc: dt.datetime | None
    try:
        utc = parsed.astimezone(dt.UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is in year 0
        utc = None
    if utc is None or not EARLIEST_TIMESTAMP <= utc <= LATEST_TIMESTAMP:
        raise BadRequest(f"{name} must be between {iso_milli(EARLIEST_TIMESTAMP)} and "
                         f"{iso_milli(LATEST_TIMESTAMP)}, got {value!r}")
    return utc
