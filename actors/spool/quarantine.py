"""Quarantine: spooled events the drain could never upload, kept for an operator.

Each entry is one JSON file ``<spool>/quarantine/<id>.json``::

    {"id": "queen-1733050000000-00000001-00000042",
     "reason": "rejected" | "invalid" | "unparseable" | "corrupt" | "legacy",
     "error": "...", "quarantinedAt": "2026-12-01T09:00:00.000Z",
     "originFile": "queen-1733050000000-00000001.buf", "index": 42,
     "event": {...the spooled push...} | null, "rawBase64": "..." (unparseable only)}

The id is derived from the origin file and the event's position in it, so
quarantining the same event twice (a crash between the quarantine and the
file's delete, then a second replay) rewrites the same entry instead of making
a second one. An entry is written to a temporary name, fsynced and renamed:
once the replay moves past an event, its entry is on disk.

``failed/`` holds whole files set aside by older versions (after five
rejections of a chunk); :func:`import_failed_files` turns each of their records
into an entry of its own, so the same routes list, replay and discard them.

:class:`Quarantine` is the blocking file I/O. :class:`QuarantineDesk` is what
the spool does with it, off the event loop (``asyncio.to_thread``): the drain
sets events aside, the operator's routes (through the spool actor) list, show,
replay and discard entries; it keeps the count /health reports.
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import ujson
from loguru import logger

from actors.spool.files import fsync_dir, make_dir
from actors.spool.records import event_pair, read_records
from broker.core.validate import event_problem

# Why a record kept only as raw bytes could not be read (records.Scan's reasons).
RAW_ERRORS = {"corrupt": "record failed its checksum or framing: damaged on disk",
              "unparseable": "record is not valid JSON"}

__all__ = ["RAW_ERRORS", "Quarantine", "QuarantineDesk", "entry_id", "import_failed_files", "valid_id"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")
_SUFFIX = ".json"


def entry_id(origin_file: str, index: int, raw: bool = False) -> str:
    stem = origin_file.rsplit(".", 1)[0]
    return f"{stem}-{'raw' if raw else ''}{index:08d}"


def valid_id(value: str) -> bool:
    return bool(_ID.match(value))


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Quarantine:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _path(self, ident: str) -> Path:
        if not valid_id(ident):
            raise KeyError(ident)
        return self.directory / f"{ident}{_SUFFIX}"

    def put(self, ident: str, *, reason: str, error: str, origin_file: str, index: int,
            event: Any = None, raw: bytes | None = None) -> bool:
        """Write one entry durably. True when it is new (not a rewrite)."""
        make_dir(self.directory)
        entry: dict[str, Any] = {"id": ident, "reason": reason, "error": error[:2000],
                                 "quarantinedAt": _now(), "originFile": origin_file,
                                 "index": index, "event": event}
        if raw is not None:
            entry["rawBase64"] = base64.b64encode(raw).decode("ascii")
        path = self._path(ident)
        existed = path.exists()
        tmp = path.with_suffix(".part")
        data = ujson.dumps(entry, ensure_ascii=True, escape_forward_slashes=False).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view, done = memoryview(data), 0
            while done < len(data):
                done += os.write(fd, view[done:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(self.directory)
        return not existed

    def ids(self) -> list[str]:
        try:
            with os.scandir(self.directory) as it:
                return sorted(e.name[:-len(_SUFFIX)] for e in it
                              if e.name.endswith(_SUFFIX) and e.is_file())
        except FileNotFoundError:
            return []

    def get(self, ident: str) -> dict | None:
        try:
            return ujson.loads(self._path(ident).read_bytes())
        except (KeyError, FileNotFoundError):
            return None

    def entries(self) -> list[dict]:
        out = []
        for ident in self.ids():
            entry = self.get(ident)
            if entry is not None:
                out.append(entry)
        return out

    def remove(self, ident: str) -> bool:
        try:
            self._path(ident).unlink()
        except (KeyError, FileNotFoundError):
            return False
        return True


def import_failed_files(quarantine: Quarantine, failed_dir: Path) -> tuple[int, int]:
    """Turn every whole file an older version set aside in ``failed/`` into
    one entry per record, then delete the file. Returns (files, entries)."""
    files = entries = 0
    try:
        names = sorted(n for n in os.listdir(failed_dir) if n.endswith(".buf"))
    except FileNotFoundError:
        return 0, 0
    for name in names:
        path = failed_dir / name
        scan = read_records(path)
        for i, event in enumerate(scan.events):
            quarantine.put(entry_id(name, i), reason="legacy", origin_file=name, index=i,
                           event=event,
                           error="set aside with its whole file by an earlier version")
        for j, raw, why in scan.bad:
            quarantine.put(entry_id(name, j, raw=True), reason=why, origin_file=name,
                           index=j, raw=raw, error=RAW_ERRORS[why])
        path.unlink()
        files += 1
        entries += scan.records
    return files, entries


# -- the spool's side (async) ---------------------------------------------------------

class QuarantineDesk:
    """The quarantine as the spool uses it; ``count`` is the number of entries now."""

    def __init__(self, directory: Path, replay: Callable[[list[dict]], Awaitable[Any]]) -> None:
        self.store = Quarantine(directory)
        self._replay = replay  # a direct push
        self.count = 0

    def recount(self) -> None:
        """Blocking: start-up only."""
        self.count = len(self.store.ids())

    async def import_failed(self, failed_dir: Path) -> None:
        """Files an older version set aside whole become entries, one per record."""
        try:
            files, entries = await asyncio.to_thread(import_failed_files, self.store, failed_dir)
        except OSError as exc:
            logger.error("spool: cannot move {} into the quarantine: {}", failed_dir, exc)
            return
        if files:
            logger.warning("spool: {} file(s) an earlier version set aside in {} are now {} "
                           "quarantined event(s): GET /api/v1/system/spool/quarantine",
                           files, failed_dir, entries)
        self.count = len(await asyncio.to_thread(self.store.ids))

    async def set_aside(self, name: str, index: int, event: dict, reason: str,
                        error: str) -> bool:
        """Set one event of spool file ``name`` aside durably; False when the
        quarantine cannot be written (the file then stays where it is and is retried)."""
        ident = entry_id(name, index)
        try:
            new = await asyncio.to_thread(self.store.put, ident, reason=reason, error=error,
                                          origin_file=name, index=index, event=event)
        except OSError as exc:
            logger.error("spool: cannot quarantine event {} of {}: {}", index, name, exc)
            return False
        if new:
            self.count += 1
        queue, partition = event_pair(event) if isinstance(event, Mapping) else (None, None)
        logger.error("spool: event {} of {} ({}/{}, transactionId {}) quarantined as {}: {}",
                     index, name, queue, partition,
                     event.get("transactionId") if isinstance(event, Mapping) else None,
                     ident, error)
        return True

    async def set_aside_raw(self, name: str, bad: list[tuple[int, bytes, str]]) -> None:
        """Damaged records of spool file ``name`` (``(index, raw bytes, reason)``, see
        records.Scan), kept as raw bytes (raises OSError)."""
        for index, raw, why in bad:
            ident = entry_id(name, index, raw=True)
            if await asyncio.to_thread(self.store.put, ident, reason=why,
                                       error=RAW_ERRORS[why], origin_file=name,
                                       index=index, raw=raw):
                self.count += 1
        reasons = ", ".join(f"{n} {why}" for why, n in
                            sorted(Counter(why for *_, why in bad).items()))
        logger.error("spool: {} damaged record(s) of {} quarantined ({}); the records around "
                     "them drain", len(bad), name, reasons)

    # -- the operator's routes -------------------------------------------------------

    async def list(self) -> list[dict]:
        """Every entry, without its payload, oldest origin first."""
        entries = await asyncio.to_thread(self.store.entries)
        self.count = len(entries)
        return [summary(e) for e in entries]

    async def get(self, ident: str) -> dict | None:
        return await asyncio.to_thread(self.store.get, ident)

    async def discard(self, ident: str) -> bool:
        entry = await asyncio.to_thread(self.store.get, ident)
        if entry is None or not await asyncio.to_thread(self.store.remove, ident):
            return False
        self.count = max(0, self.count - 1)
        logger.warning("spool: quarantined event {} discarded by an operator ({})", ident,
                       summary(entry).get("transactionId"))
        return True

    async def replay(self, ident: str, overrides: Mapping[str, str]) -> dict:
        """Push one quarantined event now (with the operator's ``queue`` /
        ``partition`` overrides); the entry is removed once it committed.
        Raises ``LookupError`` (no such entry), ``ValueError`` (it still cannot
        be stored), or the replay's own error (database down...)."""
        entry = await asyncio.to_thread(self.store.get, ident)
        if entry is None:
            raise LookupError(ident)
        event = entry.get("event")
        if not isinstance(event, dict):
            raise ValueError("this record was never valid JSON; it can only be discarded")
        event = {**event, **{k: v for k, v in overrides.items() if k in ("queue", "partition")}}
        problem = event_problem(event)
        if problem is not None:
            raise ValueError(problem)
        results = await self._replay([event])
        await asyncio.to_thread(self.store.remove, ident)
        self.count = max(0, self.count - 1)
        status = results[0]["status"] if results else "queued"
        if status == "staged":  # durable, behind staged pushes to its partition
            status = "buffered"
        logger.info("spool: quarantined event {} replayed ({}/{}): {}", ident, event.get("queue"),
                    event.get("partition"), status)
        return {"id": ident, "status": status, "queue": event.get("queue"),
                "partition": event.get("partition") or "Default",
                "transactionId": event.get("transactionId")}


def summary(entry: Mapping[str, Any]) -> dict:
    """An entry as the list shows it: no payload."""
    raw = entry.get("event")
    event: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return {"id": entry.get("id"), "reason": entry.get("reason"), "error": entry.get("error"),
            "quarantinedAt": entry.get("quarantinedAt"), "originFile": entry.get("originFile"),
            "index": entry.get("index"), "queue": event.get("queue"),
            "partition": event.get("partition") or ("Default" if event else None),
            "transactionId": event.get("transactionId")}
