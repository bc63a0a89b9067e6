"""Store functions of the cluster's spool holds (the statements of
:mod:`broker.store.spools_sql`): list them, release one spool's, remove those of spools silent
for long. docs/behaviour.md §5.8."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.store import spools_sql as q
from broker.store.db import Store

Record = Any  # asyncpg.Record rows

STAGED = q.STAGED


async def holds(store: Store, wait_ms: int) -> list[Record]:
    """One row per spool holding partitions (see ``spools_sql.SPOOL_HOLDS``)."""
    async with store.connection() as conn:
        return list(await conn.fetch(q.SPOOL_HOLDS, wait_ms))


@dataclass(frozen=True)
class Release:
    """What a release found: ``verdict`` is ``released``, ``fresh`` (its heartbeat is within
    the wait and the release was not forced: nothing was deleted) or ``unknown`` (no row
    names the spool)."""
    verdict: str
    partitions: int
    last_heartbeat: dt.datetime | None


async def release(store: Store, spool_id: str, wait_ms: int, force: bool) -> Release:
    """Delete ``spool_id``'s rows of queen.spool_backlog and queen.spool_servers in one
    transaction, unless it beat within ``wait_ms`` and ``force`` is false."""
    async with store.connection() as conn:
        async with conn.transaction():
            beat = await conn.fetchrow(q.SPOOL_HEARTBEAT_FOR_RELEASE, spool_id, wait_ms)
            seen = beat["seen_at"] if beat is not None else None
            if beat is not None and beat["fresh"] and not force:
                held = await conn.fetchval(q.SPOOL_HELD_COUNT, spool_id)
                return Release("fresh", int(held), seen)
            status = await conn.execute(q.SPOOL_RELEASE_BACKLOG, spool_id)
            deleted = int(status.split()[-1])
            if beat is not None:
                await conn.execute(q.SPOOL_RELEASE_SERVER, spool_id)
    if beat is None and deleted == 0:
        return Release("unknown", 0, None)
    return Release("released", deleted, seen)


async def forget_silent(conn: asyncpg.Connection, forget_ms: int) -> list[Record]:
    """On ``conn`` (the retention job's session): remove the rows of spools holding
    partitions and silent for ``forget_ms``; one row per spool (server_id, partitions)."""
    return list(await conn.fetch(q.SPOOLS_FORGET, forget_ms))
