"""The queue-config cache, the maintenance flags, and the loop that keeps both
converging on PostgreSQL (docs/behaviour.md §6).

Only the per-queue **encryption flag** is cached: the push path needs it
before it writes. The lease time is read by the pop statement itself from
``queen.queues``, so it can never be stale and needs no cache.

The cache and the flags are plain objects that handlers read directly (one
event loop, no locks needed); the :class:`CacheReconciler` actor owns their
lifecycle: it clears the cache and re-reads both maintenance flags from
``queen.system_state`` every ``QUEEN_CACHE_REFRESH_INTERVAL_MS``, on a single
broker too, so a lost invalidation or flip heals within one interval.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from actors.runtime import AsyncioActor
from broker.store.health import outage_level

FIRST_RECONCILE_DELAY_S = 5.0


class QueueConfigCache:
    """Queue name -> encryption flag, read lazily, forgotten on invalidation."""

    def __init__(self, load: Callable[[list[str]], Awaitable[dict[str, bool]]]):
        self._load = load
        self._flags: dict[str, bool] = {}
        # Subscriptions this broker already stored (they never change once stored),
        # so a consumer sending subscriptionMode on every pop costs one insert, not one
        # per pop. Cleared with the rest: a group deleted elsewhere is re-stored.
        self.subscriptions_stored: set[tuple] = set()
        # (queue, group) -> whether the group conflates there (queen.group_policies): stored
        # once, changed only by deleting the group, which clears it here (and the periodic
        # clear heals the other brokers).
        self.group_policies: dict[tuple[str, str], bool] = {}
        # Queues an empty pop found in queen.queues: a later empty pop of one answers without
        # asking again. Positive only, and dropped with the rest (a deleted queue is forgotten
        # here at once, and on the other brokers at the periodic clear).
        self.queues_seen: set[str] = set()
        self.hits = 0
        self.misses = 0

    async def encryption_flags(self, queues: Iterable[str]) -> dict[str, bool]:
        wanted = set(queues)
        missing = [q for q in wanted if q not in self._flags]
        self.hits += len(wanted) - len(missing)
        if missing:
            self.misses += len(missing)
            found = await self._load(missing)
            for q in missing:
                # an unknown queue is created unencrypted by the push itself
                self._flags[q] = found.get(q, False)
        return {q: self._flags[q] for q in wanted}

    def forget(self, queue: str) -> None:
        self._flags.pop(queue, None)
        self.queues_seen.discard(queue)

    def clear(self) -> None:
        self._flags.clear()
        self.subscriptions_stored.clear()
        self.group_policies.clear()
        self.queues_seen.clear()

    def stats(self) -> dict[str, Any]:
        total = self.hits + self.misses
        return {"size": len(self._flags), "hits": self.hits, "misses": self.misses,
                "hit_rate": round(self.hits / total, 4) if total else 0.0}


@dataclass
class MaintenanceFlags:
    """In-memory mirror of queen.system_state's two flags (the database is the truth)."""
    push: bool = False
    pop: bool = False
    listeners: list[Callable[[str, bool], None]] = field(default_factory=list)

    def set(self, which: str, enabled: bool, source: str) -> bool:
        """Set a flag; returns True when it changed (and tells the listeners)."""
        if getattr(self, which) == enabled:
            return False
        setattr(self, which, enabled)
        name = "maintenance" if which == "push" else "pop maintenance"
        logger.info("{} mode {} ({})", name, "ON" if enabled else "OFF", source)
        for listener in self.listeners:
            try:
                listener(which, enabled)
            except Exception:  # a listener's bug must not stop the flip
                logger.exception("maintenance listener failed")
        return True


class CacheReconciler(AsyncioActor):
    """Every ``interval_ms`` (first run 5 s after start): re-read both flags,
    clear the cache. Errors are logged; flags then keep their old values."""

    def __init__(self, cache: QueueConfigCache, flags: MaintenanceFlags,
                 read_flags: Callable[[], Awaitable[dict[str, bool]]], interval_ms: int,
                 first_delay_s: float = FIRST_RECONCILE_DELAY_S):
        super().__init__()
        self.cache = cache
        self.flags = flags
        self._read_flags = read_flags
        self._interval = interval_ms / 1000
        self._first_delay = first_delay_s
        self._task: asyncio.Task | None = None
        self.cycles = 0
        self.failures = 0

    def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="reconcile")

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        await asyncio.sleep(self._first_delay)
        while True:
            # Through the inbox, so a reconcile never interleaves with other messages.
            await self.actor_ref.proxy().reconcile()
            await asyncio.sleep(self._interval)

    async def reconcile(self) -> bool:
        """One cycle; True when the flags could be read."""
        self.cycles += 1
        self.cache.clear()
        try:
            state = await self._read_flags()
        except Exception as exc:
            self.failures += 1
            logger.log(outage_level(exc), "reconcile: could not read queen.system_state ({}); "
                       "keeping flags", exc)
            return False
        self.flags.set("push", state.get("maintenance_mode", False), "reconcile")
        self.flags.set("pop", state.get("pop_maintenance_mode", False), "reconcile")
        return True

    def stats(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "failures": self.failures,
                "queue_config_cache": self.cache.stats()}
