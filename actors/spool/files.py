"""What the spool knows about each of its files, and the totals over them.

A :class:`SpoolFile` is one ``queen-<ms>-<seq>`` file from the moment it is
opened (or found on disk) until it leaves the directory (uploaded, vanished, or
moved to ``failed/``). :class:`SpoolFiles` keeps every known file and the two
totals the cap and the health figures read (events pending, bytes), and is the
only code that moves counts in and out of the :class:`SpoolBacklog`.

States (the file's suffix in brackets)::

    ACTIVE [.tmp] --finalize--> FINISHED [.buf] --drain--> UPLOADING --committed--> (gone)
       |  (rename failed)          ^                          |  (transient / retry)
       +-> STRANDED [.tmp] --------+                          +--> FINISHED
                                   found at start, or copied in behind our back: FINISHED
"""
from __future__ import annotations

import asyncio
import enum
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from actors.spool.backlog import SpoolBacklog
from actors.spool.records import NAME, Pair, accepted_at, event_pair, file_accept_us, tally_records

__all__ = ["FileState", "SpoolFile", "SpoolFiles", "file_size", "fsync_dir", "make_dir", "list_buf_files", "list_files"]


class FileState(enum.Enum):
    ACTIVE = "active"  # .tmp, open, appended to by the actor
    STRANDED = "stranded"  # .tmp, closed, its rename failed: retried at every finalize
    FINISHED = "finished"  # .buf, waiting for the drain
    UPLOADING = "uploading"  # .buf, the drain is on it


@dataclass(eq=False)
class SpoolFile:
    """One spool file. ``counted``: its events, bytes and partitions are in the
    totals and the backlog (a ``.buf`` that appeared behind the spool's back is
    known by name, for its unreadable count, before it is read and counted)."""

    path: Path
    state: FileState
    events: int = 0  # records counted as pending: parse failures too, a torn tail not
    size: int = 0  # bytes counted against the cap
    # (queue, partition) -> events still counted in the backlog (settled ones are taken off)
    pairs: Counter = field(default_factory=Counter)
    # (queue, partition) -> accept time of its first event here: where the file's accept
    # range starts for that partition, registered in queen.spool_backlog
    firsts: dict[Pair, int] = field(default_factory=dict)
    counted: bool = False
    settled: set[int] = field(default_factory=set)  # record indexes committed or set aside
    raw_quarantined: bool = False  # its unparseable records are in the quarantine
    unreadable: int = 0  # consecutive attempts that could not read it
    fd: int | None = None  # open (ACTIVE, or closing): the descriptor appends go to
    # Durability of an open file (actors/spool/writer.py): bytes the last good sync
    # covered, whether its directory entry was synced, the pushes waiting for the next
    # sync (their futures and event counts), the sync running now, interval mode's timer
    # and acknowledged-but-unsynced events, and whether a sync failed (the file is then
    # never trusted past ``synced``).
    synced: int = 0
    dir_synced: bool = False
    waiters: list[tuple[asyncio.Future[None], int]] = field(default_factory=list)
    syncing: asyncio.Task[None] | None = None
    sync_timer: asyncio.TimerHandle | None = None
    unsynced_events: int = 0
    sync_failed: bool = False

    @property
    def name(self) -> str:
        return self.path.name

    def read_counts(self) -> None:
        """Counts read from the file on disk (blocking): complete records only."""
        self.events, self.pairs, self.firsts = tally_records(self.path)
        self.size = file_size(self.path)

    def fill(self, events: list[dict], skipped: int, size: int) -> None:
        """Counts from records just read (as :meth:`read_counts` finds them)."""
        default = file_accept_us(self.name)
        firsts: dict[Pair, int] = {}
        for e in events:
            firsts.setdefault(event_pair(e), accepted_at(e, default))
        self.events, self.size = len(events) + skipped, size
        self.pairs, self.firsts = Counter(event_pair(e) for e in events), firsts

    def __repr__(self) -> str:
        return f"<SpoolFile {self.name} {self.state.value} events={self.events} size={self.size}>"


class SpoolFiles:
    """Every known spool file of one directory, and the totals over the counted ones."""

    def __init__(self, backlog: SpoolBacklog) -> None:
        self.backlog = backlog
        self.active: SpoolFile | None = None
        self.stranded: dict[Path, SpoolFile] = {}
        self.finished: dict[str, SpoolFile] = {}  # by .buf name
        self.pending = 0  # events not uploaded yet
        self.bytes = 0  # .buf files plus the active file

    def count_in(self, file: SpoolFile) -> None:
        if file.counted:
            return
        file.counted = True
        self.pending += file.events
        self.bytes += file.size
        self.backlog.add_counts(file.pairs)

    def appended(self, file: SpoolFile, events: int, size: int, pairs: Counter,
                 accept: int) -> None:
        """One push written to the active file (its size moved on already)."""
        file.events += events
        self.pending += events
        self.bytes += size
        file.pairs.update(pairs)
        for pair in pairs:
            file.firsts.setdefault(pair, accept)
        self.backlog.add_counts(pairs)

    def release(self, file: SpoolFile) -> None:
        """A counted file's events will never be uploaded (it vanished, was
        empty, or left the directory): out of the totals and the backlog."""
        if not file.counted:
            return
        file.counted = False
        self.pending = max(0, self.pending - file.events)
        self.bytes = max(0, self.bytes - file.size)
        self.backlog.remove_counts(file.pairs)

    def count_found(self, path: Path) -> None:
        """A ``.buf`` this run did not write: count its events and bytes once (blocking)."""
        file = self.lookup(path)
        if not file.counted:
            file.read_counts()
            self.count_in(file)

    def lookup(self, path: Path) -> SpoolFile:
        """The record of a ``.buf`` file, made (not counted) when it is new."""
        file = self.finished.get(path.name)
        if file is None:
            file = self.finished[path.name] = SpoolFile(path, FileState.FINISHED)
        return file

    def finished_file(self, file: SpoolFile) -> None:
        """A ``.tmp`` became ``.buf``."""
        self.stranded.pop(file.path, None)
        file.path, file.state, file.fd = file.path.with_suffix(".buf"), FileState.FINISHED, None
        self.finished[file.name] = file

    def forget(self, name: str) -> None:
        """The ``.buf`` left the main directory: it is no longer pending."""
        file = self.finished.pop(name, None)
        if file is not None:
            self.release(file)

    def settle(self, file: SpoolFile, events: list[dict], indexes: list[int]) -> None:
        """The events at ``indexes`` are settled (committed or set aside): take
        them off the backlog. Events settled before (a batch replayed twice)
        subtract nothing, nor do events the file never counted (a file that
        reappeared after its upload, a push whose failed write could not be
        cut off)."""
        fresh = [k for k in indexes if k not in file.settled]
        file.settled.update(fresh)
        left = file.pairs
        if not left or not fresh:
            return
        gone: dict[Pair, int] = {}
        for pair, n in Counter(event_pair(events[k]) for k in fresh
                               if isinstance(events[k], Mapping)).items():
            have = left.get(pair, 0)
            k = min(have, n)
            if k <= 0:
                continue
            gone[pair] = k
            if have > k:
                left[pair] = have - k
            else:
                del left[pair]
        self.backlog.remove_counts(gone)

    def oldest_map(self, skip: SpoolFile | None = None) -> dict[Pair, int]:
        """Per pending (queue, partition): the accept time of its oldest event
        not uploaded yet (files oldest first, then the active file), leaving
        out file ``skip`` (the one being uploaded)."""
        out: dict[Pair, int] = {}
        for name in sorted(self.finished):
            file = self.finished[name]
            if file is not skip:
                for pair, accept in file.firsts.items():
                    out.setdefault(pair, accept)
        for file in self.stranded.values():
            for pair, accept in file.firsts.items():
                out.setdefault(pair, accept)
        if self.active is not None:
            for pair, accept in self.active.firsts.items():
                out.setdefault(pair, accept)
        return out

    def pending_files(self) -> int:
        """Counted ``.buf`` files, plus the active file when it holds events."""
        active = self.active is not None and self.active.events > 0
        return sum(1 for f in self.finished.values() if f.counted) + (1 if active else 0)


# -- the directory (blocking) -------------------------------------------------------

def list_files(directory: Path) -> list[Path]:
    """Every spool file (``.tmp`` and ``.buf``) of the directory, in creation order."""
    try:
        with os.scandir(directory) as it:
            return sorted(Path(e.path) for e in it if NAME.match(e.name) and e.is_file())
    except OSError:
        return []


def list_buf_files(directory: Path) -> list[Path]:
    return [p for p in list_files(directory) if p.suffix == ".buf"]


def dir_usage(directory: Path) -> tuple[int, int]:
    """(files, bytes) of a directory (blocking)."""
    count = total = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.is_file():
                    count += 1
                    total += entry.stat().st_size
    except OSError:
        pass
    return count, total


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (files created, renamed, removed) durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(directory: Path) -> None:
    """``mkdir -p``, durably: each directory made has its parent fsynced, so it is still
    there after a host crash (a spool whose directory vanished would take its files along)."""
    directory = Path(directory)
    if directory.is_dir():
        return
    make_dir(directory.parent)
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        if not directory.is_dir():
            raise
        return
    fsync_dir(directory.parent)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
