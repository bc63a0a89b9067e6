"""Queue resources for operators (docs/wire-contract.md §10.4–§10.7): namespaces and
tasks with their message figures, the overview, partitions by depth, a queue's depth
after a group's cursor. Reads only; the rows are shaped by routes/ops/resources.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.service.context import BrokerContext
from broker.store import analytics, ops


async def dimension(ctx: BrokerContext, dim: str) -> tuple[list[Any], float | None]:
    """Per namespace or task (``dim``): its rows and the age of queen.stats."""
    return await ops.dimension(ctx.store, dim)


@dataclass(frozen=True)
class Overview:
    figures: dict            # catalog, totals, lag, statsAge (store.ops.overview)
    recent: Any              # the collector's last 5 minutes: pushed, acked, lag sums
    max_lag_ms: float


async def overview(ctx: BrokerContext) -> Overview:
    figures = await ops.overview(ctx.store)
    recent, max_lag_ms = await analytics.overview_rates(ctx.store)
    return Overview(figures, recent, max_lag_ms)


async def partitions(ctx: BrokerContext, queue: str | None, min_depth: int, limit: int,
                     offset: int) -> list[Any]:
    return await ops.partitions(ctx.store, queue, min_depth, limit, offset)


@dataclass(frozen=True)
class Depth:
    rows: list[Any]          # per partition: partition, pending
    conflates: bool          # the group conflates on the queue (it runs once per partition)


async def queue_depth(ctx: BrokerContext, queue: str, group: str | None) -> Depth | None:
    """None: no such queue."""
    rows = await ops.queue_depth(ctx.store, queue, group)
    if rows is None:
        return None
    conflates = group is not None and await ops.group_conflates(ctx.store, queue, group)
    return Depth(rows, conflates)
