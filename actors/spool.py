"""The node-local disk spool (docs/behaviour.md §5, §14 invariants 39-45).

Pushes are appended here, instead of going to PostgreSQL, while push
maintenance is on or the database cannot be reached; a drain task uploads them
into PostgreSQL's staging table once the database takes writes again, a whole
file per transaction, and :mod:`actors.staging_merger` moves them on into the
queues in the cluster's accept order (docs/spool-drain.md).

Files live in one node-local directory::

    queen-<13-digit epoch ms>-<8-digit sequence>.tmp   the active file (appended to)
    queen-<13-digit epoch ms>-<8-digit sequence>.buf   finalized, waiting to be drained
    quarantine/<id>.json                               one event PostgreSQL refused (or never could store)
    failed/<name>.buf                                  a whole file that could not be read

Names sort in creation order, also across restarts: a new name is always
greater than every name already in the directory. A file holds repeated
``[u32 little-endian body length][UTF-8 JSON event]`` records, written with
O_APPEND and no fsync per push (a finalized file is fsynced once).

Who touches what:

* The actor (its inbox) owns the active ``.tmp`` file: ``append``,
  ``finalize``, ``pause``/``resume``, ``stats``. Appends are plain, short
  ``os.write`` calls and are never queued behind an upload.
* The drain task owns the ``.buf`` files: it asks the actor (through the
  inbox) to finalize the active file, then uploads finalized files oldest
  first outside the actor, so a slow database never blocks appends. It never
  looks at ``.tmp`` files. ``recover()`` and the drain share a lock, so two
  uploads never run at once.

A file is only deleted after its upload committed (PostgreSQL records the
file in the same transaction, so an upload repeated after a crash is skipped)
with each of its events either uploaded or set aside in the quarantine
(:mod:`actors.spool_quarantine`): events that could never be stored are set
aside before the upload, and when PostgreSQL refuses a file, the events it
refuses are found (halves under savepoints) and set aside, and the rest is
uploaded, so one bad event never costs its neighbours. A file that cannot even be read moves to
``failed/`` after ``quarantine_after`` attempts. The spool holds at most
``max_bytes`` of files: an append beyond it raises :class:`SpoolFull`.

Blocking file work (fsync, renames, directory listings, the quarantine) runs
in a thread, never on the event loop; single short appends stay on it.

Sticky failover: ``Spool.backlog`` (a :class:`SpoolBacklog`, also handed out
by ``backlog_ref()``) counts, per (queue, partition), the events spooled but
not yet uploaded. While a partition has any, the push service
(broker/service/push.py) sends its new pushes to the spool as well, so they
are staged after the older ones and the partition keeps the order its pushes
were acknowledged in. The counts only drop once a file's upload committed (or
when a file is quarantined: its events leave the order chain).
"""
from __future__ import annotations

import asyncio
import os
import re
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import ujson
from loguru import logger

from actors.runtime import AsyncioActor
from actors.spool_quarantine import Quarantine, entry_id, import_failed_files
from broker.core.logs import Throttle, dropped_note
from broker.core.validate import event_problem

__all__ = ["Spool", "SpoolBacklog", "SpoolError", "SpoolFull", "accepted_at",
           "read_records", "spool_file_key"]

_LEN = struct.Struct("<I")
_NAME = re.compile(r"^queen-(\d{13})-(\d{8})\.(tmp|buf)$")
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
RECOVER_LIMIT_S = 3600.0

# Indirections so tests can inject disk-full errors without patching os itself.
_os_write = os.write
_os_ftruncate = os.ftruncate


class SpoolError(Exception):
    """A push could not be written to the spool (disk full, unwritable directory...).

    Nothing of that push stays in the spool: the caller reports every item failed.
    """


class SpoolFull(SpoolError):
    """The push would take the spool past its byte cap; nothing was written."""


# -- file format ---------------------------------------------------------------

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


def event_pair(event: Mapping[str, Any]) -> tuple[str, str]:
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
    firsts: dict[tuple[str, str], int] = {}
    default = file_accept_us(Path(path).name)
    for e in events:
        firsts.setdefault(event_pair(e), accepted_at(e, default))
    return len(events) + skipped, Counter(event_pair(e) for e in events), firsts


def spool_file_key(name: str) -> tuple[int, int]:
    """``(file_ms, file_seq)`` of a spool file name ``queen-<ms>-<seq>.buf``."""
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"not a spool file name: {name}")
    return int(m[1]), int(m[2])


def file_accept_us(name: str) -> int:
    """The creation time of a spool file (from its name), in microseconds:
    the accept time of events written before accept times were recorded."""
    m = _NAME.match(name)
    return int(m[1]) * 1000 if m else 0


def accepted_at(event: Mapping[str, Any], default: int = 0) -> int:
    """When this broker accepted a spooled push (its clock, microseconds)."""
    value = event.get("acceptedAt")
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# -- the backlog -----------------------------------------------------------------

class SpoolBacklog:
    """Spooled-but-not-replayed events per (queue, partition).

    A plain object read synchronously by the push route (one event loop, so no
    locks): ``holds(pairs)`` says whether a push to any of those partitions
    must queue behind the spool. Only the spool changes the counts.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def holds(self, pairs: Iterable[tuple[str, str]]) -> bool:
        """True if any (queue, partition) of ``pairs`` has events waiting."""
        counts = self._counts
        if not counts:
            return False
        return any((queue, partition or "Default") in counts for queue, partition in pairs)

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        self.add_counts(Counter(event_pair(e) for e in events))

    def remove(self, events: Iterable[Mapping[str, Any]]) -> None:
        self.remove_counts(Counter(event_pair(e) for e in events))

    def add_counts(self, counts: Mapping[tuple[str, str], int]) -> None:
        for pair, n in counts.items():
            if n > 0:
                self._counts[pair] = self._counts.get(pair, 0) + n

    def remove_counts(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Never below zero; a pair reaching zero is dropped."""
        for pair, n in counts.items():
            have = self._counts.get(pair)
            if have is None or n <= 0:
                continue
            if have > n:
                self._counts[pair] = have - n
            else:
                del self._counts[pair]

    def count(self, queue: str, partition: str | None = "Default") -> int:
        return self._counts.get((queue, partition or "Default"), 0)

    def total(self) -> int:
        return sum(self._counts.values())

    def partitions(self) -> int:
        """How many (queue, partition) pairs are held."""
        return len(self._counts)

    def clear(self) -> None:
        self._counts.clear()

    def __repr__(self) -> str:
        return f"<SpoolBacklog partitions={len(self._counts)} events={self.total()}>"


# -- the actor -------------------------------------------------------------------

class Spool(AsyncioActor):
    """The disk spool of one broker process; see the module docstring."""

    def __init__(self, directory: Path | str, *,
                 upload: Callable[[str, list[dict], list[int], dict[tuple[str, str], int]],
                                  Awaitable[bool]],
                 replay: Callable[[list[dict]], Awaitable[Any]],
                 register: Callable[[Mapping[tuple[str, str], int] | None], Awaitable[None]]
                 | None = None,
                 events_per_file: int = 10000, flush_ms: int = 100,
                 max_bytes: int = 1 << 30,
                 is_transient: Callable[[BaseException], bool],
                 start_paused: bool = False, clock: Callable[[], float] = time.time,
                 files_per_cycle: int = 10, quarantine_after: int = 5,
                 cooldown_after: int = 10, cooldown_s: float = 5.0,
                 recover_limit_s: float = RECOVER_LIMIT_S,
                 on_uploaded: Callable[[int], None] | None = None,
                 owner: str = "queen"):
        super().__init__()
        self.directory = Path(directory)
        self.failed_dir = self.directory / "failed"
        self.quarantine = Quarantine(self.directory / "quarantine")
        self._upload = upload
        self._replay = replay  # the quarantine's replay: a direct push
        self._on_uploaded = on_uploaded
        self._register = register
        self._is_transient = is_transient
        self._events_per_file = max(1, int(events_per_file))
        self._flush_s = max(0.001, flush_ms / 1000)
        self._max_bytes = max(1, int(max_bytes))
        self._clock = clock
        self._files_per_cycle = max(1, files_per_cycle)
        self._quarantine_after = max(1, quarantine_after)
        self._cooldown_after = max(1, cooldown_after)
        self._cooldown_s = cooldown_s
        self._recover_limit_s = recover_limit_s
        self._owner = owner
        self.spool_id = owner  # read from (or written to) the directory at start

        # the active file (only touched by the actor's own handlers)
        self._fd: int | None = None
        self._active: Path | None = None
        self._active_events = 0
        self._active_size = 0
        self._active_pairs: Counter = Counter()  # (queue, partition) -> events in the active file
        self._last_name = (0, -1)  # (ms, sequence) of the newest name handed out
        self._active_first: dict[tuple[str, str], int] = {}  # pair -> first accept time in it
        # .tmp files that could not be renamed yet -> (events, pairs, bytes, firsts) already counted
        self._stranded: dict[Path, tuple[int, Counter, int, dict]] = {}

        self._rollback_failed = False  # a failed write could not be cut off the active file

        # the drain
        self._paused = start_paused
        self._db_healthy = True
        self._transient_streak = 0
        self._cooldown_until = 0.0
        self._permanent: dict[str, int] = {}  # .buf name -> consecutive unreadable attempts
        self._progress: dict[str, int] = {}  # .buf name -> events replayed or quarantined
        self._file_events: dict[str, int] = {}  # .buf name -> events counted as pending
        self._file_bytes: dict[str, int] = {}  # .buf name -> its size, counted against the cap
        # .buf name -> (queue, partition) -> events counted in the backlog, not replayed yet
        self._file_pairs: dict[str, Counter] = {}
        self._done: dict[str, set[int]] = {}  # .buf name -> indexes settled (committed or set aside)
        self._raw_quarantined: set[str] = set()  # .buf names whose unparseable records are set aside
        self._file_first: dict[str, dict[tuple[str, str], int]] = {}  # .buf name -> pair -> first accept
        self._draining: tuple[str, list[dict]] | None = None  # the file being replayed, its events
        self._draining_stat: tuple = ()  # (size, mtime) it had when read

        # the cluster-wide order (queen.spool_backlog)
        self._last_accept = 0  # accept times only rise, also when the wall clock steps back
        self._accept_seq = 0
        self._registered: dict[tuple[str, str], int] = {}  # what PostgreSQL lists for us
        self._register_dirty = False  # PostgreSQL may list more than we think (a held push)
        self._registration_ok = False  # the last registration reached PostgreSQL
        self._next_sync = 0.0  # loop time of the next registration sync while draining
        if register is not None:
            self._register_dirty = True  # a crash may have left rows of ours behind
        self.backlog = SpoolBacklog()
        self._drain_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._self: Any = None

        # counters
        self._pending = 0
        # (when, replayed_events, quarantined_events) as the spool last became non-empty
        self._backlog_started: tuple[float, int, int] | None = None
        self._failed = 0
        self._healthy = True
        self._bytes = 0  # .buf files plus the active file
        self.replayed_events = 0
        self.quarantined_files = 0  # unreadable files moved to failed/
        self.quarantined_events = 0  # entries in quarantine/ now
        self.rejected_full = 0  # events refused because the spool was at its cap

    # -- lifecycle ---------------------------------------------------------------

    def on_start(self) -> None:
        # Start-up only, before HTTP is served: scanning here keeps the counts
        # exact from the first request.
        try:
            self._make_dirs()
        except OSError as exc:
            self._healthy = False
            logger.error("spool: cannot create {}: {}", self.directory, exc)
        else:
            self._scan_existing()
            self.spool_id = self._read_spool_id()
        self._self = self.actor_ref.proxy()
        self._task = asyncio.get_running_loop().create_task(self._drain_loop(), name="spool-drain")
        logger.info("spool: {} ({} event(s) pending in {} partition(s), cap {} MB{})",
                    self.directory, self._pending, self.backlog.partitions(),
                    round(self._max_bytes / (1 << 20)), ", paused" if self._paused else "")

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._finalize_active()
        await self._last_registration()

    async def _last_registration(self) -> None:
        """At a clean stop, leave PostgreSQL exactly what is still on disk: an
        upload's floor rows (see _drain_file) would otherwise hold their
        partitions until this spool is taken for dead (FILE_BUFFER_ORDER_WAIT_MS)."""
        if self._register is None or not self._registered:
            return
        want = self._oldest_map()
        if want == self._registered:
            return
        try:
            await asyncio.wait_for(self._register(want), STOP_REGISTRATION_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database is away: the rows age out
            logger.info("spool: could not update the spool backlog at stop ({})", exc)

    def _read_spool_id(self) -> str:
        """This spool's name in queen.spool_backlog, kept in the directory: the
        rows describe these files, so a broker restarted on them (whatever its
        server id now) takes its old rows over instead of waiting for them."""
        path = self.directory / "spool-id"
        try:
            value = path.read_text().strip()
            if value:
                return value
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.error("spool: cannot read {}: {}", path, exc)
            return self._owner
        value = f"{self._owner}-{os.urandom(4).hex()}"
        try:
            tmp = path.with_suffix(".part")
            tmp.write_text(value + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            logger.error("spool: cannot write {}: {}", path, exc)
        return value

    def identity(self) -> str:
        return self.spool_id

    def _make_dirs(self) -> None:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)

    def _scan_existing(self) -> None:
        """Count what a previous run left and make new names sort after it;
        leftover ``.tmp`` files are finalized (nothing is deleted unreplayed)."""
        for path in self._listdir():
            m = _NAME.match(path.name)
            assert m is not None  # _listdir() lists only the names _NAME matches
            self._last_name = max(self._last_name, (int(m[1]), int(m[2])))
        for path in self._listdir():
            if path.suffix == ".tmp" and path != self._active:
                counts = self._count_leftover(path, self._leftover_counts_io(path))
                self._apply_finalize(path, _rename_or_drop(path), *counts[:3], firsts=counts[3])
        for path in self._buf_files():
            self._count_found(path)
        self.quarantined_events = len(self.quarantine.ids())

    def _count_found(self, path: Path) -> None:
        """A ``.buf`` this run did not write: count its events and bytes once."""
        if path.name in self._file_events:
            return
        n, pairs, firsts = tally_records(path)
        self._file_first[path.name] = firsts
        self._file_events[path.name] = n
        self._file_pairs[path.name] = pairs
        self._file_bytes[path.name] = _size(path)
        self._bytes += self._file_bytes[path.name]
        self._pending += n
        self.backlog.add_counts(pairs)

    def _listdir(self) -> list[Path]:
        try:
            with os.scandir(self.directory) as it:
                return sorted(Path(e.path) for e in it if _NAME.match(e.name) and e.is_file())
        except OSError:
            return []

    def _buf_files(self) -> list[Path]:
        return [p for p in self._listdir() if p.suffix == ".buf"]

    async def _finalize_leftovers(self) -> None:
        for path in await asyncio.to_thread(self._listdir):
            if path.suffix == ".tmp" and path != self._active:
                await self._finalize_path(path, None)

    # -- writing (actor messages) ------------------------------------------------

    async def append(self, events: list[dict], registered: bool = False) -> None:
        """Write every event of one push, or none of them (raises SpoolError,
        SpoolFull when the cap would be passed). Each event gets this broker's
        accept time (``acceptedAt``, microseconds, never decreasing) and a
        sequence number (``acceptSeq``). ``registered``: PostgreSQL already
        lists this broker as holding these partitions (a held push)."""
        if not events:
            return
        if registered:
            self._register_dirty = True  # even if the write fails: PostgreSQL lists us now
        accept = self._next_accept()
        for event in events:
            self._accept_seq += 1
            event["acceptedAt"], event["acceptSeq"] = accept, self._accept_seq
        data = encode_records(events)
        if self._bytes + len(data) > self._max_bytes:
            self.rejected_full += len(events)
            raise SpoolFull(f"spool full: {self._bytes} of {self._max_bytes} bytes in use "
                            f"(FILE_BUFFER_MAX_BYTES); the push was not accepted")
        try:
            self._write(data)
        except OSError as exc:
            self._failed += len(events)
            self._healthy = False
            if self._rollback_failed:
                await self._finalize_active()
            raise SpoolError(f"spool write failed: {exc}") from exc
        self._healthy = True
        self._active_events += len(events)
        self._pending += len(events)
        self._bytes += len(data)
        pairs = Counter(event_pair(e) for e in events)
        self._active_pairs.update(pairs)
        for pair in pairs:
            self._active_first.setdefault(pair, accept)
        self.backlog.add_counts(pairs)
        if self._active_events >= self._events_per_file:
            await self._finalize_active()

    def _next_accept(self) -> int:
        self._last_accept = max(self._last_accept + 1, time.time_ns() // 1000)
        return self._last_accept

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            self._open_new()
        fd, before = self._fd, self._active_size
        assert fd is not None  # _open_new() opened it
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += _os_write(fd, view[done:])
        except OSError:
            self._rollback(before)
            raise
        self._active_size += done

    def _rollback(self, size: int) -> None:
        """Cut a half-written push off the active file again."""
        self._rollback_failed = False
        assert self._fd is not None  # only _write() rolls back, with the active file open
        try:
            _os_ftruncate(self._fd, size)
        except OSError as exc:
            # Cannot guarantee the file is clean: stop using it. Its records stay
            # readable; at worst the partial push is replayed without an ack.
            logger.error("spool: could not truncate {} after a failed write: {}", self._active, exc)
            self._active_size = os.fstat(self._fd).st_size if self._fd is not None else size
            self._rollback_failed = True

    def _open_new(self) -> None:
        ms = max(int(self._clock() * 1000), self._last_name[0])
        seq = self._last_name[1] + 1 if ms == self._last_name[0] else 0
        path = self.directory / f"queen-{ms:013d}-{seq:08d}.tmp"
        try:
            fd = os.open(path, _OPEN_FLAGS, 0o644)
        except FileNotFoundError:  # the directory went away: make it again, once
            self._make_dirs()
            fd = os.open(path, _OPEN_FLAGS, 0o644)
        self._last_name = (ms, seq)
        self._fd, self._active, self._active_events, self._active_size = fd, path, 0, 0
        self._active_pairs, self._active_first = Counter(), {}

    async def finalize(self) -> bool:
        """Close the active file: rename it to ``.buf`` (drainable), or delete it
        when it holds no events. True when a file became drainable."""
        done = await self._finalize_active()
        for path in list(self._stranded):
            await self._finalize_path(path, None)
        return done

    async def _finalize_active(self) -> bool:
        if self._fd is None:
            return False
        fd, path, events, pairs = self._fd, self._active, self._active_events, self._active_pairs
        size, firsts = self._active_size, self._active_first
        assert path is not None  # _open_new() sets the path with the descriptor
        self._fd, self._active, self._active_events, self._active_size = None, None, 0, 0
        self._active_pairs, self._active_first = Counter(), {}
        await asyncio.to_thread(_sync_and_close, fd, path, events > 0)
        return await self._finalize_path(path, events, pairs, size, firsts)

    async def _finalize_path(self, path: Path, events: int | None, pairs: Counter | None = None,
                             size: int = 0, firsts: dict | None = None) -> bool:
        """``.tmp`` -> ``.buf``; an empty file is deleted. ``events`` None: a
        leftover of an earlier run (or a stranded file, counted already)."""
        if events is None:
            counts = await asyncio.to_thread(self._leftover_counts_io, path)
            events, pairs, size, firsts = self._count_leftover(path, counts)
            leftover = True
        else:
            leftover = False
        outcome = await asyncio.to_thread(_rename_or_drop, path)
        return self._apply_finalize(path, outcome, events, pairs or Counter(), size, leftover,
                                    firsts=firsts)

    def _leftover_counts_io(self, path: Path) -> tuple[int, Counter, int, dict] | None:
        if path in self._stranded:
            return None
        events, pairs, firsts = tally_records(path)
        return events, pairs, _size(path), firsts

    def _count_leftover(self, path: Path, counts) -> tuple[int, Counter, int, dict]:
        known = self._stranded.get(path)
        if known is not None:
            return known
        if counts is None:  # stranded when read, finalized since: nothing left to count
            return 0, Counter(), 0, {}
        events, pairs, size, firsts = counts
        self._pending += events
        self._bytes += size
        self.backlog.add_counts(pairs)
        return events, pairs, size, firsts

    def _apply_finalize(self, path: Path, outcome: str | OSError, events: int,
                        pairs: Counter, size: int, leftover: bool = True,
                        firsts: dict | None = None) -> bool:
        if outcome in ("deleted", "gone"):
            self._stranded.pop(path, None)
            self._release(events, pairs, size)
            return False
        if isinstance(outcome, OSError):
            logger.error("spool: cannot finalize {}: {}", path, outcome)
            self._stranded[path] = (events, pairs, size, firsts or {})
            return False
        final = path.with_suffix(".buf")
        self._stranded.pop(path, None)
        if leftover:
            logger.info("spool: finalized leftover {} ({} event(s))", final.name, events)
        self._file_events[final.name] = events
        self._file_pairs[final.name] = pairs
        self._file_bytes[final.name] = size
        self._file_first[final.name] = firsts or {}
        return True

    def _release(self, events: int, pairs: Mapping[tuple[str, str], int], size: int) -> None:
        """A file's counted events will never be replayed (it vanished, or was empty)."""
        self._pending = max(0, self._pending - events)
        self._bytes = max(0, self._bytes - size)
        self.backlog.remove_counts(pairs)

    # -- maintenance ---------------------------------------------------------------

    def pause(self) -> None:
        """Push maintenance on: the drain does nothing (no finalizing, no replay)."""
        self._paused = True

    async def resume(self) -> None:
        """Push maintenance off: finalize the active file and drain at once."""
        self._paused = False
        await self.finalize()
        self._wake.set()

    def kick(self) -> None:
        """Run the next drain cycle now."""
        self._wake.set()

    def backlog_ref(self) -> SpoolBacklog:
        """The live :class:`SpoolBacklog` itself (not a copy): callers holding
        only a proxy fetch it once and then read it synchronously."""
        return self.backlog

    # -- draining --------------------------------------------------------------------

    async def recover(self) -> int:
        """Startup: set aside what older versions left in ``failed/``, finalize
        leftover ``.tmp`` files, then replay every ``.buf`` oldest first,
        stopping at the first failure (the drain goes on later). Returns the
        number of events replayed. While paused (booting with maintenance on)
        nothing is replayed: the drain does it on resume."""
        await self._import_failed_files()
        await self._finalize_leftovers()
        if not await self._sync_registration() or self._paused:
            return 0
        replayed = 0

        async def run() -> None:
            nonlocal replayed
            async with self._drain_lock:
                for path in await asyncio.to_thread(self._buf_files):
                    outcome, n = await self._drain_file(path)
                    replayed += n
                    if outcome != "ok":
                        break
        try:
            await asyncio.wait_for(run(), self._recover_limit_s)
        except TimeoutError:
            logger.warning("spool: recovery stopped after {} s; the drain continues", self._recover_limit_s)
        return replayed

    async def _import_failed_files(self) -> None:
        try:
            files, entries = await asyncio.to_thread(
                import_failed_files, self.quarantine, self.failed_dir, read_records)
        except OSError as exc:
            logger.error("spool: cannot move {} into the quarantine: {}", self.failed_dir, exc)
            return
        if files:
            logger.warning("spool: {} file(s) an earlier version set aside in {} are now {} "
                           "quarantined event(s): GET /api/v1/system/spool/quarantine",
                           files, self.failed_dir, entries)
        self.quarantined_events = len(await asyncio.to_thread(self.quarantine.ids))

    async def _drain_loop(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()  # the first cycle is one period after start: recover() goes first
        while True:
            delay = self._flush_s - (loop.time() - started)
            if delay > 0 and not self._wake.is_set():
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass
            started = loop.time()
            self._wake.clear()
            try:
                await self._cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("spool: drain cycle failed")

    async def _cycle(self) -> None:
        if self._pending > 0 and self._backlog_started is None:
            self._backlog_started = (time.monotonic(), self.replayed_events,
                                     self.quarantined_events)
        # Registration first, also while paused (maintenance) and cooling down:
        # peers must see our backlog before any of them replays past it.
        if not await self._sync_registration() or self._paused:
            return
        now = asyncio.get_running_loop().time()
        if now < self._cooldown_until:
            return
        # Through the inbox: never interleaves with an append.
        await self._self.finalize()
        async with self._drain_lock:
            limit = self._files_per_cycle if self._db_healthy else 1
            for path in (await asyncio.to_thread(self._buf_files))[:limit]:
                if self._paused:
                    return
                outcome, _ = await self._drain_file(path)
                if outcome not in ("ok", "quarantined", "gone"):
                    return

    # -- the cluster-wide order ----------------------------------------------------------

    async def _sync_registration(self) -> bool:
        """Tell PostgreSQL which partitions this spool holds pushes for, and
        the accept time of the oldest one each (queen.spool_backlog), or beat
        when nothing changed. False when PostgreSQL cannot be reached. The
        first success after a failure (and at boot) starts a settle period in
        which nobody replays, so every peer back from the same outage has
        registered before the merge begins."""
        if self._register is None:
            return True
        now = asyncio.get_running_loop().time()
        if (self._registration_ok and not self._register_dirty and not self._paused
                and now < self._next_sync):
            # While PostgreSQL takes writes and the drain runs, new partitions
            # enter this spool only as held pushes, which PostgreSQL registered
            # itself, and replays move our rows on: a sync (and beat) every
            # REGISTRATION_SYNC_S is enough, not one per 10 ms retry.
            return True
        self._next_sync = now + REGISTRATION_SYNC_S
        want = self._oldest_map()
        if not want and not self._registered and not self._register_dirty:
            return True
        try:
            if want != self._registered or self._register_dirty:
                await self._register(want)
                self._registered, self._register_dirty = want, False
            else:
                await self._register(None)  # heartbeat: we are alive, wait for us
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._registration_ok or self._db_healthy:
                logger.warning("spool: cannot register the spool backlog ({}); will retry", exc)
            self._registration_ok = False
            self._db_healthy = False
            return False
        if not self._registration_ok:
            self._registration_ok = True
            self._cooldown_until, self._transient_streak = 0.0, 0
            if want:
                logger.info("spool: backlog of {} partition(s) registered; uploading",
                            len(want))
        return True

    def _oldest_map(self, skip: str | None = None) -> dict[tuple[str, str], int]:
        """Per pending (queue, partition): the accept time of its oldest event
        not uploaded yet (files oldest first, then the active file), leaving
        out file ``skip`` (the one being uploaded)."""
        out: dict[tuple[str, str], int] = {}
        for name in sorted(self._file_first):
            if name != skip:
                for pair, accept in self._file_first[name].items():
                    out.setdefault(pair, accept)
        for _events, _pairs, _size, firsts in self._stranded.values():
            for pair, accept in firsts.items():
                out.setdefault(pair, accept)
        for pair, accept in self._active_first.items():
            out.setdefault(pair, accept)
        return out

    async def _drain_file(self, path: Path) -> tuple[str, int]:
        """Upload one finalized file into PostgreSQL's staging table, then
        delete it. Returns (outcome, events uploaded now): ok | transient |
        permanent | quarantined | gone."""
        name = path.name
        try:
            stat = await asyncio.to_thread(_stat_key, path)
        except FileNotFoundError:
            self._forget(name)
            return "gone", 0
        except OSError as exc:
            logger.error("spool: cannot read {}: {}", name, exc)
            return self._unreadable(path, exc), 0
        cached = self._draining
        if cached is not None and cached[0] == name and self._draining_stat == stat:
            events = cached[1]  # a finalized file never changes: parse it once
        else:
            failed, events = await self._load_for_drain(path, stat)
            if failed is not None:
                return failed, 0
        done_set = self._done.setdefault(name, set())
        for k, event in enumerate(events):  # never storable: set aside without a round trip
            problem = None if k in done_set else event_problem(event)
            if problem is not None:
                if not await self._quarantine_event(name, k, event, "invalid", problem):
                    return "permanent", 0
                self._settle(name, events, [k])
        while True:
            todo = [k for k in range(len(events)) if k not in done_set]
            oldest = self._oldest_map(skip=name)
            # Until the next registration sync, this spool also holds the file's
            # partitions from a bound below any accept time still to come: a push
            # appended to the active file during the upload is not in ``oldest``.
            floor = max(self._last_accept + 1, time.time_ns() // 1000)
            for pair in self._file_first.get(name, {}):
                oldest[pair] = min(oldest.get(pair, floor), floor)
            try:
                uploaded = await self._upload(name, events, todo, oldest)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                rejected = getattr(exc, "rejected", None)
                if isinstance(rejected, dict) and rejected:
                    for k, reason in sorted(rejected.items()):
                        if not await self._quarantine_event(name, k, events[k], "rejected",
                                                            reason):
                            return "permanent", 0
                        self._settle(name, events, [k])
                    continue  # the rest of the file
                if self._transient(exc):
                    self._transient_failure(name, exc)
                    return "transient", 0
                logger.error("spool: upload of {} failed: {}", name, _describe(exc))
                return "permanent", 0
            break
        uploaded_now = len(todo) if uploaded else 0
        self.replayed_events += uploaded_now
        self._settle(name, events, todo)
        self._registered, self._register_dirty = oldest, False
        self._next_sync = 0.0  # drop the floors above at the next cycle
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            pass
        except OSError as exc:  # uploaded; a second upload is skipped (the ledger)
            logger.error("spool: cannot delete uploaded {}: {}", name, exc)
            return "permanent", uploaded_now
        self._forget(name, fallback=len(events))
        self._db_healthy = True
        self._transient_streak = 0
        if self._on_uploaded is not None and uploaded_now:
            self._on_uploaded(uploaded_now)
        return "ok", uploaded_now

    async def _load_for_drain(self, path: Path, stat: tuple) -> tuple[str | None, list[dict]]:
        """Read and prepare a file for the drain: ``(None, events)``, or
        ``(outcome, [])`` when it cannot be drained now."""
        name = path.name
        try:
            events, bad, torn = await asyncio.to_thread(read_records, path, True)
        except FileNotFoundError:
            self._forget(name)
            return "gone", []
        except OSError as exc:
            logger.error("spool: cannot read {}: {}", name, exc)
            return self._unreadable(path, exc), []
        if name not in self._file_events:  # appeared behind our back (copied in, restored)
            self._count_found(path)
        if torn:
            logger.warning("spool: {}: torn last record ignored (it was never acknowledged)", name)
        if bad and name not in self._raw_quarantined:
            try:
                await self._quarantine_raw(name, bad)
            except OSError as exc:
                logger.error("spool: cannot quarantine unparseable records of {}: {}", name, exc)
                return "permanent", []
        default = file_accept_us(name)
        for event in events:  # written before accept times were recorded: the file's time
            if isinstance(event, dict) and not isinstance(event.get("acceptedAt"), int):
                event["acceptedAt"] = default
        self._draining, self._draining_stat = (name, events), stat
        return None, events

    async def _quarantine_event(self, name: str, index: int, event: dict, reason: str,
                                error: str) -> bool:
        """Set one event aside durably; False when the quarantine cannot be
        written (the file then stays where it is and is retried)."""
        ident = entry_id(name, index)
        try:
            new = await asyncio.to_thread(self.quarantine.put, ident, reason=reason, error=error,
                                          origin_file=name, index=index, event=event)
        except OSError as exc:
            logger.error("spool: cannot quarantine event {} of {}: {}", index, name, exc)
            return False
        if new:
            self.quarantined_events += 1
        queue, partition = event_pair(event) if isinstance(event, Mapping) else (None, None)
        logger.error("spool: event {} of {} ({}/{}, transactionId {}) quarantined as {}: {}",
                     index, name, queue, partition,
                     event.get("transactionId") if isinstance(event, Mapping) else None,
                     ident, error)
        return True

    async def _quarantine_raw(self, name: str, bad: list[tuple[int, bytes]]) -> None:
        for index, raw in bad:
            ident = entry_id(name, index, raw=True)
            if await asyncio.to_thread(self.quarantine.put, ident, reason="unparseable",
                                       error="record is not valid JSON", origin_file=name,
                                       index=index, raw=raw):
                self.quarantined_events += 1
        self._raw_quarantined.add(name)
        logger.error("spool: {} unparseable record(s) of {} quarantined", len(bad), name)

    def _settle(self, name: str, events: list[dict], indexes: list[int]) -> None:
        """The events at ``indexes`` are settled (committed or set aside): take
        them off the backlog and move the file's progress on. Events settled
        before (a batch replayed twice) subtract nothing, nor do events the
        file never counted (a file that reappeared after its replay, a push
        whose failed write could not be cut off)."""
        done = self._done.setdefault(name, set())
        fresh = [k for k in indexes if k not in done]
        done.update(fresh)
        progress = self._progress.get(name, 0)
        while progress in done:
            progress += 1
        self._progress[name] = progress
        left = self._file_pairs.get(name)
        if not left or not fresh:
            return
        gone: dict[tuple[str, str], int] = {}
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

    def _transient(self, exc: BaseException) -> bool:
        try:
            return bool(self._is_transient(exc))
        except Exception:  # a broken classifier must never get an event quarantined
            logger.exception("spool: is_transient failed; treating the error as transient")
            return True

    def _transient_failure(self, name: str, exc: BaseException) -> None:
        if self._db_healthy:  # one line per outage, not one per 100 ms cycle
            logger.warning("spool: upload of {} failed, database unreachable ({}); keeping it",
                           name, exc)
        self._db_healthy = False
        self._permanent.pop(name, None)
        self._transient_streak += 1
        if self._transient_streak >= self._cooldown_after:
            self._cooldown_until = asyncio.get_running_loop().time() + self._cooldown_s
            self._transient_streak = 0
            dropped = _COOLDOWN_LINES.allow("cooldown")
            if dropped is not None:
                logger.info("spool: {} transient failures in a row; cooling down {} s{}",
                            self._cooldown_after, self._cooldown_s, dropped_note(dropped))

    def _unreadable(self, path: Path, exc: BaseException) -> str:
        """A file that cannot be read: retried, then moved to ``failed/`` whole
        (its events cannot be told apart, so none can be set aside alone)."""
        name = path.name
        self._transient_streak = 0
        n = self._permanent.get(name, 0) + 1
        self._permanent[name] = n
        if n < self._quarantine_after:
            logger.warning("spool: {} unreadable ({}/{}): {}", name, n, self._quarantine_after, exc)
            return "permanent"
        try:
            os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)
            os.rename(path, self.failed_dir / name)
        except OSError as err:
            logger.error("spool: cannot move unreadable {} aside: {}", name, err)
            return "permanent"
        logger.error("spool: {} unreadable {} times in a row ({}); moved to {}", name, n, exc,
                     self.failed_dir)
        self.quarantined_files += 1
        self._forget(name)
        return "quarantined"

    def _maybe_drained(self) -> None:
        """Once the spool is empty again: one line saying what became of what it held."""
        if self._pending > 0 or self._backlog_started is None:
            return
        since, replayed, quarantined = self._backlog_started
        self._backlog_started = None
        logger.info("spool: drained: {} event(s) stored, {} quarantined, {:.1f} s after the "
                    "first was spooled", self.replayed_events - replayed,
                    max(0, self.quarantined_events - quarantined), time.monotonic() - since)

    def _forget(self, name: str, fallback: int = 0) -> None:
        """The file left the main directory: it is no longer pending."""
        n = self._file_events.pop(name, fallback)
        self._pending = max(0, self._pending - n)
        self._bytes = max(0, self._bytes - self._file_bytes.pop(name, 0))
        self._done.pop(name, None)
        self._raw_quarantined.discard(name)
        self._file_first.pop(name, None)
        self._maybe_drained()
        if self._draining is not None and self._draining[0] == name:
            self._draining = None
        left = self._file_pairs.pop(name, None)
        if left:  # replayed ones were taken off chunk by chunk; the rest never will be
            self.backlog.remove_counts(left)
        self._permanent.pop(name, None)
        self._progress.pop(name, None)

    # -- the quarantine (actor messages for the operator's routes) --------------------

    async def quarantine_list(self) -> list[dict]:
        """Every entry, without its payload, oldest origin first."""
        entries = await asyncio.to_thread(self.quarantine.entries)
        self.quarantined_events = len(entries)
        return [_summary(e) for e in entries]

    async def quarantine_get(self, ident: str) -> dict | None:
        return await asyncio.to_thread(self.quarantine.get, ident)

    async def quarantine_discard(self, ident: str) -> bool:
        entry = await asyncio.to_thread(self.quarantine.get, ident)
        if entry is None or not await asyncio.to_thread(self.quarantine.remove, ident):
            return False
        self.quarantined_events = max(0, self.quarantined_events - 1)
        logger.warning("spool: quarantined event {} discarded by an operator ({})", ident,
                       _summary(entry).get("transactionId"))
        return True

    async def quarantine_replay(self, ident: str, overrides: Mapping[str, str]) -> dict:
        """Push one quarantined event now (with the operator's ``queue`` /
        ``partition`` overrides); the entry is removed once it committed.
        Raises ``LookupError`` (no such entry), ``ValueError`` (it still cannot
        be stored), or the replay's own error (database down...)."""
        entry = await asyncio.to_thread(self.quarantine.get, ident)
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
        await asyncio.to_thread(self.quarantine.remove, ident)
        self.quarantined_events = max(0, self.quarantined_events - 1)
        status = results[0]["status"] if results else "queued"
        if status == "staged":  # durable, behind staged pushes to its partition
            status = "buffered"
        logger.info("spool: quarantined event {} replayed ({}/{}): {}", ident, event.get("queue"),
                    event.get("partition"), status)
        return {"id": ident, "status": status, "queue": event.get("queue"),
                "partition": event.get("partition") or "Default",
                "transactionId": event.get("transactionId")}

    # -- stats -------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        count, total = await asyncio.to_thread(_dir_usage, self.failed_dir)
        return {
            "pendingCount": max(0, self._pending),
            "pendingFiles": len(self._file_events) + (1 if self._active_events else 0),
            "pendingBytes": self._bytes,
            "maxBytes": self._max_bytes,
            "rejectedFull": self.rejected_full,
            "failedCount": self._failed,
            "failedFiles": {"count": count, "totalBytes": total,
                            "totalMB": round(total / (1024 * 1024), 2)},
            "dbHealthy": self._db_healthy,
            "paused": self._paused,
            "healthy": self._healthy,
            "backlogPartitions": self.backlog.partitions(),
            "replayedEvents": self.replayed_events,
            "quarantinedFiles": self.quarantined_files,
            "quarantinedEvents": self.quarantined_events,
            "registeredPartitions": len(self._registered),
        }


# -- blocking helpers (run in a thread) ----------------------------------------------

_COOLDOWN_LINES = Throttle(60.0)  # a long outage cools down again and again: once a minute
REGISTRATION_SYNC_S = 0.5  # how often a draining spool syncs its queen.spool_backlog rows
STOP_REGISTRATION_S = 2.0  # at most this long for the last registration at a clean stop


def _describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return text if len(text) < 2000 else text[:2000] + "..."


def _stat_key(path: Path) -> tuple:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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


def _dir_usage(directory: Path) -> tuple[int, int]:
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


def _summary(entry: Mapping[str, Any]) -> dict:
    raw = entry.get("event")
    event: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return {"id": entry.get("id"), "reason": entry.get("reason"), "error": entry.get("error"),
            "quarantinedAt": entry.get("quarantinedAt"), "originFile": entry.get("originFile"),
            "index": entry.get("index"), "queue": event.get("queue"),
            "partition": event.get("partition") or ("Default" if event else None),
            "transactionId": event.get("transactionId")}
