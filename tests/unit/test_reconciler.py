"""The cache reconciler through its messages: a reconcile clears the queue-config
cache and makes the in-memory maintenance flags follow the database; an
unreadable database keeps the flags as they were."""
from __future__ import annotations

from actors.reconciler import CacheReconciler, MaintenanceFlags, QueueConfigCache


async def test_reconcile_clears_the_cache_and_follows_the_database():
    loads = []

    async def load(queues):
        loads.append(sorted(queues))
        return {q: True for q in queues}

    state = {"maintenance_mode": True, "pop_maintenance_mode": False}

    async def read_flags():
        return dict(state)

    cache, flags = QueueConfigCache(load), MaintenanceFlags()
    flips = []
    flags.listeners.append(lambda which, enabled: flips.append((which, enabled)))
    ref = CacheReconciler.start(cache, flags, read_flags, interval_ms=60_000, first_delay_s=3600)
    try:
        assert await cache.encryption_flags(["q"]) == {"q": True}
        await cache.encryption_flags(["q"])
        assert loads == [["q"]]  # the second read was a hit

        assert await ref.proxy().reconcile() is True
        assert (flags.push, flags.pop) == (True, False) and flips == [("push", True)]
        await cache.encryption_flags(["q"])
        assert loads == [["q"], ["q"]]  # cleared: read again from the database

        state["maintenance_mode"] = False
        await ref.proxy().reconcile()
        assert flags.push is False and flips[-1] == ("push", False)
    finally:
        await ref.stop(block=False)


async def test_an_unreachable_database_keeps_the_flags():
    async def load(queues):
        return {}

    async def read_flags():
        raise ConnectionRefusedError("database down")

    flags = MaintenanceFlags(push=True, pop=True)
    ref = CacheReconciler.start(QueueConfigCache(load), flags, read_flags, interval_ms=60_000,
                                first_delay_s=3600)
    try:
        assert await ref.proxy().reconcile() is False
        assert (flags.push, flags.pop) == (True, True)
        assert (await ref.proxy().stats())["failures"] == 1
    finally:
        await ref.stop(block=False)
