"""The spool's record format and file names (docs/behaviour.md §5.1, §5.2).

A spool file written by this release starts with the 8-byte header ``HEADER``
(``QSPL`` and the format number 2) and holds repeated records::

    [u32 magic "QREC"][u32 body length][u32 CRC-32 of the length and body][UTF-8 JSON event]

(integers little-endian). The checksum (``zlib.crc32``: every single-bit error and
every burst up to 32 bits is caught) makes a flipped bit on disk a *corrupt* record,
never a different payload; the magic lets the reader find the next good record after
a damaged length. Files of the previous release have no header and hold bare
``[u32 length][JSON]`` records (*legacy*): they are still read, without checksums.

Reading a file (:func:`scan_bytes`) sorts its bytes into good records, damaged spans
(each kept raw, for the quarantine) and a *torn tail*: a last record cut short by a
crash (it runs past the end of the file, or the file ends inside a header, or in
zeros), which was never acknowledged when every push is fsynced before its answer.

A file's name, ``queen-<13-digit epoch ms>-<8-digit sequence>.tmp`` while it is
appended to and ``.buf`` once finalized, sorts in creation order and is the file's
identity in PostgreSQL's ledger (:func:`spool_file_key`).

Everything here is pure: no actor, no state. :class:`SpoolError` and :class:`SpoolFull`
live here because encoding is where a push first fails.
"""
from __future__ import annotations

import re
import struct
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import ujson

__all__ = ["HEADER", "NAME", "Pair", "Scan", "SpoolError", "SpoolFull", "SpoolSyncFailed",
           "accepted_at", "encode_file", "encode_legacy_records", "encode_records", "event_pair", "frame_record", "file_accept_us", "read_records",
           "scan_bytes", "spool_file_key", "tally_records"]

HEADER = b"QSPL\x00\x00\x00\x02"  # the file format marker (format 2)
MAGIC = b"QREC"
_LEN = struct.Struct("<I")
_REC = struct.Struct("<4sII")  # magic, body length, CRC-32 of (length bytes + body)
NAME = re.compile(r"^queen-(\d{13})-(\d{8})\.(tmp|buf)$")

Pair = tuple[str, str]  # (queue, partition)


class SpoolError(Exception):
    """A push could not be written to the spool (disk full, unwritable directory, a
    failed fsync...). None of that push was acknowledged: the caller reports every item
    failed (503)."""


class SpoolFull(SpoolError):
    """The push would take the spool past its byte cap; nothing was written."""


class SpoolSyncFailed(SpoolError):
    """The fsync that was to make a push durable failed: it was not acknowledged."""


def encode_records(events: Iterable[dict]) -> bytes:
    """The records of ``events`` (format 2), ready for one write after the file's header."""
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
        parts.append(frame_record(body))
    return b"".join(parts)


def frame_record(body: bytes) -> bytes:
    """One format-2 record around ``body`` (any bytes: tests frame damaged ones)."""
    crc = zlib.crc32(body, zlib.crc32(_LEN.pack(len(body))))
    return _REC.pack(MAGIC, len(body), crc) + body


def encode_file(events: Iterable[dict]) -> bytes:
    """A whole spool file holding ``events``: the header, then their records."""
    return HEADER + encode_records(events)


def encode_legacy_records(events: Iterable[dict]) -> bytes:
    """Records as the previous release wrote them (no header, no checksum): for tests of
    the upgrade path and for tools that build files by hand."""
    parts = []
    for event in events:
        body = ujson.dumps(event, ensure_ascii=False).encode("utf-8")
        parts += [_LEN.pack(len(body)), body]
    return b"".join(parts)


@dataclass
class Scan:
    """What one spool file holds. ``bad``: ``(record index, raw bytes, reason)`` of each
    damaged span (reason ``corrupt``: its checksum or frame is wrong; ``unparseable``:
    intact but not a JSON object); ``good_end``: where the last whole record ends (the
    file is cut there when its tail is torn); ``torn``: bytes after it."""

    events: list[dict] = field(default_factory=list)
    bad: list[tuple[int, bytes, str]] = field(default_factory=list)
    good_end: int = 0
    torn: int = 0
    legacy: bool = False

    @property
    def records(self) -> int:
        return len(self.events) + len(self.bad)


def _record_at(data: bytes, pos: int, end: int) -> int:
    """The end of a whole, intact format-2 record at ``pos``, or -1."""
    if pos + _REC.size > end:
        return -1
    magic, length, crc = _REC.unpack_from(data, pos)
    stop = pos + _REC.size + length
    if magic != MAGIC or stop > end:
        return -1
    body = memoryview(data)[pos + _REC.size:stop]
    if zlib.crc32(body, zlib.crc32(data[pos + 4:pos + 8])) != crc:
        return -1
    return stop


def _next_record(data: bytes, pos: int, end: int) -> int:
    """The start of the next intact record after ``pos``, or -1."""
    at = data.find(MAGIC, pos + 1)
    while at != -1:
        if _record_at(data, at, end) != -1:
            return at
        at = data.find(MAGIC, at + 1)
    return -1


def _torn(data: bytes, pos: int, end: int) -> bool:
    """Is the span ``[pos, end)``, with no intact record after it, a record cut short
    by a crash (rather than a whole record damaged on disk)?"""
    if end - pos < _REC.size or not data[pos:end].strip(b"\x00"):
        return True  # a header cut short, or zeros a crash left past the last write
    magic, length, crc = _REC.unpack_from(data, pos)
    if magic != MAGIC or pos + _REC.size + length <= end:
        return False
    # It claims to run past the end. A crash cut it short, unless only its length field is
    # damaged: then the bytes to the end are its whole body under the right length.
    body = memoryview(data)[pos + _REC.size:end]
    return zlib.crc32(body, zlib.crc32(_LEN.pack(len(body)))) != crc


def _parse(body: bytes | memoryview) -> dict | None:
    try:
        event = ujson.loads(bytes(body))
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def scan_bytes(data: bytes) -> Scan:
    """Sort a spool file's bytes; see :class:`Scan`."""
    if not data.startswith(HEADER):
        if len(data) < len(HEADER) and HEADER.startswith(data):
            return Scan(torn=len(data))  # a crash cut the header itself
        return _scan_legacy(data)
    out = Scan()
    pos, end, index = len(HEADER), len(data), 0
    while pos < end:
        stop = _record_at(data, pos, end)
        if stop != -1:
            event = _parse(memoryview(data)[pos + _REC.size:stop])
            if event is not None:
                out.events.append(event)
            else:
                out.bad.append((index, data[pos + _REC.size:stop], "unparseable"))
            pos, index = stop, index + 1
            continue
        nxt = _next_record(data, pos, end)
        if nxt == -1 and _torn(data, pos, end):
            break
        stop = end if nxt == -1 else nxt
        out.bad.append((index, data[pos:stop], "corrupt"))
        pos, index = stop, index + 1
    out.good_end, out.torn = pos, end - pos
    return out


def _scan_legacy(data: bytes) -> Scan:
    out = Scan(legacy=True)
    pos, end, index = 0, len(data), 0
    while pos + 4 <= end:
        (length,) = _LEN.unpack_from(data, pos)
        stop = pos + 4 + length
        if stop > end:
            break
        event = _parse(data[pos + 4:stop])
        if event is not None:
            out.events.append(event)
        else:
            out.bad.append((index, data[pos + 4:stop], "unparseable"))
        pos, index = stop, index + 1
    out.good_end, out.torn = pos, end - pos
    return out


def read_records(path: Path) -> Scan:
    """Every record of a spool file, sorted (see :func:`scan_bytes`); raises OSError."""
    return scan_bytes(Path(path).read_bytes())


def event_pair(event: Mapping[str, Any]) -> Pair:
    """The (queue, partition) of a spool event; partition defaults like the records."""
    # Typed as the push validated it before spooling; an event of a damaged file that lacks
    # its queue pairs as (None, ...) and fails at its replay, not here.
    return cast(str, event.get("queue")), event.get("partition") or "Default"


def tally_records(path: Path) -> tuple[int, Counter, dict]:
    """``(records, per-(queue, partition) events, per-pair first accept time)``
    of a spool file: whole records only (a torn tail was never acknowledged);
    damaged records count as records but belong to no partition."""
    try:
        scan = read_records(path)
    except OSError:
        return 0, Counter(), {}
    firsts: dict[Pair, int] = {}
    default = file_accept_us(Path(path).name)
    for e in scan.events:
        firsts.setdefault(event_pair(e), accepted_at(e, default))
    return scan.records, Counter(event_pair(e) for e in scan.events), firsts


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
