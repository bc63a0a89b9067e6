"""Instant figures of this broker, for the metrics collector and /metrics, and the
cluster's spool backlog as the maintenance route and the dashboard show it."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ClusterView:
    """The cluster as this broker sees it (docs/behaviour.md §3.6), as the actors report it."""
    transport: dict | None   # the mesh's stats with received_wakes; None without peers
    cache: dict              # the queue config cache's figures
    parked: int              # long polls parked here
    wake_stats: dict         # the registry's wake counters
    hot_list: dict | None    # None with QUEEN_HOTLIST=false


async def cluster_view(ctx: BrokerContext) -> ClusterView:
    mesh = ctx.mesh
    transport = mesh.stats() if mesh is not None else None
    if transport is not None:  # wakes received from peers, through the per-queue gate
        transport["received_wakes"] = ctx.hints.remote_wakes.stats()
    cache = ctx.queue_cache.stats()
    parked = await ctx.waiters_proxy.parked_count()
    wakes = await ctx.waiters_proxy.wake_stats()
    hot_list = await ctx.hotlist.stats() if ctx.hotlist is not None else None
    return ClusterView(transport, cache, parked, wakes, hot_list)


async def parked_pops(ctx: BrokerContext) -> int:
    return await ctx.waiters_proxy.parked_count()


def mesh_stats(ctx: BrokerContext) -> dict | None:
    """The mesh's stats; None without peers."""
    return ctx.mesh.stats() if ctx.mesh is not None else None


async def throughput(ctx: BrokerContext, seconds: int) -> list[tuple[int, int, int, int]]:
    """(second, pushed, popped, acked) for the last ``seconds``, oldest first."""
    return await ctx.live.throughput_series(seconds)


async def depth_history(ctx: BrokerContext, queue: str
                        ) -> tuple[list[tuple[float, int | None]], float]:
    """The queue's pending figure per depth sample, oldest first, and the sampling interval
    in seconds."""
    points = await ctx.live.depth_series(queue)
    stats = await ctx.live.stats()
    return points, stats["depthIntervalSeconds"]
