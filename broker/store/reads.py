"""Offset reads and partition discovery: one round trip per request (plus the safe
time of a discovery page, read first on the same connection)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import asyncpg

from broker.store import reads_sql as sql
from broker.store.db import Store


async def fetch(store: Store, queues: Sequence[str], partitions: Sequence[str],
                offsets: Sequence[int], budgets: Sequence[int], call_budget: int,
                max_records: int) -> list[asyncpg.Record]:
    """Rows of queen.fetch_v1: per entry a header row (``seq`` NULL), then its records."""
    async with store.connection() as conn:
        return await conn.fetch(sql.FETCH, list(queues), list(partitions), list(offsets),
                                list(budgets), call_budget, max_records)


async def changed(store: Store, queue: str, since: dt.datetime | None,
                  after: tuple[dt.datetime, str] | None, limit: int
                  ) -> tuple[Any, list[asyncpg.Record] | None]:
    """(safe time, page of partitions); the page is None when the queue does not exist."""
    async with store.connection() as conn:
        safe = await conn.fetchval(sql.SAFE_TIME)
        queue_id = await conn.fetchval(sql.QUEUE_ID, queue)
        if queue_id is None:
            return safe, None
        rows = await conn.fetch(sql.CHANGED_PARTITIONS, queue_id, since,
                                after[0] if after else None, after[1] if after else None,
                                limit)
    return safe, rows
