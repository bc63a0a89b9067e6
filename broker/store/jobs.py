"""Store side of the background jobs (actors/leader_jobs.py, docs/behaviour.md §7): the
connections, the advisory locks and every statement they run (SQL in jobs_sql.py).

* :func:`retention_lock`: one dedicated pooled connection holding the **session** advisory
  lock 737001 for one retention cycle, and the sweep's statements on it
  (:class:`RetentionSession`), each autocommitting. At the end the lock is released with
  ``pg_advisory_unlock`` on that same connection, before the connection goes back to the
  pool. A connection that may still hold the lock (the unlock failed or did not answer,
  the try-lock did not answer) is terminated instead, never handed back: its session
  ends, and PostgreSQL releases the lock with it. A connection found closed (its session
  already ended, and asyncpg already took its pool slot back) is neither unlocked nor
  released: there is nothing left to do on it.
* :func:`refresh_stats`: one stats cycle, one transaction under the **transaction**
  advisory lock 737002 (the COMMIT releases it).
* :func:`write_metrics`: the collector's flush, one transaction.

Errors map like every other store call (broker/store/errors.py): an unreachable database is
:class:`~broker.store.errors.StoreUnavailable`, a lock or statement timeout
:class:`~broker.store.errors.StoreBusy`, any other refusal :class:`~broker.store.errors.StoreError`.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from loguru import logger

from broker.store import jobs_sql as sql
from broker.store import spools
from broker.store.db import Store
from broker.store.errors import StoreUnavailable, mapped_errors

RETENTION_LOCK_ID = sql.RETENTION_LOCK_ID
STATS_LOCK_ID = sql.STATS_LOCK_ID

UNLOCK_TIMEOUT_S = 5.0
"""Longest wait for ``pg_advisory_unlock``; past it the connection is terminated."""

RETENTION_KINDS = ("retention", "completed_retention", "max_wait_time_eviction")
"""The message steps of a retention cycle, in order (their retention_history type)."""

_MESSAGE_STEPS = {
    "retention": sql.RETENTION_DELETE_EXPIRED,
    "completed_retention": sql.RETENTION_DELETE_COMPLETED,
    "max_wait_time_eviction": sql.RETENTION_EVICT_MAX_WAIT,
}

INACTIVE_PARTITIONS_PER_CYCLE = sql.INACTIVE_PARTITIONS_PER_CYCLE

_METRICS_PURGES = dict(sql.METRICS_PURGES)
METRICS_TABLES = tuple(_METRICS_PURGES)
"""The metrics purge step's tables, in order (METRICS_RETENTION_DAYS)."""


# ---------------------------------------------------------------------------
# Retention: the session lock 737001 on one dedicated connection
# ---------------------------------------------------------------------------

@dataclass
class SessionLockCounters:
    """How the lock's cycles ended, since start (the job's figures)."""
    unlock_not_held: int = 0        # pg_advisory_unlock answered false
    connections_discarded: int = 0  # the unlock failed: the connection was terminated
    sessions_lost: int = 0          # the connection was closed under the cycle: nothing to unlock


class RetentionSession:
    """The retention sweep's statements on the connection that holds lock 737001. Each is
    an autocommitting statement; the repeated DELETEs remove at most ``batch`` rows each,
    and are run until one deletes fewer."""

    def __init__(self, conn: asyncpg.Connection, batch: int) -> None:
        self._conn = conn
        self._batch = batch

    async def delete_messages(self, kind: str) -> Counter:
        """One message step (a name of RETENTION_KINDS): messages deleted per partition id."""
        statement = _MESSAGE_STEPS[kind]
        per_partition: Counter = Counter()
        while True:
            rows = await self._conn.fetch(statement, self._batch)
            n = 0
            for r in rows:
                per_partition[r["partition_id"]] += r["deleted"]
                n += r["deleted"]
            if n < self._batch:
                return per_partition

    async def record_history(self, kind: str, per_partition: Counter) -> None:
        """One queen.retention_history row per partition that lost rows (none: nothing)."""
        if not per_partition:
            return
        ids = list(per_partition)
        await self._conn.execute(sql.RETENTION_HISTORY_INSERT, ids,
                                 [per_partition[i] for i in ids], kind)

    async def delete_inactive_partitions(self, days: int) -> int:
        """Partitions idle for ``days`` dropped (at most INACTIVE_PARTITIONS_PER_CYCLE)."""
        return int(await self._conn.fetchval(sql.RETENTION_DELETE_INACTIVE_PARTITIONS, days,
                                             sql.INACTIVE_PARTITIONS_PER_CYCLE))

    async def purge_metrics(self, table: str, days: int) -> int:
        """Rows of ``table`` (one of METRICS_TABLES) older than ``days`` deleted."""
        return await self._purge(_METRICS_PURGES[table], days)

    async def purge_dead_kv(self) -> int:
        """Dead key/value rows deleted."""
        return await self._purge(sql.KV_PURGE_DEAD)

    async def forget_silent_spools(self, forget_ms: int) -> list[tuple[str, int]]:
        """The rows of spools holding partitions and silent for ``forget_ms`` removed:
        (spool id, partitions it held) per spool (broker/store/spools_sql.py)."""
        return [(r["server_id"], int(r["partitions"]))
                for r in await spools.forget_silent(self._conn, forget_ms)]

    async def _purge(self, statement: str, *args: Any) -> int:
        """A DELETE of at most ``batch`` rows (its last argument) until it deletes fewer."""
        total = 0
        while True:
            status = await self._conn.execute(statement, *args, self._batch)
            n = int(status.split()[-1])
            total += n
            if n < self._batch:
                return total


@contextlib.asynccontextmanager
async def retention_lock(store: Store, *, batch: int, acquire_timeout_s: float,
                         counters: SessionLockCounters,
                         unlock_timeout_s: float = UNLOCK_TIMEOUT_S,
                         ) -> AsyncIterator[RetentionSession | None]:
    """A dedicated pooled connection with ``pg_try_advisory_lock(737001)`` taken on it:
    the sweep's session, or None when another session holds the lock (skip the cycle).
    On every exit path (an error, a cancellation included) the lock is released on this
    connection before it is released to the pool, or the connection is terminated."""
    async with session_lock(store, RETENTION_LOCK_ID, acquire_timeout_s=acquire_timeout_s,
                            counters=counters, unlock_timeout_s=unlock_timeout_s,
                            label="retention") as conn:
        yield None if conn is None else RetentionSession(conn, batch)


@contextlib.asynccontextmanager
async def session_lock(store: Store, lock_id: int, *, acquire_timeout_s: float,
                       counters: SessionLockCounters, label: str,
                       unlock_timeout_s: float = UNLOCK_TIMEOUT_S,
                       ) -> AsyncIterator[asyncpg.Connection | None]:
    """The connection holding session advisory lock ``lock_id``, or None when it is taken
    elsewhere. Store-internal: the connection never leaves broker/store."""
    try:
        with mapped_errors():
            conn = await store.pool.acquire(timeout=acquire_timeout_s)
            held: bool | None = None  # None: the try-lock did not answer
            try:
                held = bool(await conn.fetchval(sql.TRY_SESSION_LOCK, lock_id))
                yield conn if held else None
            finally:
                await _give_back(store, conn, held, lock_id, label, counters, unlock_timeout_s)
    except StoreUnavailable as exc:
        store.health.failed(exc)
        raise
    store.health.succeeded()


async def _give_back(store: Store, conn: asyncpg.Connection, held: bool | None, lock_id: int,
                     label: str, counters: SessionLockCounters, unlock_timeout_s: float) -> None:
    """Unlock on the connection that holds the lock, then release it to the pool; a
    connection that may still hold the lock is terminated instead (its session's end
    releases the lock); a connection already closed is left as asyncpg left it."""
    if held is None:
        # pg_try_advisory_lock did not answer: it may have been granted.
        _terminate(conn)
        return
    if _closed(conn):
        # The session ended under the cycle (database restart, network, a cancelled
        # statement whose cancel request failed) and PostgreSQL released its locks with
        # it; asyncpg has already taken the pool slot back (the connection object is
        # detached), so it is neither unlocked nor released here.
        if held:
            counters.sessions_lost += 1
            logger.info("{}: the connection holding advisory lock {} was closed during the "
                        "cycle; its session ended and the lock with it", label, lock_id)
        _terminate(conn)  # finishes asyncpg's clean-up when the transport closed without it
        return
    if held:
        try:
            released = await asyncio.wait_for(conn.fetchval(sql.SESSION_UNLOCK, lock_id),
                                               unlock_timeout_s)
        except BaseException as exc:  # cancellation included
            counters.connections_discarded += 1
            logger.warning("{}: pg_advisory_unlock({}) failed ({}: {}); terminating the "
                           "connection", label, lock_id, type(exc).__name__, exc)
            _terminate(conn)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not released:
            counters.unlock_not_held += 1
            logger.warning("{}: pg_advisory_unlock({}) reported the lock was not held by this "
                           "session", label, lock_id)
    try:
        await store.pool.release(conn)
    except Exception as exc:
        logger.warning("{}: could not return the connection ({}); terminating it", label, exc)
        _terminate(conn)


def _closed(conn: asyncpg.Connection) -> bool:
    """True when the connection's session is over: closed, or a pool proxy that asyncpg
    detached when its connection closed (every call on it then raises InterfaceError)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.exceptions.InterfaceError:
        return True


def _terminate(conn: asyncpg.Connection) -> None:
    """Close the session at once (PostgreSQL releases its session locks with it). asyncpg
    hands the pool slot back by itself; the connection is never released to the pool."""
    try:
        conn.terminate()
    except Exception:
        pass  # already gone


# ---------------------------------------------------------------------------
# Stats: the transaction lock 737002
# ---------------------------------------------------------------------------

class _LockBusy(Exception):
    """The stats lock is held by another session: roll back and skip."""


@dataclass(frozen=True)
class StatsCycle:
    """What one stats cycle did. ``outcome``: ``ran``; ``busy`` (737002 held elsewhere,
    nothing done); ``fresh`` (another replica finished a cycle moments ago, nothing done)."""
    outcome: str
    recounted: int = 0
    dirty_marks: int = 0
    orphans_removed: int = 0
    rows_written: int = 0


async def refresh_stats(store: Store, *, full: bool,
                        fresh_within_s: float | None = None) -> StatsCycle:
    """One stats cycle (jobs_sql.py, docs/behaviour.md §7.2) in one transaction, under
    ``pg_try_advisory_xact_lock(737002)``; the COMMIT releases the lock. With
    ``fresh_within_s`` the cycle does nothing when some replica finished one that
    recently (the lock only keeps two cycles from overlapping)."""
    try:
        async with store.connection() as conn:
            async with conn.transaction():
                if not await conn.fetchval(sql.TRY_XACT_LOCK, STATS_LOCK_ID):
                    raise _LockBusy
                if fresh_within_s is not None and await conn.fetchval(sql.STATS_FRESH,
                                                                      fresh_within_s):
                    return StatsCycle("fresh")
                parts = await conn.fetchrow(sql.STATS_REFRESH_PARTITIONS, full)
                await conn.execute(sql.STATS_REFRESH_PARTITION_LAG)
                orphans = await conn.execute(sql.STATS_DELETE_ORPHAN_PARTITIONS)
                queues = await conn.fetchrow(sql.STATS_ROLLUP_QUEUES)
                namespaces = await conn.fetchrow(sql.STATS_ROLLUP_NAMESPACES)
                tasks = await conn.fetchrow(sql.STATS_ROLLUP_TASKS)
                await conn.fetchval(sql.STATS_ROLLUP_SYSTEM)
                await conn.execute(sql.PARTITION_COUNT_SNAPSHOT)
    except _LockBusy:
        return StatsCycle("busy")
    return StatsCycle(
        "ran", recounted=parts["recounted"], dirty_marks=parts["dirty_marks"],
        orphans_removed=int(orphans.split()[-1]) + queues["removed"] + namespaces["removed"]
        + tasks["removed"],
        rows_written=queues["written"] + namespaces["written"] + tasks["written"])


# ---------------------------------------------------------------------------
# Metrics collector (ungated)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MinuteRows:
    """This replica's rows of one minute: system_metrics (``samples``, ``system``),
    worker_metrics (``counters`` added, ``gauges`` replaced) and queue_metrics
    (``queue_columns``: UPSERT_QUEUE_METRICS' arrays, the first one the queue names)."""
    at: dt.datetime
    samples: int
    system: dict
    counters: dict
    gauges: dict
    queue_columns: Sequence[list]


async def write_metrics(store: Store, *, hostname: str, port: int, worker_id: str, pid: int,
                        minutes: Sequence[MinuteRows], summary: dict) -> None:
    """One flush in one transaction: all rows or none, so counter deltas never count
    twice; ``summary`` (counter deltas) is added to the lifetime totals when not empty."""
    async with store.connection() as conn:
        async with conn.transaction():
            for m in minutes:
                await conn.execute(sql.UPSERT_SYSTEM_METRICS, m.at, hostname, port, worker_id,
                                   m.samples, m.system)
                await conn.execute(sql.UPSERT_WORKER_METRICS, m.at, hostname, worker_id, pid,
                                   m.counters, m.gauges)
                if m.queue_columns and m.queue_columns[0]:
                    await conn.execute(sql.UPSERT_QUEUE_METRICS, m.at, hostname, worker_id,
                                       pid, *m.queue_columns)
            if summary:
                await conn.execute(sql.UPSERT_METRICS_SUMMARY, summary)
