"""The drain's work on one finished file: upload it into PostgreSQL's staging
table, then delete it (docs/behaviour.md §5.5, docs/spool-drain.md).

``Uploader.drain_file`` reads the file once (the parsed records are kept while
the file is retried), sets aside events that could never be stored (without a
round trip) and unparseable records, then calls ``upload`` (the service's one
transaction: ledger row, COPY, counters, this spool's registration). When
PostgreSQL refuses events, ``upload`` names them by raising :class:`RejectedEvents`:
they are set aside and the rest is uploaded. A file is deleted only after its upload committed
with each of its events uploaded or in the quarantine; PostgreSQL's ledger
makes a repeated upload (a crash before the delete) a no-op.

Outcomes: ``ok`` | ``transient`` (the file stays, the cycle stops) | ``permanent``
(the file stays, retried next cycle) | ``quarantined`` (unreadable too often:
moved to ``failed/`` whole) | ``gone``. Only one upload runs at a time (the
actor's drain lock); the drain never touches ``.tmp`` files.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from loguru import logger

from actors.spool.files import FileState, SpoolFile, SpoolFiles
from actors.spool.health import DrainHealth
from actors.spool.order import Registration
from actors.spool.quarantine import QuarantineDesk
from actors.spool.records import Pair, file_accept_us, read_records
from broker.core.validate import event_problem

__all__ = ["DrainedLine", "RejectedEvents", "Upload", "Uploader"]

# (file name, its events, the indexes to upload, this spool's rows after it) -> False when
# PostgreSQL's ledger lists the file already (uploaded before: nothing staged twice).
# Raises RejectedEvents for events that can never be staged.
Upload = Callable[[str, list[dict], list[int], dict[Pair, int]], Awaitable[bool]]


class RejectedEvents(Exception):
    """Raised by ``upload``: events of a spool file PostgreSQL refuses for good
    (``{index: reason}``); nothing of the file was uploaded. The uploader sets them aside
    and uploads the rest."""

    def __init__(self, rejected: dict[int, str]):
        super().__init__(f"{len(rejected)} event(s) rejected")
        self.rejected = rejected


class DrainedLine:
    """Once the spool is empty again: one line saying what became of what it held, and how
    long after the first of it was spooled.

    That time is the oldest pending event's accept time (``acceptedAt``, the wall clock in
    µs, or its file's name for older records), read from the spool itself, so it holds
    across a restart: a backlog spooled before the broker stopped and drained after the next
    start is timed from when it was spooled, not from when this process first saw it."""

    def __init__(self) -> None:
        # (first accept time in µs, uploaded events, quarantined events) as the spool last
        # became non-empty
        self._started: tuple[int, int, int] | None = None

    def maybe_started(self, pending: int, uploaded: int, quarantined: int,
                      oldest_us: Callable[[], int | None]) -> None:
        """``oldest_us``: the accept time of the oldest event still pending (None when the
        spool cannot tell), asked only when a backlog starts."""
        if pending > 0 and self._started is None:
            first = oldest_us()
            self._started = (first if first else time.time_ns() // 1000, uploaded, quarantined)

    def maybe_done(self, pending: int, uploaded: int, quarantined: int) -> None:
        if pending > 0 or self._started is None:
            return
        since_us, uploaded_then, quarantined_then = self._started
        self._started = None
        took = max(0.0, (time.time_ns() // 1000 - since_us) / 1e6)
        logger.info("spool: drained: {} event(s) stored, {} quarantined, {:.1f} s after the "
                    "first was spooled", uploaded - uploaded_then,
                    max(0, quarantined - quarantined_then), took)


class Uploader:
    def __init__(self, files: SpoolFiles, quarantine: QuarantineDesk, registration: Registration,
                 health: DrainHealth, *, upload: Upload,
                 is_transient: Callable[[BaseException], bool],
                 accept_floor: Callable[[], int], failed_dir: Path, quarantine_after: int,
                 on_uploaded: Callable[[int], None] | None = None) -> None:
        self.files = files
        self.quarantine = quarantine
        self.registration = registration
        self.health = health
        self._upload = upload
        self._is_transient = is_transient
        self._accept_floor = accept_floor
        self._on_uploaded = on_uploaded
        self.failed_dir = failed_dir
        self.quarantine_after = max(1, quarantine_after)
        self.replayed_events = 0  # events uploaded
        self.quarantined_files = 0  # unreadable files moved to failed/
        self.damaged_records = 0  # records that failed their checksum (quarantined)
        self.drained = DrainedLine()
        # The file being drained: (name, (size, mtime, inode) when read, its events)
        self._parsed: tuple[str, tuple, list[dict]] | None = None

    async def drain_file(self, path: Path) -> tuple[str, int]:
        """Upload one finished file, then delete it. Returns (outcome, events uploaded now)."""
        file = self.files.lookup(path)
        file.state = FileState.UPLOADING
        try:
            return await self._drain(file)
        finally:
            if file.state is FileState.UPLOADING:
                file.state = FileState.FINISHED

    async def _drain(self, file: SpoolFile) -> tuple[str, int]:
        name, path = file.name, file.path
        try:
            stat = await asyncio.to_thread(_stat_key, path)
        except FileNotFoundError:
            self._forget(name)
            return "gone", 0
        except OSError as exc:
            logger.error("spool: cannot read {}: {}", name, exc)
            return self._unreadable(file, exc), 0
        parsed = self._parsed
        if parsed is not None and parsed[0] == name and parsed[1] == stat:
            events = parsed[2]  # a finished file never changes: parse it once
        else:
            failed, events = await self._load(file, stat)
            if failed is not None:
                return failed, 0
        for k, event in enumerate(events):  # never storable: set aside without a round trip
            problem = None if k in file.settled else event_problem(event)
            if problem is not None:
                if not await self._set_aside(file, events, k, "invalid", problem):
                    return "permanent", 0
        while True:
            todo = [k for k in range(len(events)) if k not in file.settled]
            oldest = self.files.oldest_map(skip=file)
            # Until the next registration sync, this spool also holds the file's
            # partitions from a bound below any accept time still to come: a push
            # appended to the active file during the upload is not in ``oldest``.
            floor = self._accept_floor()
            for pair in file.firsts:
                oldest[pair] = min(oldest.get(pair, floor), floor)
            try:
                uploaded = await self._upload(name, events, todo, oldest)
            except asyncio.CancelledError:
                raise
            except RejectedEvents as exc:
                if not exc.rejected:
                    logger.error("spool: upload of {} failed: {}", name, _describe(exc))
                    return "permanent", 0
                for k, reason in sorted(exc.rejected.items()):
                    if not await self._set_aside(file, events, k, "rejected", reason):
                        return "permanent", 0
                continue  # the rest of the file
            except Exception as exc:
                if self._transient(exc):
                    file.unreadable = 0
                    self.health.upload_failed(name, exc)
                    return "transient", 0
                logger.error("spool: upload of {} failed: {}", name, _describe(exc))
                return "permanent", 0
            break
        uploaded_now = len(todo) if uploaded else 0
        self.replayed_events += uploaded_now
        self.files.settle(file, events, todo)
        self.registration.uploaded(oldest)
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            pass
        except OSError as exc:  # uploaded; a second upload is skipped (the ledger)
            logger.error("spool: cannot delete uploaded {}: {}", name, exc)
            return "permanent", uploaded_now
        self._forget(name)
        self.health.uploaded()
        if self._on_uploaded is not None and uploaded_now:
            self._on_uploaded(uploaded_now)
        return "ok", uploaded_now

    async def _load(self, file: SpoolFile, stat: tuple) -> tuple[str | None, list[dict]]:
        """Read and prepare a file for the drain: ``(None, events)``, or
        ``(outcome, [])`` when it cannot be drained now."""
        name = file.name
        try:
            scan = await asyncio.to_thread(read_records, file.path)
        except FileNotFoundError:
            self._forget(name)
            return "gone", []
        except OSError as exc:
            logger.error("spool: cannot read {}: {}", name, exc)
            return self._unreadable(file, exc), []
        events, bad = scan.events, scan.bad
        if not file.counted:  # appeared behind our back (copied in, restored)
            file.fill(events, len(bad), stat[0])
            self.files.count_in(file)
        if scan.torn:
            logger.warning("spool: {}: torn last record ignored ({} byte(s); it was never "
                           "acknowledged)", name, scan.torn)
        if bad and not file.raw_quarantined:
            try:
                await self.quarantine.set_aside_raw(name, bad)
            except OSError as exc:
                logger.error("spool: cannot quarantine damaged records of {}: {}", name, exc)
                return "permanent", []
            file.raw_quarantined = True
            self.damaged_records += sum(1 for *_, why in bad if why == "corrupt")
        default = file_accept_us(name)
        for event in events:  # written before accept times were recorded: the file's time
            if isinstance(event, dict) and not isinstance(event.get("acceptedAt"), int):
                event["acceptedAt"] = default
        self._parsed = (name, stat, events)
        return None, events

    async def _set_aside(self, file: SpoolFile, events: list[dict], index: int, reason: str,
                         error: str) -> bool:
        """Quarantine one event and settle it; False when the quarantine cannot be written."""
        if not await self.quarantine.set_aside(file.name, index, events[index], reason, error):
            return False
        self.files.settle(file, events, [index])
        return True

    def _transient(self, exc: BaseException) -> bool:
        try:
            return bool(self._is_transient(exc))
        except Exception:  # a broken classifier must never get an event quarantined
            logger.exception("spool: is_transient failed; treating the error as transient")
            return True

    def _unreadable(self, file: SpoolFile, exc: BaseException) -> str:
        """A file that cannot be read: retried, then moved to ``failed/`` whole
        (its events cannot be told apart, so none can be set aside alone)."""
        name = file.name
        self.health.transient_streak = 0
        file.unreadable += 1
        n = file.unreadable
        if n < self.quarantine_after:
            logger.warning("spool: {} unreadable ({}/{}): {}", name, n, self.quarantine_after, exc)
            return "permanent"
        try:
            os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)
            os.rename(file.path, self.failed_dir / name)
        except OSError as err:
            logger.error("spool: cannot move unreadable {} aside: {}", name, err)
            return "permanent"
        logger.error("spool: {} unreadable {} times in a row ({}); moved to {}", name, n, exc,
                     self.failed_dir)
        self.quarantined_files += 1
        self._forget(name)
        return "quarantined"

    def _forget(self, name: str) -> None:
        """The file left the main directory: no longer pending."""
        self.files.forget(name)
        self.drained.maybe_done(self.files.pending, self.replayed_events, self.quarantine.count)
        if self._parsed is not None and self._parsed[0] == name:
            self._parsed = None


def _describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return text if len(text) < 2000 else text[:2000] + "..."


def _stat_key(path: Path) -> tuple[Any, ...]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino
