"""The node-local disk spool (behaviour.md §5, invariants 39-45).

Pushes are appended here, instead of going to PostgreSQL, while push
maintenance is on or the database cannot be reached; a drain task replays them
once the database takes writes again.

Files live in one node-local directory::

    queen-<13-digit epoch ms>-<8-digit sequence>.tmp   the active file (appended to)
    queen-<13-digit epoch ms>-<8-digit sequence>.buf   finalized, waiting to be drained
    failed/<name>.buf                                  quarantined (permanent errors)

Names sort in creation order, also across restarts: a new name is always
greater than every name already in the directory. A file holds repeated
``[u32 little-endian body length][UTF-8 JSON event]`` records, written with
O_APPEND and no fsync per push (a finalized file is fsynced once).

Who touches what:

* The actor (its inbox) owns the active ``.tmp`` file: ``append``,
  ``finalize``, ``pause``/``resume``, ``stats``. Appends are plain, short
  ``os.write`` calls and are never queued behind a replay.
* The drain task owns the ``.buf`` files: it asks the actor (through the
  inbox) to finalize the active file, then replays finalized files oldest
  first outside the actor, so a slow database never blocks appends. It never
  looks at ``.tmp`` files. ``recover()`` and the drain share a lock, so two
  replays never run at once.

A file is only deleted after all its events were replayed (duplicates count
as replayed: the broker dedups by transactionId), or moved to ``failed/``
after ``quarantine_after`` consecutive permanent failures.

Sticky failover: ``Spool.backlog`` (a :class:`SpoolBacklog`, also handed out
by ``backlog_ref()``) counts, per (queue, partition), the events spooled but
not yet replayed. While a partition has any, the broker's push route sends its
new pushes to the spool as well, so the drain replays them after the older
ones and the partition keeps the order its pushes were acknowledged in. The
counts only drop once a replayed chunk's transaction returned (or when a file
is quarantined: its events leave the order chain).
"""
from __future__ import annotations

import asyncio
import os
import re
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Mapping

import ujson
from loguru import logger

from actors.runtime import AsyncioActor

__all__ = ["Spool", "SpoolBacklog", "SpoolError", "read_records"]

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


def read_records(path: Path) -> tuple[list[dict], int, bool]:
    """Every complete, parseable event of a spool file, in write order.

    Returns ``(events, skipped, torn)``: records whose JSON does not parse are
    skipped; reading stops at a torn tail (a record running past end of file),
    which was never acknowledged to its client.
    """
    data = Path(path).read_bytes()
    events: list[dict] = []
    skipped, pos, end = 0, 0, len(data)
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
            skipped += 1
        pos = stop
    return events, skipped, pos != end


def event_pair(event: Mapping[str, Any]) -> tuple[str, str]:
    """The (queue, partition) of a spool event; partition defaults like the records."""
    return event.get("queue"), event.get("partition") or "Default"


def tally_records(path: Path) -> tuple[int, Counter]:
    """``(records, per-(queue, partition) events)`` of a spool file: complete
    records only (a torn tail was never acknowledged); unparseable records
    count as records but belong to no partition."""
    try:
        events, skipped, _ = read_records(path)
    except OSError:
        return 0, Counter()
    return len(events) + skipped, Counter(event_pair(e) for e in events)


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
                 replay: Callable[[list[dict]], Awaitable[None]],
                 events_per_file: int = 10000, max_batch: int = 100, flush_ms: int = 100,
                 is_transient: Callable[[BaseException], bool],
                 start_paused: bool = False, clock: Callable[[], float] = time.time,
                 files_per_cycle: int = 10, quarantine_after: int = 5,
                 cooldown_after: int = 10, cooldown_s: float = 5.0,
                 recover_limit_s: float = RECOVER_LIMIT_S):
        super().__init__()
        self.directory = Path(directory)
        self.failed_dir = self.directory / "failed"
        self._replay = replay
        self._is_transient = is_transient
        self._events_per_file = max(1, int(events_per_file))
        self._max_batch = max(1, int(max_batch))
        self._flush_s = max(0.001, flush_ms / 1000)
        self._clock = clock
        self._files_per_cycle = max(1, files_per_cycle)
        self._quarantine_after = max(1, quarantine_after)
        self._cooldown_after = max(1, cooldown_after)
        self._cooldown_s = cooldown_s
        self._recover_limit_s = recover_limit_s

        # the active file (only touched by the actor's own handlers)
        self._fd: int | None = None
        self._active: Path | None = None
        self._active_events = 0
        self._active_size = 0
        self._active_pairs: Counter = Counter()  # (queue, partition) -> events in the active file
        self._last_name = (0, -1)  # (ms, sequence) of the newest name handed out
        # .tmp files that could not be renamed yet -> (events, pairs) already counted
        self._stranded: dict[Path, tuple[int, Counter]] = {}

        # the drain
        self._paused = start_paused
        self._db_healthy = True
        self._transient_streak = 0
        self._cooldown_until = 0.0
        self._permanent: dict[str, int] = {}  # .buf name -> consecutive permanent failures
        self._progress: dict[str, int] = {}  # .buf name -> events already replayed
        self._file_events: dict[str, int] = {}  # .buf name -> events counted as pending
        # .buf name -> (queue, partition) -> events counted in the backlog, not replayed yet
        self._file_pairs: dict[str, Counter] = {}
        self._settled: dict[str, int] = {}  # .buf name -> events already taken off the backlog
        self.backlog = SpoolBacklog()
        self._drain_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._self: Any = None

        # counters
        self._pending = 0
        self._failed = 0
        self._healthy = True
        self.replayed_events = 0
        self.quarantined_files = 0

    # -- lifecycle ---------------------------------------------------------------

    def on_start(self) -> None:
        try:
            self._make_dirs()
        except OSError as exc:
            self._healthy = False
            logger.error("spool: cannot create {}: {}", self.directory, exc)
        else:
            self._scan_existing()
        self._self = self.actor_ref.proxy()
        self._task = asyncio.get_running_loop().create_task(self._drain_loop(), name="spool-drain")
        logger.info("spool: {} ({} event(s) pending in {} partition(s){})", self.directory,
                    self._pending, self.backlog.partitions(), ", paused" if self._paused else "")

    async def on_stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._finalize_active()

    def _make_dirs(self) -> None:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)

    def _scan_existing(self) -> None:
        """Count what a previous run left and make new names sort after it;
        leftover ``.tmp`` files are finalized (nothing is deleted unreplayed)."""
        for path in self._listdir():
            m = _NAME.match(path.name)
            self._last_name = max(self._last_name, (int(m[1]), int(m[2])))
        self._finalize_leftovers()
        for path in self._buf_files():
            if path.name not in self._file_events:
                n, pairs = tally_records(path)
                self._file_events[path.name] = n
                self._file_pairs[path.name] = pairs
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

    def _finalize_leftovers(self) -> None:
        for path in self._listdir():
            if path.suffix == ".tmp" and path != self._active:
                self._finalize_path(path, None)

    # -- writing (actor messages) ------------------------------------------------

    def append(self, events: list[dict]) -> None:
        """Write every event of one push, or none of them (raises SpoolError)."""
        if not events:
            return
        data = encode_records(events)
        try:
            self._write(data)
        except OSError as exc:
            self._failed += len(events)
            self._healthy = False
            raise SpoolError(f"spool write failed: {exc}") from exc
        self._healthy = True
        self._active_events += len(events)
        self._pending += len(events)
        pairs = Counter(event_pair(e) for e in events)
        self._active_pairs.update(pairs)
        self.backlog.add_counts(pairs)
        if self._active_events >= self._events_per_file:
            self._finalize_active()

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            self._open_new()
        fd, before = self._fd, self._active_size
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
        try:
            _os_ftruncate(self._fd, size)
        except OSError as exc:
            # Cannot guarantee the file is clean: stop using it. Its records stay
            # readable; at worst the partial push is replayed without an ack.
            logger.error("spool: could not truncate {} after a failed write: {}", self._active, exc)
            self._finalize_active()

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
        self._active_pairs = Counter()

    def finalize(self) -> bool:
        """Close the active file: rename it to ``.buf`` (drainable), or delete it
        when it holds no events. True when a file became drainable."""
        done = self._finalize_active()
        for path in list(self._stranded):
            self._finalize_path(path, None)
        return done

    def _finalize_active(self) -> bool:
        if self._fd is None:
            return False
        fd, path, events, pairs = self._fd, self._active, self._active_events, self._active_pairs
        self._fd, self._active, self._active_events, self._active_size = None, None, 0, 0
        self._active_pairs = Counter()
        try:
            if events:
                os.fsync(fd)
        except OSError as exc:
            logger.warning("spool: fsync of {} failed: {}", path, exc)
        finally:
            os.close(fd)
        return self._finalize_path(path, events, pairs)

    def _finalize_path(self, path: Path, events: int | None, pairs: Counter | None = None) -> bool:
        """``.tmp`` -> ``.buf``; an empty file is deleted. ``events`` None: a
        leftover of an earlier run (or a stranded file, counted already),
        counted from its content the first time it is seen."""
        leftover = events is None
        if leftover:
            known = self._stranded.get(path)
            if known is None:
                events, pairs = tally_records(path)
                self._pending += events
                self.backlog.add_counts(pairs)
            else:
                events, pairs = known
        pairs = pairs if pairs is not None else Counter()
        try:
            if path.stat().st_size == 0:
                path.unlink()
                self._stranded.pop(path, None)
                self._release(events, pairs)
                return False
            final = path.with_suffix(".buf")
            os.rename(path, final)
        except FileNotFoundError:
            self._stranded.pop(path, None)
            self._release(events, pairs)
            return False
        except OSError as exc:
            logger.error("spool: cannot finalize {}: {}", path, exc)
            self._stranded[path] = (events, pairs)
            return False
        self._stranded.pop(path, None)
        if leftover:
            logger.info("spool: finalized leftover {} ({} event(s))", final.name, events)
        self._file_events[final.name] = events
        self._file_pairs[final.name] = pairs
        return True

    def _release(self, events: int, pairs: Mapping[tuple[str, str], int]) -> None:
        """A file's counted events will never be replayed (it vanished, or was empty)."""
        self._pending = max(0, self._pending - events)
        self.backlog.remove_counts(pairs)

    # -- maintenance ---------------------------------------------------------------

    def pause(self) -> None:
        """Push maintenance on: the drain does nothing (no finalizing, no replay)."""
        self._paused = True

    def resume(self) -> None:
        """Push maintenance off: finalize the active file and drain at once."""
        self._paused = False
        self.finalize()
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
        """Startup: finalize leftover ``.tmp`` files, then replay every ``.buf``
        oldest first, stopping at the first failure (the drain goes on later).
        Returns the number of events replayed. While paused (booting with
        maintenance on) nothing is replayed: the drain does it on resume."""
        self._finalize_leftovers()
        if self._paused:
            return 0
        replayed = 0

        async def run() -> None:
            nonlocal replayed
            async with self._drain_lock:
                for path in self._buf_files():
                    outcome, n = await self._drain_file(path)
                    replayed += n
                    if outcome != "ok":
                        break
        try:
            await asyncio.wait_for(run(), self._recover_limit_s)
        except asyncio.TimeoutError:
            logger.warning("spool: recovery stopped after {} s; the drain continues", self._recover_limit_s)
        return replayed

    async def _drain_loop(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()  # the first cycle is one period after start: recover() goes first
        while True:
            delay = self._flush_s - (loop.time() - started)
            if delay > 0 and not self._wake.is_set():
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            started = loop.time()
            self._wake.clear()
            if not self._paused and started >= self._cooldown_until:
                try:
                    await self._cycle()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("spool: drain cycle failed")

    async def _cycle(self) -> None:
        # Through the inbox: never interleaves with an append.
        await self._self.finalize()
        async with self._drain_lock:
            limit = self._files_per_cycle if self._db_healthy else 1
            for path in self._buf_files()[:limit]:
                if self._paused:
                    return
                outcome, _ = await self._drain_file(path)
                if outcome not in ("ok", "quarantined", "gone"):
                    return

    async def _drain_file(self, path: Path) -> tuple[str, int]:
        """Replay one finalized file. Returns (outcome, events replayed now):
        ok | transient | permanent | quarantined | paused | gone."""
        name = path.name
        try:
            events, skipped, torn = await asyncio.to_thread(read_records, path)
        except FileNotFoundError:
            self._forget(name)
            return "gone", 0
        except OSError as exc:
            logger.error("spool: cannot read {}: {}", name, exc)
            return self._permanent_failure(path, exc), 0
        if skipped or torn:
            logger.warning("spool: {}: {} unparseable record(s) skipped{}", name, skipped,
                           ", torn last record ignored" if torn else "")
        start = self._progress.get(name, 0)
        done = 0
        for i in range(start, len(events), self._max_batch):
            if self._paused:
                return "paused", done
            chunk = events[i:i + self._max_batch]
            try:
                await self._replay(chunk)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._progress[name] = i
                if self._transient(exc):
                    self._transient_failure(name, exc)
                    return "transient", done
                return self._permanent_failure(path, exc), done
            # Committed: these events no longer hold their partitions back.
            self._settle_chunk(name, i, chunk)
            done += len(chunk)
            self._progress[name] = i + len(chunk)
            self.replayed_events += len(chunk)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # replayed; a second replay is deduplicated anyway
            logger.error("spool: cannot delete replayed {}: {}", name, exc)
            return "permanent", done
        self._forget(name, fallback=len(events))
        self._db_healthy = True
        self._transient_streak = 0
        return "ok", done

    def _settle_chunk(self, name: str, start: int, chunk: list[dict]) -> None:
        """Take the replayed chunk ``events[start:start + len(chunk)]`` off the
        backlog. Events settled before (a chunk replayed twice) subtract
        nothing, nor do events the file never counted (a file that reappeared
        after its replay, a push whose failed write could not be cut off)."""
        settled = self._settled.get(name, 0)
        end = start + len(chunk)
        left = self._file_pairs.get(name)
        if end <= settled or not left:
            self._settled[name] = max(settled, end)
            return
        self._settled[name] = end
        fresh = chunk[max(0, settled - start):]
        gone: dict[tuple[str, str], int] = {}
        for pair, n in Counter(event_pair(e) for e in fresh).items():
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
        except Exception:  # a broken classifier must never get a file quarantined
            logger.exception("spool: is_transient failed; treating the error as transient")
            return True

    def _transient_failure(self, name: str, exc: BaseException) -> None:
        self._db_healthy = False
        self._permanent.pop(name, None)
        self._transient_streak += 1
        logger.warning("spool: replay of {} failed, database unreachable ({}); keeping it", name, exc)
        if self._transient_streak >= self._cooldown_after:
            self._cooldown_until = asyncio.get_running_loop().time() + self._cooldown_s
            self._transient_streak = 0
            logger.warning("spool: {} transient failures in a row; cooling down {} s",
                           self._cooldown_after, self._cooldown_s)

    def _permanent_failure(self, path: Path, exc: BaseException) -> str:
        name = path.name
        self._transient_streak = 0
        n = self._permanent.get(name, 0) + 1
        self._permanent[name] = n
        if n < self._quarantine_after:
            logger.warning("spool: replay of {} rejected ({}/{}): {}", name, n,
                           self._quarantine_after, exc)
            return "permanent"
        try:
            os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)
            os.rename(path, self.failed_dir / name)
        except OSError as err:
            logger.error("spool: cannot quarantine {}: {}", name, err)
            return "permanent"
        logger.error("spool: {} rejected {} times in a row ({}); moved to {}", name, n, exc,
                     self.failed_dir)
        left = self._file_pairs.get(name)
        if left:
            logger.error("spool: {} unreplayed event(s) of {} in {} partition(s) leave the "
                         "replay order; new pushes to them are no longer held back",
                         sum(left.values()), name, len(left))
        self.quarantined_files += 1
        self._forget(name)
        return "quarantined"

    def _forget(self, name: str, fallback: int = 0) -> None:
        """The file left the main directory: it is no longer pending."""
        n = self._file_events.pop(name, fallback)
        self._pending = max(0, self._pending - n)
        self._settled.pop(name, None)
        left = self._file_pairs.pop(name, None)
        if left:  # replayed ones were taken off chunk by chunk; the rest never will be
            self.backlog.remove_counts(left)
        self._permanent.pop(name, None)
        self._progress.pop(name, None)

    # -- stats -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        pending_files = len(self._buf_files()) + (1 if self._active_events else 0)
        count = total = 0
        try:
            with os.scandir(self.failed_dir) as it:
                for entry in it:
                    if entry.is_file():
                        count += 1
                        total += entry.stat().st_size
        except OSError:
            pass
        return {
            "pendingCount": max(0, self._pending),
            "pendingFiles": pending_files,
            "failedCount": self._failed,
            "failedFiles": {"count": count, "totalBytes": total,
                            "totalMB": round(total / (1024 * 1024), 2)},
            "dbHealthy": self._db_healthy,
            "paused": self._paused,
            "healthy": self._healthy,
            "backlogPartitions": self.backlog.partitions(),
            "replayedEvents": self.replayed_events,
            "quarantinedFiles": self.quarantined_files,
        }
