"""Store functions of the status and analytics routes (statements in
analytics_sql.py); each runs on one pooled connection."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.store import analytics_sql as a
from broker.store import ops_sql
from broker.store.db import Store


async def status(store: Store, *, minutes: int, since: dt.datetime, until: dt.datetime,
                 queue: str | None, namespace: str | None, task: str | None) -> dict[str, Any]:
    scoped = any(v is not None for v in (queue, namespace, task))
    async with store.connection() as conn:
        workers_series = await conn.fetch(a.WORKER_SERIES, minutes, since, until, None, None)
        system = await conn.fetch(a.SYSTEM_SERIES, minutes, since, until)
        queue_series = await conn.fetch(a.QUEUE_SERIES, minutes, since, until, queue)
        names = ({r["name"] for r in await conn.fetch(a.QUEUE_SCOPE_NAMES, queue, namespace,
                                                        task)} if scoped else None)
        queues = await conn.fetch(a.STATUS_QUEUES, queue, namespace, task)
        summary = await conn.fetchrow(a.SUMMARY)
        # the message figures of the filters' scope (the one definition of every
        # surface): from queen.stats once the stats job ran, counted live before
        ready = (await conn.fetchrow(ops_sql.STATS_STATE))["ready"]
        totals = await conn.fetchrow(ops_sql.MESSAGE_TOTALS_FROM_STATS if ready
                                     else ops_sql.MESSAGE_TOTALS_LIVE, queue, namespace, task)
        leases = await conn.fetchrow(ops_sql.LEASES, None, None, None)
        dlq = await conn.fetchrow(ops_sql.DLQ_SUMMARY, queue, namespace, task, since, until)
        top_errors = await conn.fetch(ops_sql.DLQ_TOP_ERRORS, queue, namespace, task, since,
                                      until)
        workers = await conn.fetch(a.WORKERS_RECENT, 2)
    return {"scoped": scoped, "names": names, "workerSeries": workers_series, "system": system,
            "queueSeries": queue_series, "queues": queues, "summary": summary,
            "totals": totals, "leases": leases, "dlq": dlq, "topErrors": top_errors,
            "workers": workers}


async def queue_ops(store: Store, minutes: int, since, until, queue):
    async with store.connection() as conn:
        return await conn.fetch(a.QUEUE_SERIES, minutes, since, until, queue)


async def worker_metrics(store: Store, minutes: int, since, until, hostname, pid):
    async with store.connection() as conn:
        series = await conn.fetch(a.WORKER_SERIES, minutes, since, until, hostname, pid)
        workers = await conn.fetch(a.WORKERS_RECENT, 5)
        queues = await conn.fetch(a.QUEUE_LAG_TOTALS, since, until)
        summary = await conn.fetchrow(a.SUMMARY)
    return {"series": series, "workers": workers, "queues": queues, "summary": summary}


async def _rows(store: Store, statement: str, *params: Any) -> list:
    """One read-only statement of analytics_sql."""
    async with store.connection() as conn:
        return await conn.fetch(statement, *params)


async def retention_series(store: Store, minutes: int, since: dt.datetime, until: dt.datetime,
                           queue: str | None) -> list:
    return await _rows(store, a.RETENTION_SERIES, minutes, since, until, queue)


async def queue_lag_rows(store: Store, since: dt.datetime, until: dt.datetime,
                         queue: str | None) -> list:
    return await _rows(store, a.QUEUE_LAG_ROWS, since, until, queue)


async def parked_replicas(store: Store, minutes: int, since: dt.datetime, until: dt.datetime,
                          queue: str | None) -> list:
    return await _rows(store, a.PARKED_REPLICAS, minutes, since, until, queue)


async def system_rows(store: Store, since: dt.datetime, until: dt.datetime,
                      hostname: str | None, worker_id: str | None) -> list:
    return await _rows(store, a.SYSTEM_ROWS, since, until, hostname, worker_id)


async def overview_rates(store: Store) -> tuple[Any, float]:
    async with store.connection() as conn:
        recent = await conn.fetchrow(a.RECENT_W)
        max_lag = await conn.fetchval(a.RECENT_MAX_LAG)
    return recent, max_lag


async def postgres_stats(store: Store) -> dict[str, Any]:
    async with store.connection() as conn:
        out: dict[str, Any] = {
            "database": await conn.fetchval("SELECT current_database()"),
            "databaseCache": await conn.fetchrow(a.PG_DATABASE_CACHE),
            "tableCache": await conn.fetch(a.PG_TABLE_CACHE),
            "indexCache": await conn.fetch(a.PG_INDEX_CACHE),
            "deadTuples": await conn.fetch(a.PG_DEAD_TUPLES),
            "hotUpdates": await conn.fetch(a.PG_HOT_UPDATES),
            "activeQueries": await conn.fetch(a.PG_ACTIVE_QUERIES),
            "autovacuum": await conn.fetch(a.PG_AUTOVACUUM),
            "bufferConfig": await conn.fetchrow(a.PG_BUFFER_CONFIG),
            "tableSizes": await conn.fetch(a.PG_TABLE_SIZES),
            "bufferUsage": [],
        }
        if await conn.fetchval(a.PG_HAS_BUFFERCACHE):
            out["bufferUsage"] = await conn.fetch(a.PG_BUFFER_USAGE)
    return out
