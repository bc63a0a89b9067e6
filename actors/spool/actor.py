"""The spool actor: composes the parts of :mod:`actors.spool` and runs the drain.

* The actor (its inbox) owns the active ``.tmp`` file (:class:`SpoolWriter`):
  ``append``, ``finalize``, ``pause``/``resume``, ``stats`` and the
  quarantine's operator messages.
* The drain task owns the ``.buf`` files: every ``flush_ms`` (or when kicked) it
  registers this spool's backlog (:class:`Registration`), asks the actor
  through the inbox to finalize the active file, then uploads finished files
  oldest first (:class:`Uploader`) outside the actor, so a slow database never
  blocks appends. ``recover()`` and the drain share a lock, so two uploads
  never run at once.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from actors.runtime import AsyncioActor
from actors.spool.backlog import SpoolBacklog
from actors.spool.files import SpoolFiles, dir_usage, fsync_dir, list_buf_files
from actors.spool.health import DrainHealth
from actors.spool.order import Register, Registration
from actors.spool.quarantine import QuarantineDesk
from actors.spool.records import file_accept_us
from actors.spool.upload import Upload, Uploader
from actors.spool.writer import Recovered, SpoolWriter

__all__ = ["RECOVER_LIMIT_S", "Spool"]

RECOVER_LIMIT_S = 3600.0


class Spool(AsyncioActor):
    """The disk spool of one broker process; see the package docstring."""

    def __init__(self, directory: Path | str, *, upload: Upload,
                 replay: Callable[[list[dict]], Awaitable[Any]],
                 register: Register | None = None,
                 events_per_file: int = 10000, flush_ms: int = 100,
                 max_bytes: int = 1 << 30,
                 is_transient: Callable[[BaseException], bool],
                 start_paused: bool = False, clock: Callable[[], float] = time.time,
                 files_per_cycle: int = 10, quarantine_after: int = 5,
                 cooldown_after: int = 10, cooldown_s: float = 5.0,
                 recover_limit_s: float = RECOVER_LIMIT_S,
                 on_uploaded: Callable[[int], None] | None = None,
                 owner: str = "queen", sync_interval_ms: int | None = None):
        super().__init__()
        self.directory = Path(directory)
        self.failed_dir = self.directory / "failed"
        self.backlog = SpoolBacklog()
        self.files = SpoolFiles(self.backlog)
        self.quarantine = QuarantineDesk(self.directory / "quarantine", replay)
        self.health = DrainHealth(cooldown_after, cooldown_s)
        self.registration = Registration(register, self.files, self.health)
        self.writer = SpoolWriter(self.directory, self.files, events_per_file=events_per_file,
                                  max_bytes=max_bytes, clock=clock,
                                  sync_interval_ms=sync_interval_ms)
        self.uploader = Uploader(self.files, self.quarantine, self.registration, self.health,
                                 upload=upload, is_transient=is_transient,
                                 accept_floor=self.writer.accept_floor,
                                 failed_dir=self.failed_dir, quarantine_after=quarantine_after,
                                 on_uploaded=on_uploaded)
        self.paused = start_paused
        self._flush_s = max(0.001, flush_ms / 1000)
        self._files_per_cycle = max(1, files_per_cycle)
        self._recover_limit_s = recover_limit_s
        self._owner = owner
        self.spool_id = owner  # read from (or written to) the directory at start
        self._drain_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._self: Any = None

    # -- lifecycle ---------------------------------------------------------------

    def on_start(self) -> None:
        # Start-up only, before HTTP is served: scanning here keeps the counts
        # exact from the first request.
        try:
            self.writer.make_dirs()
        except OSError as exc:
            self.writer.healthy = False
            logger.error("spool: cannot create {}: {}", self.directory, exc)
        else:
            found = self.writer.scan_existing()
            self.quarantine.recount()
            self.spool_id, fresh = _read_spool_id(self.directory, self._owner)
            _log_recovery(self.directory, found, self.spool_id, fresh)
        self._self = self.actor_ref.proxy()
        self._task = asyncio.get_running_loop().create_task(self._drain_loop(), name="spool-drain")
        logger.info("spool: {} ({} event(s) pending in {} partition(s), cap {} MB, fsync {}{})",
                    self.directory, self.files.pending, self.backlog.partitions(),
                    round(self.writer.max_bytes / (1 << 20)), self.writer.policy,
                    ", paused" if self.paused else "")
        # A backlog left by the previous run: its drained line is timed from its first event.
        self._note_backlog()

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.writer.stop()
        await self.registration.last()
        if self.files.pending > 0:
            # Acknowledged pushes that are not in PostgreSQL yet: say where they wait.
            logger.warning("spool: stopping with {} event(s) still spooled in {}; the next "
                           "start on this directory uploads them", self.files.pending,
                           self.directory)

    def _note_backlog(self) -> None:
        """Tell the drained line when the spool holds events (a no-op while it already
        knows of the backlog)."""
        self.uploader.drained.maybe_started(self.files.pending, self.uploader.replayed_events,
                                            self.quarantine.count, self._oldest_pending_us)

    def _oldest_pending_us(self) -> int | None:
        """Accept time (µs) of the oldest event still spooled: the files' recorded accept
        times, else the creation time in the oldest file's name."""
        firsts = self.files.oldest_map().values()
        if firsts:
            return min(firsts)
        names = [*self.files.finished, *(p.name for p in self.files.stranded)]
        return min((file_accept_us(n) for n in names), default=None)

    def identity(self) -> str:
        """This spool's name in queen.spool_backlog (and the upload ledger)."""
        return self.spool_id

    def backlog_ref(self) -> SpoolBacklog:
        """The live :class:`SpoolBacklog` itself (not a copy): callers holding
        only a proxy fetch it once and then read it synchronously."""
        return self.backlog

    # -- writing -------------------------------------------------------------------

    async def append(self, events: list[dict]) -> asyncio.Future[None]:
        """Write every event of one push, or none of them (raises SpoolError,
        SpoolFull when the cap would be passed), and answer a future that is done
        when the push may be acknowledged: ``await (await spool.append(events))``.
        The actor takes the next push while this one's sync runs, so pushes share
        syncs; see SpoolWriter.append."""
        if not events:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return await self.writer.append(events)

    async def finalize(self) -> bool:
        """Close the active file: rename it to ``.buf`` (drainable), or delete it
        when it holds no events. True when a file became drainable."""
        return await self.writer.finalize()

    # -- maintenance ---------------------------------------------------------------

    def pause(self) -> None:
        """Push maintenance on: the drain does nothing (no finalizing, no upload)."""
        self.paused = True

    async def resume(self) -> None:
        """Push maintenance off: finalize the active file and drain at once."""
        self.paused = False
        await self.finalize()
        self._wake.set()

    def kick(self) -> None:
        """Run the next drain cycle now."""
        self._wake.set()

    # -- draining --------------------------------------------------------------------

    async def recover(self) -> int:
        """Startup: set aside what older versions left in ``failed/``, finalize
        leftover ``.tmp`` files, then upload every ``.buf`` oldest first,
        stopping at the first failure (the drain goes on later). Returns the
        number of events uploaded. While paused (booting with maintenance on)
        nothing is uploaded: the drain does it on resume."""
        await self.quarantine.import_failed(self.failed_dir)
        await self.writer.finalize_leftovers()
        if not await self.registration.sync(self.paused) or self.paused:
            return 0
        uploaded = 0

        async def run() -> None:
            nonlocal uploaded
            async with self._drain_lock:
                for path in await asyncio.to_thread(list_buf_files, self.directory):
                    outcome, n = await self.uploader.drain_file(path)
                    uploaded += n
                    if outcome != "ok":
                        break
        try:
            await asyncio.wait_for(run(), self._recover_limit_s)
        except TimeoutError:
            logger.warning("spool: recovery stopped after {} s; the drain continues",
                           self._recover_limit_s)
        return uploaded

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
        self._note_backlog()
        # Registration first, also while paused (maintenance) and cooling down:
        # peers must see our backlog before any of them merges past it.
        if not await self.registration.sync(self.paused) or self.paused:
            return
        if self.health.cooling_down():
            return
        # Through the inbox: never interleaves with an append.
        await self._self.finalize()
        async with self._drain_lock:
            limit = self._files_per_cycle if self.health.db_healthy else 1
            for path in (await asyncio.to_thread(list_buf_files, self.directory))[:limit]:
                if self.paused:
                    return
                outcome, _ = await self.uploader.drain_file(path)
                if outcome not in ("ok", "quarantined", "gone"):
                    return

    # -- the quarantine (the operator's routes) ------------------------------------------

    async def quarantine_list(self) -> list[dict]:
        """Every entry, without its payload, oldest origin first."""
        return await self.quarantine.list()

    async def quarantine_get(self, ident: str) -> dict | None:
        return await self.quarantine.get(ident)

    async def quarantine_discard(self, ident: str) -> bool:
        return await self.quarantine.discard(ident)

    async def quarantine_replay(self, ident: str, overrides: Mapping[str, str]) -> dict:
        """Push one quarantined event now; see QuarantineDesk.replay."""
        return await self.quarantine.replay(ident, overrides)

    # -- figures -----------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """The spool's figures: ``GET /health`` → ``spool`` (with ``staging`` added by
        broker/service/drain.py) and the Prometheus ``queen_file_buffer_*`` families."""
        count, total = await asyncio.to_thread(dir_usage, self.failed_dir)
        files, writer, uploader = self.files, self.writer, self.uploader
        return {
            "pendingCount": max(0, files.pending),
            "pendingFiles": files.pending_files(),
            "pendingBytes": files.bytes,
            "maxBytes": writer.max_bytes,
            "rejectedFull": writer.rejected_full,
            "failedCount": writer.failed,
            "failedFiles": {"count": count, "totalBytes": total,
                            "totalMB": round(total / (1024 * 1024), 2)},
            "dbHealthy": self.health.db_healthy,
            "paused": self.paused,
            "healthy": writer.healthy,
            "backlogPartitions": self.backlog.partitions(),
            "replayedEvents": uploader.replayed_events,
            "quarantinedFiles": uploader.quarantined_files,
            "quarantinedEvents": self.quarantine.count,
            "registeredPartitions": len(self.registration.registered),
            # Durability (FILE_BUFFER_FSYNC): syncs served and failed, acknowledged events a
            # failed sync left exposed (interval mode only), and what the start found damaged.
            "fsync": writer.policy,
            "syncs": writer.syncs,
            "syncFailures": writer.sync_failures,
            "unsafeAcknowledged": writer.unsafe_acknowledged,
            "tornBytesCut": writer.recovered.torn_bytes,
            "damagedRecords": writer.recovered.damaged + uploader.damaged_records,
            "spoolId": self.spool_id,
        }


def _read_spool_id(directory: Path, owner: str) -> tuple[str, bool]:
    """This spool's name in queen.spool_backlog, kept in the directory, and whether it
    was made now: the rows describe these files, so a broker restarted on them
    (whatever its server id now) takes its old rows over instead of waiting for them.
    A new name is written durably (temporary file, fsync, rename, directory fsync)
    before it is used: a name lost in a crash would orphan the rows it registered."""
    path = directory / "spool-id"
    try:
        value = path.read_text().strip()
        if value:
            return value, False
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.error("spool: cannot read {}: {}", path, exc)
        return owner, False
    value = f"{owner}-{os.urandom(4).hex()}"
    try:
        tmp = path.with_suffix(".part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, (value + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(directory)
    except OSError as exc:
        logger.error("spool: cannot write {}: {}", path, exc)
    return value, True


def _log_recovery(directory: Path, found: Recovered, spool_id: str, fresh: bool) -> None:
    """One line on what a previous run left, when it left anything (blocking: start-up)."""
    if not found.files and not fresh:
        return
    if fresh and found.files:
        # Files without their name: rows a previous run registered under the lost name
        # hold their partitions until FILE_BUFFER_ORDER_WAIT_MS passes.
        logger.warning("spool: {} holds {} file(s) but no spool-id; it is now {} (rows "
                       "registered under the old name wait out FILE_BUFFER_ORDER_WAIT_MS)",
                       directory, found.files, spool_id)
    elif not found.files:
        logger.info("spool: new spool {} in {}", spool_id, directory)
        return
    loud = found.torn_files or found.damaged
    logger.log("WARNING" if loud else "INFO",
               "spool: recovered {} file(s), {} whole event(s){}; {} torn tail(s) cut ({} "
               "byte(s), never acknowledged); {} damaged record(s) to the quarantine; "
               "spool id {}", found.files, found.events,
               f" ({found.legacy_files} of an earlier format)" if found.legacy_files else "",
               found.torn_files, found.torn_bytes, found.damaged, spool_id)
