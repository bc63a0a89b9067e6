"""Store functions of the operator routes (docs/wire-contract.md §10.4–§10.7, §11, §13,
§14, §15).

Each takes the :class:`~broker.store.db.Store` and runs the statements of
:mod:`broker.store.ops_sql` on one pooled connection; errors map like every
other store call (StoreUnavailable → 503, StoreInvalidValue → 400).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

import asyncpg
from asyncpg import Record  # asyncpg has no type information: Record is Any

from broker.core.domain import QUEUE_MODE
from broker.store import ops_sql as q
from broker.store import sql, streams_sql
from broker.store.db import Store

# -- stats table ----------------------------------------------------------------

async def stats_state(conn: asyncpg.Connection) -> tuple[float | None, bool]:
    """(statsAge in seconds or None, whether the stats job has produced its roll-up)."""
    row = await conn.fetchrow(q.STATS_STATE)
    return row["age"], row["ready"]


# -- resources ----------------------------------------------------------------------

async def dimension(store: Store, dim: str) -> tuple[list[Record], float | None]:
    """Namespaces or tasks (``dim``) with counters: from queen.stats once the stats
    job has run, from the base tables before. Returns (rows, statsAge)."""
    live, cached = {"namespace": (q.NAMESPACES_LIVE, q.NAMESPACES_FROM_STATS),
                    "task": (q.TASKS_LIVE, q.TASKS_FROM_STATS)}[dim]
    async with store.connection() as conn:
        age, ready = await stats_state(conn)
        return await conn.fetch(cached if ready else live), age


def _summary(values: list[float]) -> dict:
    if not values:
        return {"avg": 0, "median": 0, "min": 0, "max": 0}
    values = sorted(values)
    n = len(values)
    median = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return {"avg": round(sum(values) / n, 3), "median": round(median, 3),
            "min": round(values[0], 3), "max": round(values[-1], 3)}


async def overview(store: Store) -> dict:
    async with store.connection() as conn:
        age, ready = await stats_state(conn)
        catalog = await conn.fetchrow(q.CATALOG_COUNTS)
        totals = await conn.fetchrow(
            q.MESSAGE_TOTALS_FROM_STATS if ready else q.MESSAGE_TOTALS_LIVE, None, None, None)
        cursors = await conn.fetch(q.CURSOR_ROWS, None, None, None)
    return {"catalog": catalog, "totals": totals, "statsAge": age,
            "lag": {"time": _summary([r["time_lag_seconds"] for r in cursors]),
                    "offset": _summary([float(r["offset_lag"]) for r in cursors])}}


async def partitions(store: Store, queue: str | None, min_depth: int, limit: int,
                     offset: int) -> list[Record]:
    async with store.connection() as conn:
        return await conn.fetch(q.PARTITIONS_LIVE, queue, min_depth, limit, offset)


async def queue_exists(store: Store, queue: str) -> bool:
    async with store.connection() as conn:
        return await conn.fetchval(q.QUEUE_EXISTS, queue) is not None


async def queue_depth(store: Store, queue: str, group: str | None) -> list[Record] | None:
    """Per-partition backlog; None when the queue does not exist."""
    async with store.connection() as conn:
        if await conn.fetchval(q.QUEUE_EXISTS, queue) is None:
            return None
        return await conn.fetch(q.QUEUE_DEPTH, queue, group)


async def group_conflates(store: Store, queue: str, group: str) -> bool:
    """The group's stored conflation policy on the queue (False when none is stored)."""
    async with store.connection() as conn:
        return bool(await conn.fetchval(q.GROUP_CONFLATES, queue, group))


# -- consumer groups ----------------------------------------------------------------------

async def cursor_rows(store: Store, group: str | None = None, queue: str | None = None,
                      min_lag_seconds: float | None = None) -> list[Record]:
    async with store.connection() as conn:
        return await conn.fetch(q.CURSOR_ROWS, group, queue, min_lag_seconds)


def subscription_for(subs: list[Record], group: str, queue: str, namespace: str,
                      task: str) -> Record | None:
    """The stored subscription that applies to (group, queue), most specific
    first (the order of queen.subscription_start)."""
    best, rank = None, 99
    for s in subs:
        if s["consumer_group"] != group:
            continue
        if s["queue_name"] == queue:
            r = 0 if s["partition_name"] == "" else 1
        elif s["queue_name"] == "" and s["namespace"] and s["namespace"] == namespace \
                and s["task"] in ("", task):
            r = 2
        elif s["queue_name"] == "" and s["namespace"] == "" and s["task"] and s["task"] == task:
            r = 3
        else:
            continue
        if r < rank:
            best, rank = s, r
    return best


LAGGING_AFTER_SECONDS = 300
"""A group whose oldest unconsumed message is older than this is 'Lagging'."""


async def consumer_groups(store: Store) -> list[dict]:
    """One entry per (group, queue): cursor rows aggregated, plus subscribed
    (group, queue) pairs that have no cursor row yet."""
    async with store.connection() as conn:
        rows = await conn.fetch(q.CURSOR_ROWS, None, None, None)
        subs = await conn.fetch(q.SUBSCRIPTIONS, None)
        queues = {r["name"]: r for r in await conn.fetch(q.QUEUE_CATALOG)}
    groups: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["consumer_group"], r["queue_name"])
        g = groups.setdefault(key, {"rows": [], "namespace": r["namespace"], "task": r["task"]})
        g["rows"].append(r)
    for s in subs:
        if s["queue_name"] and s["queue_name"] in queues:
            key = (s["consumer_group"], s["queue_name"])
            qrow = queues[s["queue_name"]]
            groups.setdefault(key, {"rows": [], "namespace": qrow["namespace"],
                                    "task": qrow["task"]})
    out = []
    for (group, queue), g in sorted(groups.items()):
        members = g["rows"]
        max_lag = max((r["time_lag_seconds"] for r in members), default=0.0)
        consumed = any(r["last_consumed_at"] is not None for r in members)
        state = ("Dead" if not consumed else
                 "Lagging" if max_lag > LAGGING_AFTER_SECONDS else "Stable")
        sub = (None if group == QUEUE_MODE else
               subscription_for(subs, group, queue, g["namespace"], g["task"]))
        out.append({
            "name": group, "topics": [queue], "queueName": queue,
            "members": len(members),
            "partitionsWithLag": sum(1 for r in members if r["offset_lag"] > 0),
            "totalLag": sum(r["offset_lag"] for r in members),
            "maxTimeLag": round(max_lag, 3),
            "state": state,
            "activeLeases": sum(1 for r in members if r["lease_active"]),
            "subscriptionMode": sub["subscription_mode"] if sub else None,
            "subscriptionTimestamp": sub["subscription_timestamp"] if sub else None,
            "subscriptionCreatedAt": sub["created_at"] if sub else None,
        })
    return out


async def delete_group(store: Store, group: str, queue: str | None,
                       delete_metadata: bool) -> tuple[list[Record], int]:
    """Drop the group's cursors (and subscriptions). (deleted cursor rows, metadata rows)."""
    async with store.connection() as conn:
        async with conn.transaction():
            gone = await conn.fetch(q.DELETE_GROUP_CURSORS, group, queue)
            meta = 0
            if delete_metadata:
                status = await conn.execute(q.DELETE_GROUP_METADATA, group, queue)
                meta = int(status.split()[-1])
                await conn.execute(q.DELETE_GROUP_POLICIES, group, queue)
    return gone, meta


async def update_subscription(store: Store, group: str, timestamp: dt.datetime) -> int:
    async with store.connection() as conn:
        status = await conn.execute(q.UPDATE_SUBSCRIPTION, group, timestamp)
    return int(status.split()[-1])


async def seek_queue(store: Store, group: str, queue: str, to_end: bool,
                     timestamp: dt.datetime | None) -> list[Record] | None:
    """Move the group's cursors on the queue; None when the queue does not exist."""
    async with store.connection() as conn:
        async with conn.transaction():
            if await conn.fetchval(q.QUEUE_EXISTS, queue) is None:
                return None
            return await conn.fetch(q.SEEK_QUEUE, group, queue, to_end, timestamp)


async def seek_partition(store: Store, group: str, queue: str, partition: str) -> Record | None:
    async with store.connection() as conn:
        return await conn.fetchrow(q.SEEK_PARTITION, group, queue, partition)


# -- messages ------------------------------------------------------------------------------

async def messages_page(store: Store, *, queue, partition, namespace, task, since, until,
                        status, limit, offset) -> tuple[list[Record], Record]:
    async with store.connection() as conn:
        rows = await conn.fetch(q.MESSAGES_PAGE, queue, partition, namespace, task, since,
                                until, status, limit, offset)
        mode = await conn.fetchrow(q.MESSAGES_MODE, queue, partition, namespace, task)
    return rows, mode


async def message_detail(store: Store, partition_id: str, transaction_id: str
                         ) -> tuple[Record | None, list[Record], list[Record]]:
    """(message row or None, every group's cursor row on its partition, its DLQ rows)."""
    async with store.connection() as conn:
        msg = await conn.fetchrow(q.MESSAGE_DETAIL, partition_id, transaction_id)
        if msg is None:
            return None, [], []
        groups = await conn.fetch(q.MESSAGE_GROUPS, partition_id)
        dead = await conn.fetch(q.MESSAGE_DEAD_LETTERS, msg["id"])
    return msg, groups, dead


def message_status(seq: int, groups: list[Record], dead: list[Record]) -> dict:
    """A message's status from its partition's cursor rows, by the rules of
    ops_sql.MESSAGES_PAGE (kept in step with that statement)."""
    qm = next((g for g in groups if g["consumer_group"] == QUEUE_MODE), None)
    bus = [g for g in groups if g["consumer_group"] != QUEUE_MODE]

    def leased(g) -> bool:
        return bool(g["lease_active"]) and g["cursor_seq"] < seq <= (g["lease_last_seq"] or 0)

    queue_status = None
    lease_expires = None
    if qm is not None:
        if seq <= qm["cursor_seq"]:
            queue_status = "completed"
        elif leased(qm):
            queue_status, lease_expires = "processing", qm["lease_expires_at"]
        else:
            queue_status = "pending"
    dead_groups = {d["consumer_group"] for d in dead}
    consumed_by = sum(1 for g in bus if g["cursor_seq"] >= seq)
    if dead_groups:
        status = "dead_letter"
    elif queue_status is not None:
        status = queue_status
    elif bus and consumed_by >= len(bus):
        status = "completed"
    elif any(leased(g) for g in bus):
        status = "processing"
    else:
        status = "pending"
    return {"status": status, "queueStatus": queue_status, "leaseExpiresAt": lease_expires,
            "consumedBy": consumed_by, "busGroups": len(bus), "hasQueueMode": qm is not None,
            "groups": [{"name": g["consumer_group"], "consumed": g["cursor_seq"] >= seq,
                        "leaseExpiresAt": g["lease_expires_at"] if leased(g) else None}
                       for g in groups]}


async def move_to_dlq(store: Store, partition_id: str, transaction_id: str, error: str) -> str:
    """'moved', 'not_found', 'consumed', 'leased' or 'not_next'."""
    async with store.connection() as conn:
        return await conn.fetchval(q.MOVE_TO_DLQ, partition_id, transaction_id, error)


async def delete_message(store: Store, partition_id: str, transaction_id: str) -> bool:
    async with store.connection() as conn:
        return await conn.fetchval(q.DELETE_MESSAGE, partition_id, transaction_id) is not None


# -- traces -------------------------------------------------------------------------------

async def add_trace(store: Store, *, partition_id: str, transaction_id: str, group: str,
                    event_type: str, data: Any, worker_id: str, names: list[str]) -> str | None:
    """Record a trace event; its id, or None when the message does not exist."""
    async with store.connection() as conn:
        trace_id = await conn.fetchval(q.INSERT_TRACE, partition_id, transaction_id, group,
                                       event_type, data, worker_id, names)
    return str(trace_id) if trace_id is not None else None


async def traces_for_message(store: Store, partition_id: str, transaction_id: str
                             ) -> list[Record] | None:
    """The message's traces, oldest first; None when the message does not exist."""
    async with store.connection() as conn:
        rows = await conn.fetch(q.TRACES_FOR_MESSAGE, partition_id, transaction_id)
    if not rows:
        return None
    return [r for r in rows if r["id"] is not None]


async def traces_by_name(store: Store, name: str, since, until, limit: int, offset: int
                         ) -> tuple[int, list[Record]]:
    async with store.connection() as conn:
        total = await conn.fetchval(q.TRACES_BY_NAME_COUNT, name, since, until)
        rows = await conn.fetch(q.TRACES_BY_NAME, name, since, until, limit, offset)
    return total, rows


async def trace_names(store: Store, search: str | None, limit: int, offset: int) -> list[Record]:
    async with store.connection() as conn:
        return await conn.fetch(q.TRACE_NAMES, search, limit, offset)


# -- status / analytics -------------------------------------------------------------------

async def queues_status(store: Store, namespace, task, limit, offset) -> list[Record]:
    async with store.connection() as conn:
        _age, ready = await stats_state(conn)
        return await conn.fetch(q.QUEUES_FROM_STATS if ready else q.QUEUES_LIVE,
                                namespace, task, limit, offset)


async def queue_status(store: Store, queue: str) -> tuple[Record | None, list[Record]]:
    async with store.connection() as conn:
        row = await conn.fetchrow(sql.QUEUE_BY_NAME, queue)
        if row is None:
            return None, []
        return row, await conn.fetch(q.QUEUE_PARTITIONS_LIVE, queue)


async def analytics(store: Store, *, queue, namespace, task, since, until,
                    bucket_minutes) -> dict:
    scope = (queue, namespace, task)
    async with store.connection() as conn:
        ingested = await conn.fetch(q.INGEST_SERIES, *scope, bucket_minutes, since, until)
        dead = await conn.fetch(q.DLQ_SERIES, *scope, bucket_minutes, since, until)
        processed = await conn.fetch(q.PROCESSED_SERIES, bucket_minutes, since, until,
                                     q.PROCESSED_COUNTERS)
    return {"ingested": ingested, "dead": dead, "processed": processed}


def queue_figures(row) -> dict:
    """The message figures of a row (figures_sql.py) as every route reports them: integers,
    under these names."""
    return {"total": int(row["total"]), "pending": int(row["pending"]),
            "processing": int(row["processing"]), "completed": int(row["completed"]),
            "deadLetter": int(row["dead_letter"])}


async def queue_stats(store: Store) -> dict[str, dict]:
    """Every queue's figures from queen.stats, by name (/metrics)."""
    async with store.connection() as conn:
        return {r["queue"]: queue_figures(r) for r in await conn.fetch(q.QUEUE_STATS_ROWS)}


async def metrics_snapshot(store: Store) -> dict:
    """Database-side figures of /metrics/prometheus."""
    async with store.connection() as conn:
        queues = await conn.fetch(q.QUEUE_STATS_ROWS)
        dlq = await conn.fetch(q.DLQ_BY_QUEUE)
        leases = await conn.fetchval(q.LIVE_LEASE_COUNT)
        streams = await conn.fetch(streams_sql.STREAMS_STATUS, None)
    return {"queues": {r["queue"]: queue_figures(r) for r in queues},
            "dlq": [(r["queue"], r["n"]) for r in dlq], "leases": leases,
            "streams": [dict(r) for r in streams]}
