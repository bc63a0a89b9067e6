"""Store functions of the operator views of key/value, locks and timers (the statements
of :mod:`broker.store.state_ops_sql`, each call on one pooled connection)."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.store import state_ops_sql as q
from broker.store.db import Store

Record = Any  # asyncpg.Record rows


async def kv_namespaces(store: Store) -> list[Record]:
    async with store.connection() as conn:
        return list(await conn.fetch(q.KV_NAMESPACES))


async def kv_list(store: Store, namespace: str, prefix: str, after: str | None, limit: int,
                  include_expired: bool, keys_only: bool) -> tuple[list[Record], dt.datetime]:
    """Up to ``limit`` + 1 rows (the extra one says whether the page is the last), and
    the database's clock the page was read against."""
    async with store.connection() as conn:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            rows = await conn.fetch(q.KV_LIST, namespace, prefix, after, include_expired,
                                    keys_only, limit + 1)
            now = await conn.fetchval(q.DB_NOW)
    return list(rows), now


async def locks_page(store: Store, prefix: str, after: str | None, limit: int
                     ) -> tuple[list[Record], Record]:
    """One row per live permit of up to ``limit`` + 1 held locks, and the cluster-wide
    counts, read in one snapshot."""
    async with store.connection() as conn:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            rows = await conn.fetch(q.LOCKS_PAGE, prefix, after, limit + 1)
            summary = await conn.fetchrow(q.LOCKS_SUMMARY)
    return list(rows), summary


async def timers_by_queue(store: Store) -> tuple[list[Record], dt.datetime]:
    async with store.connection() as conn:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            rows = await conn.fetch(q.TIMERS_BY_QUEUE)
            now = await conn.fetchval(q.DB_NOW)
    return list(rows), now


async def metric_figures(store: Store) -> dict:
    """What /metrics and /metrics/prometheus show of the state surfaces, in one snapshot."""
    async with store.connection() as conn:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            namespaces = await conn.fetch(q.KV_NAMESPACES)
            locks = await conn.fetchrow(q.LOCKS_SUMMARY)
            timers = await conn.fetch(q.TIMERS_BY_QUEUE)
    return {"kv": list(namespaces), "locks": locks, "timers": list(timers)}
