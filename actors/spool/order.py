"""The cluster-wide order: this spool's rows in ``queen.spool_backlog``
(docs/behaviour.md §5.8, docs/spool-drain.md).

Per (queue, partition) it holds pushes for, a spool registers the accept time of
its oldest one; a staged push is merged only once no live spool registered an
older one for its partition. Every drain cycle syncs the rows first (also while
paused, so peers see this backlog before any of them merges past it), or beats
when nothing changed. An upload replaces the rows in its own transaction
(:meth:`Registration.uploaded` records what it left), and a clean stop leaves
exactly what is still on disk (:meth:`Registration.last`).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from loguru import logger

from actors.spool.files import SpoolFiles
from actors.spool.health import DrainHealth
from actors.spool.records import Pair
from broker.store.health import outage_level

__all__ = ["REGISTRATION_SYNC_S", "STOP_REGISTRATION_S", "Register", "Registration"]

REGISTRATION_SYNC_S = 0.5  # how often a draining spool syncs its queen.spool_backlog rows
STOP_REGISTRATION_S = 2.0  # at most this long for the last registration at a clean stop

# Replace this spool's rows by the map, or (None) only beat: we are alive, wait for us.
Register = Callable[[Mapping[Pair, int] | None], Awaitable[None]]


class Registration:
    def __init__(self, register: Register | None, files: SpoolFiles,
                 health: DrainHealth) -> None:
        self._register = register
        self._files = files
        self._health = health
        self.registered: dict[Pair, int] = {}  # what PostgreSQL lists for us
        # PostgreSQL may list more than we think: rows a crash left behind
        self.dirty = register is not None
        self.ok = False  # the last registration reached PostgreSQL
        self._next_sync = 0.0  # loop time of the next sync while draining

    def uploaded(self, oldest: dict[Pair, int]) -> None:
        """An upload committed ``oldest`` as this spool's rows; the floors it
        holds the uploaded file's partitions by go at the next cycle."""
        self.registered, self.dirty = oldest, False
        self._next_sync = 0.0

    async def sync(self, paused: bool) -> bool:
        """Tell PostgreSQL which partitions this spool holds pushes for, and
        the accept time of the oldest one each, or beat when nothing changed.
        False when PostgreSQL cannot be reached. The first success after a
        failure (and at boot) ends any cooldown; PostgreSQL's settle period
        (FILE_BUFFER_SETTLE_MS) makes sure every peer back from the same outage
        registered before the merge begins."""
        if self._register is None:
            return True
        now = asyncio.get_running_loop().time()
        if self.ok and not self.dirty and not paused and now < self._next_sync:
            # While PostgreSQL takes writes and the drain runs, a push enters this
            # spool only behind its own backlog (a partition it already holds: the
            # push service's rule), and uploads move our rows on: a sync (and beat)
            # every REGISTRATION_SYNC_S is enough, not one per 10 ms retry.
            return True
        self._next_sync = now + REGISTRATION_SYNC_S
        want = self._files.oldest_map()
        if not want and not self.registered and not self.dirty:
            return True
        try:
            if want != self.registered or self.dirty:
                await self._register(want)
                self.registered, self.dirty = want, False
            else:
                await self._register(None)  # heartbeat: we are alive, wait for us
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.ok or self._health.db_healthy:
                logger.log(outage_level(exc), "spool: cannot register the spool backlog ({}); "
                           "will retry", exc)
            self.ok = False
            self._health.db_healthy = False
            return False
        if not self.ok:
            self.ok = True
            self._health.reachable_again()
            if want:
                # DEBUG: the database's "reachable again" line says the spool replays now.
                logger.debug("spool: backlog of {} partition(s) registered; uploading",
                            len(want))
        return True

    async def last(self) -> None:
        """At a clean stop, leave PostgreSQL exactly what is still on disk: an
        upload's floor rows (see Uploader.drain_file) would otherwise hold their
        partitions until this spool is taken for dead (FILE_BUFFER_ORDER_WAIT_MS)."""
        if self._register is None or not self.registered:
            return
        want = self._files.oldest_map()
        if want == self.registered:
            return
        try:
            await asyncio.wait_for(self._register(want), STOP_REGISTRATION_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database is away: the rows age out
            logger.info("spool: could not update the spool backlog at stop ({})", exc)
