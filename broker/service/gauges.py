"""Instant figures of this broker, for the metrics collector and /metrics, and the
cluster's spool backlog as the maintenance route and the dashboard show it."""
from __future__ import annotations

import datetime as dt

from broker.core.times import iso_milli
from broker.service.context import BrokerContext
from broker.store.errors import StoreError, StoreUnavailable


def gauges(ctx: BrokerContext) -> dict:
    size, idle, most = ctx.store.pool_sizes()
    mesh = ctx.mesh
    return {
        "db_pool_size": size,
        "db_pool_idle": idle,
        "db_pool_max": most,
        "mesh": mesh.stats() if mesh is not None else None,
        "maintenance_mode": ctx.flags.push,
        "pop_maintenance_mode": ctx.flags.pop,
        "long_polls_in_flight": ctx.telemetry.long_polls_in_flight,
    }


async def cluster_backlog(ctx: BrokerContext) -> list[dict] | None:
    """Which brokers' spools hold back which partitions (queen.spool_backlog); None when the
    database cannot be read."""
    try:
        rows = await ctx.store.spool_backlog_summary()
    except (StoreUnavailable, StoreError):
        return None
    return [{"spool": r["server_id"], "partitions": r["partitions"],
             "oldestAcceptedAt": iso_milli(dt.datetime.fromtimestamp(
                 r["oldest_accept_us"] / 1e6, dt.UTC)),
             "lastSeen": iso_milli(r["seen_at"])} for r in rows]
