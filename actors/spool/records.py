"""The spool's record format and file names (docs/behaviour.md §5.1, §5.2).

A spool file holds repeated ``[u32 little-endian body length][UTF-8 JSON event]``
records. Its name, ``queen-<13-digit epoch ms>-<8-digit sequence>.tmp`` while it is
appended to and ``.buf`` once finalized, sorts in creation order and is the file's
identity in PostgreSQL's ledger (:func:`spool_file_key`).

Everything here is pure: no actor, no state. :class:`SpoolError` and :class:`SpoolFull`
live here because encoding is where a push first fails.
"""
from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import ujson

__all__ = ["NAME", "Pair", "SpoolError", "SpoolFull", "accepted_at", "encode_records",
           "event_pair", "file_accept_us", "read_records", "spool_file_key", "tally_records"]

_LEN = struct.Struct("<I")
NAME = re.compile(r"^queen-(\d{13})-(\d{8})\.(tmp|buf)$")

Pair = tuple[str, str]  # (queue, partition)


class SpoolError(Exception):
    """A push could not be written to the spool (disk full, unwritable directory...).

    Nothing of that push stays in the spool: the caller reports every item failed.
    """


class SpoolFull(SpoolError):
    """The push would take the spool past its byte cap; nothing was written."""


def encode_records(events: Iterable[dict]) -> bytes:
    """The records of ``events``, ready for one write."""
    parts = []
    for event in events:
        if not isinstance(event, dict) or not event.get("transactionId"):
            raise SpoolError("spool write failed: every event needs a transactionId")
        if "partition" not in event or event["partition"] is None:
            event = {**event, "partition": "Default"}
        try:
            body = ujson.dumps(event, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, OverflowError) as exc:
            raise SpoolError(f"spool write failed: event not serializable: {exc}") from exc
        parts.append(_LEN.pack(len(body)))
        parts.append(body)
    return b"".join(parts)


def read_records(path: Path, keep_bad: bool = False):
    """Every complete, parseable event of a spool file, in write order.

    Returns ``(events, skipped, torn)``: records whose JSON does not parse are
    skipped (with ``keep_bad``, ``skipped`` is the list of their
    ``(record index, raw bytes)`` instead of a count); reading stops at a torn
    tail (a record running past end of file), which was never acknowledged to
    its client.
    """
    data = Path(path).read_bytes()
    events: list[dict] = []
    bad: list[tuple[int, bytes]] = []
    pos, end, index = 0, len(data), 0
    while pos + 4 <= end:
        (length,) = _LEN.unpack_from(data, pos)
        stop = pos + 4 + length
        if stop > end:
            break
        try:
            event = ujson.loads(data[pos + 4:stop])
        except ValueError:
            event = None
        if isinstance(event, dict):
            events.append(event)
        else:
            bad.append((index, data[pos + 4:stop]))
        pos = stop
        index += 1
    return events, (bad if keep_bad else len(bad)), pos != end


def event_pair(event: Mapping[str, Any]) -> Pair:
    """The (queue, partition) of a spool event; partition defaults like the records."""
    # Typed as the push validated it before spooling; an event of a damaged file that lacks
    # its queue pairs as (None, ...) and fails at its replay, not here.
    return cast(str, event.get("queue")), event.get("partition") or "Default"


def tally_records(path: Path) -> tuple[int, Counter, dict]:
    """``(records, per-(queue, partition) events, per-pair first accept time)``
    of a spool file: complete records only (a torn tail was never
    acknowledged); unparseable records count as records but belong to no
    partition."""
    try:
        events, skipped, _ = read_records(path)
    except OSError:
        return 0, Counter(), {}
    firsts: dict[Pair, int] = {}
    default = file_accept_us(Path(path).name)
    for e in events:
        firsts.setdefault(event_pair(e), accepted_at(e, default))
    return len(events) + skipped, Counter(event_pair(e) for e in events), firsts


def spool_file_key(name: str) -> tuple[int, int]:
    """``(file_ms, file_seq)`` of a spool file name ``queen-<ms>-<seq>.buf``."""
    m = NAME.match(name)
    if m is None:
        raise ValueError(f"not a spool file name: {name}")
    return int(m[1]), int(m[2])


def file_accept_us(name: str) -> int:
    """The creation time of a spool file (from its name), in microseconds:
    the accept time of events written before accept times were recorded."""
    m = NAME.match(name)
    return int(m[1]) * 1000 if m else 0


def accepted_at(event: Mapping[str, Any], default: int = 0) -> int:
    """When this broker accepted a spooled push (its clock, microseconds)."""
    value = event.get("acceptedAt")
    return value if isinstance(value, int) and not isinstance(value, bool) else default
