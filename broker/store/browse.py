"""Store functions of the paged browsing routes (broker/http/routes/ops/browse.py) and of the
depth history (actors/live_series.py): one pooled connection each, the statements of
:mod:`broker.store.browse_sql`, errors mapped like every other store call."""
from __future__ import annotations

from asyncpg import Record  # asyncpg has no type information: Record is Any

from broker.store import browse_sql as b
from broker.store import ops_sql, sql
from broker.store.db import Store
from broker.store.ops import stats_state, subscription_for


def _count(rows: list[Record]) -> int | None:
    """The full_count the rows carry (None when the page is empty)."""
    return rows[0]["full_count"] if rows else None


async def queues_page(store: Store, search: str | None, limit: int, offset: int
                      ) -> tuple[list[Record], int, float | None]:
    """A page of queues, how many match, and the age of queen.stats (s, None = never run)."""
    async with store.connection() as conn:
        rows = await conn.fetch(b.QUEUES_PAGE, search, limit, offset)
        total = _count(rows)
        if total is None:
            total = await conn.fetchval(b.QUEUES_MATCHING, search)
        age, _ready = await stats_state(conn)
    return rows, total, age


async def queue_header(store: Store, queue: str) -> Record | None:
    """The queue's row (options included), or None."""
    async with store.connection() as conn:
        return await conn.fetchrow(sql.QUEUE_BY_NAME, queue)


async def partitions_page(store: Store, queue: str, search: str | None, limit: int,
                          offset: int) -> tuple[list[Record], int]:
    async with store.connection() as conn:
        rows = await conn.fetch(b.PARTITIONS_PAGE, search, limit, offset, queue)
        total = _count(rows)
        if total is None:
            total = await conn.fetchval(b.PARTITIONS_MATCHING, search, queue)
    return rows, total


async def groups_page(store: Store, search: str | None, limit: int, offset: int
                      ) -> tuple[list[Record], int]:
    async with store.connection() as conn:
        rows = await conn.fetch(b.GROUPS_PAGE, search, limit, offset)
    return rows, _count(rows) or 0


async def group_lag_page(store: Store, group: str, queue: str, limit: int, offset: int
                         ) -> tuple[list[Record], int, Record | None]:
    """Group ``group``'s cursors on ``queue`` (falling behind first), how many, and the
    stored subscription that applies to the pair (None: none stored)."""
    async with store.connection() as conn:
        rows = await conn.fetch(b.GROUP_LAG_PAGE, group, queue, None, limit, offset)
        subs = await conn.fetch(ops_sql.SUBSCRIPTIONS, group)
        header = await conn.fetchrow(sql.QUEUE_BY_NAME, queue)
    sub = None
    if header is not None:
        sub = subscription_for(subs, group, queue, header["namespace"], header["task"])
    return rows, _count(rows) or 0, sub


async def depths(store: Store) -> dict[str, int]:
    """Every queue's pending figure from queen.stats."""
    async with store.connection() as conn:
        return {r["queue"]: r["pending"] for r in await conn.fetch(b.DEPTHS)}


async def partition_messages(store: Store, queue: str, partition: str, from_position: int,
                             since, limit: int) -> list[Record]:
    async with store.connection() as conn:
        return await conn.fetch(b.PARTITION_MESSAGES, queue, partition, from_position, since,
                                limit)
