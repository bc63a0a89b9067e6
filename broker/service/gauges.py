"""Instant figures of this broker, for the metrics collector and /metrics."""
from __future__ import annotations

from broker.service.context import BrokerContext


def gauges(ctx: BrokerContext) -> dict:
    pool = ctx.store.pool
    mesh = ctx.mesh
    return {
        "db_pool_size": pool.get_size(),
        "db_pool_idle": pool.get_idle_size(),
        "db_pool_max": pool.get_max_size(),
        "mesh": mesh.stats() if mesh is not None else None,
        "maintenance_mode": ctx.flags.push,
        "pop_maintenance_mode": ctx.flags.pop,
        "long_polls_in_flight": ctx.telemetry.long_polls_in_flight,
    }
