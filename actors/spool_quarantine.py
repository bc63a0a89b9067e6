"""Quarantine: spooled events the replay could never commit, kept for an operator.

Each entry is one JSON file ``<spool>/quarantine/<id>.json``::

    {"id": "queen-1733050000000-00000001-00000042",
     "reason": "rejected" | "invalid" | "unparseable" | "legacy",
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

Everything here is blocking file I/O; the spool actor calls it through
``asyncio.to_thread``.
"""
from __future__ import annotations

import base64
import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

import ujson

__all__ = ["Quarantine", "entry_id", "valid_id"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")
_SUFFIX = ".json"


def entry_id(origin_file: str, index: int, raw: bool = False) -> str:
    stem = origin_file.rsplit(".", 1)[0]
    return f"{stem}-{'raw' if raw else ''}{index:08d}"


def valid_id(value: str) -> bool:
    return bool(_ID.match(value))


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
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
        _fsync_dir(self.directory)
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


def import_failed_files(quarantine: Quarantine, failed_dir: Path, read_records) -> tuple[int, int]:
    """Turn every whole file an older version set aside in ``failed/`` into
    one entry per record, then delete the file. Returns (files, entries)."""
    files = entries = 0
    try:
        names = sorted(n for n in os.listdir(failed_dir) if n.endswith(".buf"))
    except FileNotFoundError:
        return 0, 0
    for name in names:
        path = failed_dir / name
        events, bad, _torn = read_records(path, keep_bad=True)
        for i, event in enumerate(events):
            quarantine.put(entry_id(name, i), reason="legacy", origin_file=name, index=i,
                           event=event,
                           error="set aside with its whole file by an earlier version")
        for j, raw in bad:
            quarantine.put(entry_id(name, j, raw=True), reason="unparseable", origin_file=name,
                           index=j, raw=raw, error="record is not valid JSON")
        path.unlink()
        files += 1
        entries += len(events) + len(bad)
    return files, entries
