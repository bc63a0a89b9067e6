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
"""
from __future__ import annotations

import asyncio
import os
import re
import struct
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

import ujson
from loguru import logger

from actors.runtime import AsyncioActor

__all__ = ["Spool", "SpoolError", "read_records"]

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


def count_records(path: Path) -> int:
    """Complete records in a spool file, by walking the length headers only."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return 0
    n, pos, end = 0, 0, len(data)
    while pos + 4 <= end:
        stop = pos + 4 + _LEN.unpack_from(data, pos)[0]
        if stop > end:
            break
        n, pos = n + 1, stop
    return n


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
        self._last_name = (0, -1)  # (ms, sequence) of the newest name handed out
        self._stranded: set[Path] = set()  # .tmp files that could not be renamed yet

        # the drain
        self._paused = start_paused
        self._db_healthy = True
        self._transient_streak = 0
        self._cooldown_until = 0.0
        self._permanent: dict[str, int] = {}  # .buf name -> consecutive permanent failures
        self._progress: dict[str, int] = {}  # .buf name -> events already replayed
        self._file_events: dict[str, int] = {}  # .buf name -> events counted as pending
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
        logger.info("spool: {} ({} event(s) pending{})", self.directory, self._pending,
                    ", paused" if self._paused else "")

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
                n = count_records(path)
                self._file_events[path.name] = n
                self._pending += n

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
        fd, path, events = self._fd, self._active, self._active_events
        self._fd, self._active, self._active_events, self._active_size = None, None, 0, 0
        try:
            if events:
                os.fsync(fd)
        except OSError as exc:
            logger.warning("spool: fsync of {} failed: {}", path, exc)
        finally:
            os.close(fd)
        return self._finalize_path(path, events)

    def _finalize_path(self, path: Path, events: int | None) -> bool:
        """``.tmp`` -> ``.buf``; an empty file is deleted. ``events`` None: a
        leftover of an earlier run, counted from its content."""
        try:
            if path.stat().st_size == 0:
                path.unlink()
                self._stranded.discard(path)
                return False
            final = path.with_suffix(".buf")
            os.rename(path, final)
        except FileNotFoundError:
            self._stranded.discard(path)
            return False
        except OSError as exc:
            logger.error("spool: cannot finalize {}: {}", path, exc)
            self._stranded.add(path)
            return False
        self._stranded.discard(path)
        if events is None:
            events = count_records(final)
            self._pending += events
            logger.info("spool: finalized leftover {} ({} event(s))", final.name, events)
        self._file_events[final.name] = events
        return True

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
        self.quarantined_files += 1
        self._forget(name)
        return "quarantined"

    def _forget(self, name: str, fallback: int = 0) -> None:
        """The file left the main directory: it is no longer pending."""
        n = self._file_events.pop(name, fallback)
        self._pending = max(0, self._pending - n)
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
        }
