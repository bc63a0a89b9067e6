"""The database's share of /metrics and /metrics/prometheus (docs/wire-contract.md §15.2,
§15.3): per-queue figures as of the last stats cycle, the state surfaces' counts, the
cluster's spool holds, the pool's waiting acquirers. While the database cannot be read
these are None (logged): the process's own figures still answer."""
from __future__ import annotations

from typing import Any

from loguru import logger

from broker.service import spools, state_ops
from broker.service.context import BrokerContext
from broker.store import ops
from broker.store.errors import StoreError, StoreUnavailable


def pool_waiting(ctx: BrokerContext) -> int:
    """Requests waiting for a pooled connection right now."""
    return ctx.store.pool_waiting()


async def json_figures(ctx: BrokerContext) -> tuple[dict[str, dict] | None, dict[str, Any] | None]:
    """(per-queue figures, state figures) of the JSON page; (None, None) when the database
    cannot be read."""
    try:
        return await ops.queue_stats(ctx.store), await state_ops.metric_figures(ctx)
    except (StoreUnavailable, StoreError) as exc:
        logger.warning("metrics: database figures unavailable: {}", exc)
        return None, None


async def prometheus_figures(ctx: BrokerContext) -> dict[str, Any]:
    """The Prometheus page's database figures: ``db`` (store.ops.metrics_snapshot),
    ``state`` and ``spool_holds``; each None when the database cannot be read."""
    try:
        return {"db": await ops.metrics_snapshot(ctx.store),
                "state": await state_ops.metric_figures(ctx),
                "spool_holds": await spools.holds(ctx)}
    except (StoreUnavailable, StoreError) as exc:
        logger.warning("metrics: database figures unavailable: {}", exc)
        return {"db": None, "state": None, "spool_holds": None}
