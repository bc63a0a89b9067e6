"""The spool's writing side: the active file, owned by the actor (its inbox).

``append`` writes every event of one push or none of them: each gets this
broker's accept time and sequence, the records go to the active ``.tmp`` file in
one ``O_APPEND`` write (rolled back on a failed write), and past the byte cap
nothing is written (:class:`SpoolFull`). A write is a plain, short ``os.write``
on the event loop, never queued behind an upload. There is no fsync per push
(docs/behaviour.md §5.2): a push is answered once its records are in the file,
so a process crash loses nothing acknowledged; a finalized file is fsynced once.

A file is finalized (fsync, ``.tmp`` -> ``.buf``, drainable; an empty one is
deleted) when it holds ``events_per_file`` events, when the drain asks, and at
stop. A ``.tmp`` whose rename fails is *stranded*: still counted, retried at
every finalize. At start, ``scan_existing`` counts what a previous run left and
finalizes its ``.tmp`` files: nothing is deleted unuploaded.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from actors.spool.files import FileState, SpoolFile, SpoolFiles, list_buf_files, list_files
from actors.spool.records import NAME, SpoolError, SpoolFull, encode_records, event_pair

__all__ = ["SpoolWriter"]

_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)

# Indirections so tests can inject disk-full errors without patching os itself.
_os_write = os.write
_os_ftruncate = os.ftruncate


class SpoolWriter:
    """The active file and the finalizing of ``.tmp`` files; see the module docstring."""

    def __init__(self, directory: Path, files: SpoolFiles, *, events_per_file: int,
                 max_bytes: int, clock: Callable[[], float]) -> None:
        self.directory = directory
        self.failed_dir = directory / "failed"
        self.files = files
        self.events_per_file = max(1, int(events_per_file))
        self.max_bytes = max(1, int(max_bytes))
        self._clock = clock
        self._last_name = (0, -1)  # (ms, sequence) of the newest name handed out
        self._last_accept = 0  # accept times only rise, also when the wall clock steps back
        self._accept_seq = 0
        self._rollback_failed = False  # a failed write could not be cut off the active file
        self.healthy = True  # the last write (or the directory's creation) succeeded
        self.failed = 0  # events of pushes whose write failed
        self.rejected_full = 0  # events refused because the spool was at its cap

    # -- start ----------------------------------------------------------------------

    def make_dirs(self) -> None:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)

    def scan_existing(self) -> None:
        """Count what a previous run left and make new names sort after it;
        leftover ``.tmp`` files are finalized (blocking: start-up only)."""
        for path in list_files(self.directory):
            m = NAME.match(path.name)
            assert m is not None  # list_files() lists only the names NAME matches
            self._last_name = max(self._last_name, (int(m[1]), int(m[2])))
        for path in list_files(self.directory):
            if path.suffix == ".tmp":
                file = SpoolFile(path, FileState.STRANDED)
                file.read_counts()
                self.files.count_in(file)
                self._apply_finalize(file, _rename_or_drop(path), leftover=True)
        for path in list_buf_files(self.directory):
            self.files.count_found(path)

    # -- appending -------------------------------------------------------------------

    async def append(self, events: list[dict]) -> None:
        """Write every event of one push, or none of them (raises SpoolError,
        SpoolFull when the cap would be passed). Each event gets this broker's
        accept time (``acceptedAt``, microseconds, never decreasing) and a
        sequence number (``acceptSeq``)."""
        accept = self._next_accept()
        for event in events:
            self._accept_seq += 1
            event["acceptedAt"], event["acceptSeq"] = accept, self._accept_seq
        data = encode_records(events)
        if self.files.bytes + len(data) > self.max_bytes:
            self.rejected_full += len(events)
            raise SpoolFull(f"spool full: {self.files.bytes} of {self.max_bytes} bytes in use "
                            f"(FILE_BUFFER_MAX_BYTES); the push was not accepted")
        try:
            file = self._write(data)
        except OSError as exc:
            self.failed += len(events)
            self.healthy = False
            if self._rollback_failed:
                await self.finalize_active()
            raise SpoolError(f"spool write failed: {exc}") from exc
        self.healthy = True
        self.files.appended(file, len(events), len(data),
                            Counter(event_pair(e) for e in events), accept)
        if file.events >= self.events_per_file:
            await self.finalize_active()

    def _next_accept(self) -> int:
        self._last_accept = max(self._last_accept + 1, time.time_ns() // 1000)
        return self._last_accept

    def accept_floor(self) -> int:
        """A bound at or below any accept time still to come."""
        return max(self._last_accept + 1, time.time_ns() // 1000)

    def _write(self, data: bytes) -> SpoolFile:
        file = self.files.active or self._open_new()
        fd, before = file.fd, file.size
        assert fd is not None  # an active file is open
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += _os_write(fd, view[done:])
        except OSError:
            self._rollback(file, before)
            raise
        file.size += done
        return file

    def _rollback(self, file: SpoolFile, size: int) -> None:
        """Cut a half-written push off the active file again."""
        self._rollback_failed = False
        assert file.fd is not None  # only _write() rolls back, with the active file open
        try:
            _os_ftruncate(file.fd, size)
        except OSError as exc:
            # Cannot guarantee the file is clean: stop using it. Its records stay
            # readable; at worst the partial push is replayed without an ack.
            logger.error("spool: could not truncate {} after a failed write: {}", file.path, exc)
            file.size = os.fstat(file.fd).st_size
            self._rollback_failed = True

    def _open_new(self) -> SpoolFile:
        ms = max(int(self._clock() * 1000), self._last_name[0])
        seq = self._last_name[1] + 1 if ms == self._last_name[0] else 0
        path = self.directory / f"queen-{ms:013d}-{seq:08d}.tmp"
        try:
            fd = os.open(path, _OPEN_FLAGS, 0o644)
        except FileNotFoundError:  # the directory went away: make it again, once
            self.make_dirs()
            fd = os.open(path, _OPEN_FLAGS, 0o644)
        self._last_name = (ms, seq)
        file = SpoolFile(path, FileState.ACTIVE, counted=True, fd=fd)
        self.files.active = file
        return file

    # -- finalizing ------------------------------------------------------------------

    async def finalize(self) -> bool:
        """Close the active file: rename it to ``.buf`` (drainable), or delete it
        when it holds no events; retry stranded files. True when the active
        file became drainable."""
        done = await self.finalize_active()
        for path in list(self.files.stranded):
            await self._finalize_leftover(path)
        return done

    async def finalize_active(self) -> bool:
        file = self.files.active
        if file is None:
            return False
        # Closed for appends, still listed (stranded until renamed), so that what the drain
        # registers meanwhile still holds the file's partitions.
        self.files.active = None
        fd, file.fd, file.state = file.fd, None, FileState.STRANDED
        self.files.stranded[file.path] = file
        assert fd is not None  # an active file is open
        await asyncio.to_thread(_sync_and_close, fd, file.path, file.events > 0)
        outcome = await asyncio.to_thread(_rename_or_drop, file.path)
        return self._apply_finalize(file, outcome, leftover=False)

    async def finalize_leftovers(self) -> None:
        """Every ``.tmp`` but the active one (a crashed run's, or stranded)."""
        active = self.files.active.path if self.files.active is not None else None
        for path in await asyncio.to_thread(list_files, self.directory):
            if path.suffix == ".tmp" and path != active:
                await self._finalize_leftover(path)

    async def _finalize_leftover(self, path: Path) -> bool:
        file = self.files.stranded.get(path)
        if file is None:  # an earlier run's: counted once, here
            found = SpoolFile(path, FileState.STRANDED)
            await asyncio.to_thread(found.read_counts)
            file = self.files.stranded.get(path)
            if file is None:
                file = found
                self.files.count_in(file)
        outcome = await asyncio.to_thread(_rename_or_drop, path)
        return self._apply_finalize(file, outcome, leftover=True)

    def _apply_finalize(self, file: SpoolFile, outcome: str | OSError, leftover: bool) -> bool:
        if outcome in ("deleted", "gone"):
            self.files.stranded.pop(file.path, None)
            self.files.release(file)
            return False
        if isinstance(outcome, OSError):
            logger.error("spool: cannot finalize {}: {}", file.path, outcome)
            file.state = FileState.STRANDED
            self.files.stranded[file.path] = file
            return False
        self.files.finished_file(file)
        if leftover:
            logger.info("spool: finalized leftover {} ({} event(s))", file.name, file.events)
        return True


# -- blocking helpers (run in a thread) ----------------------------------------------

def _sync_and_close(fd: int, path: Path | None, sync: bool) -> None:
    try:
        if sync:
            os.fsync(fd)
    except OSError as exc:
        logger.warning("spool: fsync of {} failed: {}", path, exc)
    finally:
        os.close(fd)


def _rename_or_drop(path: Path) -> str | OSError:
    """``.tmp`` -> ``.buf``: 'renamed'; an empty file is unlinked: 'deleted';
    'gone' when it vanished; the OSError when it cannot be renamed now."""
    try:
        if path.stat().st_size == 0:
            path.unlink()
            return "deleted"
        os.rename(path, path.with_suffix(".buf"))
    except FileNotFoundError:
        return "gone"
    except OSError as exc:
        return exc
    return "renamed"
