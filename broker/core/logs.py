"""Log lines: one format for every line (the broker's, Sanic's, asyncpg's, pykka's), text or
JSON (LOG_FORMAT), and a throttle for lines that would repeat while a failure lasts.

Kept free of Sanic and asyncpg so the actors and services may use the throttle.
"""
from __future__ import annotations

import datetime as dt
import os
import sys
import time
from collections.abc import Hashable
from typing import Any

import ujson

TEXT_FORMAT = ("<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
               "{message}")


def json_line(record: Any) -> str:
    """One loguru record as one JSON object: ``time`` (UTC, ISO-8601 with milliseconds),
    ``level``, ``message``, ``logger``, ``function``, ``line``, ``pid``, ``context`` (values
    bound to the line, e.g. the access log's method and status) and, when the line carries
    one, ``exception`` (type, message and traceback in one string)."""
    stamp = record["time"].astimezone(dt.UTC)
    out: dict[str, Any] = {
        "time": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
        "level": record["level"].name,
        "message": record["message"],
        "logger": record["name"],
        "function": record["function"],
        "line": record["line"],
        "pid": record["process"].id,
        "context": {k: v for k, v in record["extra"].items() if not k.startswith("_")},
    }
    exception = record["exception"]
    if exception is not None and exception.type is not None:
        import traceback
        out["exception"] = "".join(traceback.format_exception(
            exception.type, exception.value, exception.traceback)).rstrip()
    return ujson.dumps(out, ensure_ascii=False, escape_forward_slashes=False,
                       default=str)


def json_sink(message: Any) -> None:
    sys.stderr.write(json_line(message.record) + "\n")
    sys.stderr.flush()


def add_sink(logger: Any, level: str, log_format: str) -> None:
    """The broker's one sink on stderr, in ``log_format`` ("text" or "json")."""
    if log_format == "json":
        logger.add(json_sink, level=level, format="{message}")
    else:
        logger.add(sys.stderr, level=level, format=TEXT_FORMAT,
                   colorize=None if os.environ.get("NO_COLOR") is None else False)


class Throttle:
    """At most one line per key every ``every_s`` seconds. ``allow(key)`` answers None when
    the line should be dropped, else how many were dropped since the last one shown (to say
    so on the line)."""

    def __init__(self, every_s: float = 60.0):
        self.every_s = every_s
        self._last: dict[Hashable, tuple[float, int]] = {}

    def allow(self, key: Hashable) -> int | None:
        now = time.monotonic()
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.every_s:
            self._last[key] = (seen[0], seen[1] + 1)
            return None
        if len(self._last) > 1000:  # keys come from a fixed set of messages; bound it anyway
            self._last.clear()
        self._last[key] = (now, 0)
        return seen[1] if seen is not None else 0


def dropped_note(count: int) -> str:
    return f" ({count} more like this in the last minute not logged)" if count else ""
