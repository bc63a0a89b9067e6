"""The spool's writing side: the active file, owned by the actor (its inbox).

``append`` writes every event of one push or none of them: each gets this
broker's accept time and sequence, the records go to the active ``.tmp`` file in
one ``O_APPEND`` write (rolled back on a failed write), and past the byte cap
nothing is written (:class:`SpoolFull`). The write is a plain, short ``os.write``
on the event loop. ``append`` then answers a future that says when the push may
be acknowledged (docs/behaviour.md §5.2):

* ``FILE_BUFFER_FSYNC=always`` (the default): once an ``fdatasync`` of the file
  that started after the write has returned, so the answer ``buffered`` survives
  a power cut. Syncs are grouped: one runs at a time per file, off the event
  loop, and every push written while it runs shares the next one (group commit,
  as PostgreSQL does for its WAL). The first sync of a new file also fsyncs the
  directory, so the file's name is as durable as its records.
* ``interval:MS``: at once; the file is synced at most MS later. A host crash
  (not a process crash) may lose up to MS of acknowledged pushes.

A failed sync is a failed write: the pushes it was to cover are answered 503
(:class:`SpoolSyncFailed`), counted and logged. After a failed fsync the kernel
may have dropped the pages it could not write and cleared the error (PostgreSQL's
"fsyncgate"), so the file is never trusted past the last sync that succeeded: it
is cut back to that length, closed, and finalized with only what was
acknowledged; the next push opens a fresh file.

A file is finalized (synced, ``.tmp`` -> ``.buf`` and the directory fsynced,
drainable; an empty one is deleted) when it holds ``events_per_file`` events,
when the drain asks, and at stop. A ``.tmp`` whose rename fails is *stranded*:
still counted, retried at every finalize. At start, ``scan_existing`` reads what a
previous run left (cutting off torn tails, counting damaged records) and
finalizes its ``.tmp`` files: nothing is deleted unuploaded.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from actors.spool.files import (
    FileState,
    SpoolFile,
    SpoolFiles,
    fsync_dir,
    list_buf_files,
    list_files,
    make_dir,
)
from actors.spool.records import (
    HEADER,
    NAME,
    SpoolError,
    SpoolFull,
    SpoolSyncFailed,
    encode_records,
    event_pair,
    read_records,
)
from broker.core.logs import Throttle, dropped_note

__all__ = ["Recovered", "SpoolWriter"]

_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)

_SYNC_FAILURE_LINES = Throttle(60.0)  # a failing disk fails every push: a line a minute

# Indirections so tests can inject disk-full errors without patching os itself.
_os_write = os.write
_os_ftruncate = os.ftruncate


@dataclass
class Recovered:
    """What ``scan_existing`` found a previous run left (for the start-up line)."""

    files: int = 0
    events: int = 0
    torn_files: int = 0
    torn_bytes: int = 0  # cut off: records a crash left half-written (never acknowledged)
    damaged: int = 0  # records whose checksum or frame is wrong: they go to the quarantine
    legacy_files: int = 0  # written by the previous release (no checksums)


class SpoolWriter:
    """The active file and the finalizing of ``.tmp`` files; see the module docstring.
    ``sync_interval_ms``: None for ``FILE_BUFFER_FSYNC=always``, else the window."""

    def __init__(self, directory: Path, files: SpoolFiles, *, events_per_file: int,
                 max_bytes: int, clock: Callable[[], float],
                 sync_interval_ms: int | None = None) -> None:
        self.directory = directory
        self.failed_dir = directory / "failed"
        self.files = files
        self.events_per_file = max(1, int(events_per_file))
        self.max_bytes = max(1, int(max_bytes))
        self.sync_interval_s = None if sync_interval_ms is None else max(1, sync_interval_ms) / 1000
        self._clock = clock
        self._last_name = (0, -1)  # (ms, sequence) of the newest name handed out
        self._last_accept = 0  # accept times only rise, also when the wall clock steps back
        self._accept_seq = 0
        self._rollback_failed = False  # a failed write could not be cut off the active file
        self._finishing: set[asyncio.Task] = set()  # files closed after a failed sync
        self.healthy = True  # the last write and sync (or the directory's creation) succeeded
        self.failed = 0  # events of pushes whose write or sync failed (answered 503)
        self.rejected_full = 0  # events refused because the spool was at its cap
        self.syncs = 0  # fdatasync calls that succeeded
        self.sync_failures = 0  # fdatasync calls that failed
        self.unsafe_acknowledged = 0  # interval mode: acknowledged events whose sync failed
        self.recovered = Recovered()

    @property
    def policy(self) -> str:
        """FILE_BUFFER_FSYNC as set."""
        if self.sync_interval_s is None:
            return "always"
        return f"interval:{round(self.sync_interval_s * 1000)}"

    # -- start ----------------------------------------------------------------------

    def make_dirs(self) -> None:
        make_dir(self.directory)
        make_dir(self.failed_dir)

    def scan_existing(self) -> Recovered:
        """Count what a previous run left and make new names sort after it; cut torn
        tails off; finalize leftover ``.tmp`` files (blocking: start-up only)."""
        found = self.recovered = Recovered()
        paths = list_files(self.directory)
        for path in paths:
            m = NAME.match(path.name)
            assert m is not None  # list_files() lists only the names NAME matches
            self._last_name = max(self._last_name, (int(m[1]), int(m[2])))
            try:
                scan = read_records(path)
                if scan.torn:
                    _cut(path, scan.good_end)
            except OSError as exc:
                logger.error("spool: cannot read {} at start: {}", path, exc)
                continue
            found.files += 1
            found.events += len(scan.events)
            found.damaged += sum(1 for *_, why in scan.bad if why == "corrupt")
            found.legacy_files += scan.legacy
            if scan.torn:
                found.torn_files += 1
                found.torn_bytes += scan.torn
                logger.warning("spool: {}: cut off a torn last record ({} byte(s) a crash "
                               "left half-written; never acknowledged)", path.name, scan.torn)
        for path in paths:
            if path.suffix == ".tmp":
                file = SpoolFile(path, FileState.STRANDED)
                file.read_counts()
                self.files.count_in(file)
                self._apply_finalize(file, _rename_or_drop(path), leftover=True)
        for path in list_buf_files(self.directory):
            self.files.count_found(path)
        return found

    # -- appending -------------------------------------------------------------------

    async def append(self, events: list[dict]) -> asyncio.Future[None]:
        """Write every event of one push, or none of them (raises SpoolError,
        SpoolFull when the cap would be passed), and answer a future that is done
        when the push may be acknowledged (it raises SpoolSyncFailed when the
        sync failed). Each event gets this broker's accept time (``acceptedAt``,
        microseconds, never decreasing) and a sequence number (``acceptSeq``)."""
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
        self.files.appended(file, len(events), len(data),
                            Counter(event_pair(e) for e in events), accept)
        durable = self._durable(file, len(events))
        if file.events >= self.events_per_file:
            await self.finalize_active()
        return durable

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
        try:
            done = _os_write(fd, HEADER)
            if done != len(HEADER):
                raise OSError(f"short write of the file header ({done} bytes)")
        except OSError:
            os.close(fd)
            _unlink_quietly(path)
            raise
        file = SpoolFile(path, FileState.ACTIVE, counted=True, fd=fd, size=len(HEADER))
        self.files.bytes += len(HEADER)
        self.files.active = file
        return file

    # -- durability ------------------------------------------------------------------

    def _durable(self, file: SpoolFile, events: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if self.sync_interval_s is not None:  # acknowledged on write; synced within the window
            done.set_result(None)
            if file.sync_timer is None:
                file.sync_timer = loop.call_later(self.sync_interval_s, self._sync_soon, file)
            file.unsynced_events += events
            return done
        file.waiters.append((done, events))
        if file.syncing is None:
            file.syncing = loop.create_task(self._sync(file), name="spool-sync")
        return done

    def _sync_soon(self, file: SpoolFile) -> None:
        """interval mode: the window of ``file`` is over."""
        file.sync_timer = None
        if file.fd is None or file.size <= file.synced:
            return
        loop = asyncio.get_running_loop()
        assert self.sync_interval_s is not None  # only interval mode sets timers
        if file.syncing is not None:  # one sync at a time: look again after this one
            file.sync_timer = loop.call_later(self.sync_interval_s, self._sync_soon, file)
        else:
            file.syncing = loop.create_task(self._sync(file), name="spool-sync")

    async def _sync(self, file: SpoolFile) -> None:
        """Sync ``file`` until nobody waits on it: each round covers every byte written
        before it started (group commit)."""
        try:
            while True:
                batch, file.waiters = file.waiters, []
                unsynced, file.unsynced_events = file.unsynced_events, 0
                target = file.size
                if file.fd is None or (not batch and target <= file.synced):
                    return
                try:
                    await asyncio.to_thread(_datasync, file.fd,
                                            None if file.dir_synced else self.directory)
                except OSError as exc:
                    self._sync_failed(file, exc, batch + file.waiters, unsynced)
                    file.waiters = []
                    return
                self.syncs += 1
                self.healthy = True
                file.synced, file.dir_synced = max(file.synced, target), True
                for done, _ in batch:
                    if not done.done():
                        done.set_result(None)
                if not file.waiters:
                    return
        finally:
            file.syncing = None

    def _sync_failed(self, file: SpoolFile, exc: OSError,
                     waiting: list[tuple[asyncio.Future[None], int]], unsynced: int) -> None:
        self.sync_failures += 1
        self.healthy = False
        file.sync_failed = True
        refused = sum(n for _, n in waiting)
        self.failed += refused
        for done, _ in waiting:
            if not done.done():
                done.set_exception(SpoolSyncFailed(f"spool fsync failed: {exc}"))
        if unsynced:
            # interval mode: these were acknowledged already. The kernel may have dropped
            # their pages; they survive a process crash, maybe not a host crash.
            self.unsafe_acknowledged += unsynced
        dropped = _SYNC_FAILURE_LINES.allow("sync")
        if dropped is not None or unsynced:
            logger.error("spool: fsync of {} failed ({}): {} event(s) not acknowledged (503){}; "
                         "the file is cut back to its last good sync and appends go to a new "
                         "file{}", file.name, exc, refused,
                         f", {unsynced} acknowledged event(s) may not survive a host crash"
                         if unsynced else "", dropped_note(dropped or 0))
        if self.files.active is file:
            self.files.active = None
            task = asyncio.get_running_loop().create_task(self._finish(file),
                                                          name="spool-finish")
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)

    # -- finalizing ------------------------------------------------------------------

    async def finalize(self) -> bool:
        """Close the active file: rename it to ``.buf`` (drainable), or delete it
        when it holds no events; retry stranded files. True when the active
        file became drainable."""
        done = await self.finalize_active()
        if self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)
        for path in list(self.files.stranded):
            if path not in self._closing_paths():
                await self._finalize_leftover(path)
        return done

    def _closing_paths(self) -> set[Path]:
        return {f.path for f in self.files.stranded.values() if f.fd is not None}

    async def finalize_active(self) -> bool:
        file = self.files.active
        if file is None:
            return False
        self.files.active = None
        return await self._finish(file)

    async def _finish(self, file: SpoolFile) -> bool:
        # Closed for appends, still listed (stranded until renamed), so that what the drain
        # registers meanwhile still holds the file's partitions.
        file.state = FileState.STRANDED
        self.files.stranded[file.path] = file
        if file.sync_timer is not None:
            file.sync_timer.cancel()
            file.sync_timer = None
        while file.syncing is not None:  # every push written to it is answered first
            await asyncio.shield(file.syncing)
        fd = file.fd
        assert fd is not None  # only an open file is finished
        keep = file.synced if file.sync_failed else None
        try:
            await asyncio.to_thread(_seal, fd, keep, file.size > file.synced)
        except OSError as exc:
            # interval mode: the last window's acknowledged pushes may not be on disk.
            self.sync_failures += 1
            self.unsafe_acknowledged += file.unsynced_events
            logger.error("spool: final fsync of {} failed ({}): {} acknowledged event(s) may "
                         "not survive a host crash", file.name, exc, file.unsynced_events)
        finally:
            file.fd = None
        if keep is not None and keep < file.size:
            self.files.bytes = max(0, self.files.bytes - (file.size - keep))
            file.size = keep
        outcome = await asyncio.to_thread(_rename_or_drop, file.path)
        return self._apply_finalize(file, outcome, leftover=False)

    async def finalize_leftovers(self) -> None:
        """Every ``.tmp`` but the active one (a crashed run's, or stranded)."""
        active = self.files.active.path if self.files.active is not None else None
        closing = self._closing_paths()
        for path in await asyncio.to_thread(list_files, self.directory):
            if path.suffix == ".tmp" and path != active and path not in closing:
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

    async def stop(self) -> None:
        """At stop: every pending sync answered, the active file finalized."""
        await self.finalize_active()
        if self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)


# -- blocking helpers (run in a thread) ----------------------------------------------

def _datasync(fd: int, directory: Path | None) -> None:
    os.fdatasync(fd)
    if directory is not None:  # a new file: its name must survive too
        fsync_dir(directory)


def _seal(fd: int, keep: int | None, sync: bool) -> None:
    """Close a file for good: cut it back to ``keep`` bytes (after a failed sync: the
    length the last good sync covered), and sync what is not synced yet."""
    try:
        if keep is not None:
            try:
                os.ftruncate(fd, keep)
            except OSError as exc:
                logger.error("spool: cannot cut a file back to its last good sync ({}); "
                             "pushes answered 503 may still be delivered", exc)
            with contextlib.suppress(OSError):  # best effort: the part kept is durable already
                os.fsync(fd)
        elif sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _cut(path: Path, size: int) -> None:
    """Start-up: cut a torn tail off, durably."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _is_empty(path: Path) -> bool:
    """No records: an empty file, or only (part of) the header."""
    size = path.stat().st_size
    if size == 0:
        return True
    if size > len(HEADER):
        return False
    return HEADER.startswith(path.read_bytes())


def _rename_or_drop(path: Path) -> str | OSError:
    """``.tmp`` -> ``.buf`` (and the directory fsynced): 'renamed'; a file without
    records is unlinked: 'deleted'; 'gone' when it vanished; the OSError when it
    cannot be renamed now."""
    try:
        if _is_empty(path):
            path.unlink()
            return "deleted"
        os.rename(path, path.with_suffix(".buf"))
    except FileNotFoundError:
        return "gone"
    except OSError as exc:
        return exc
    try:
        fsync_dir(path.parent)
    except OSError as exc:  # renamed; after a crash it is a leftover .tmp, finalized again
        logger.warning("spool: cannot fsync {} after renaming {}: {}", path.parent, path.name,
                       exc)
    return "renamed"
