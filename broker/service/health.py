"""Health for machines (docs/wire-contract.md §15.1): liveness (``GET /health/live``) and
readiness (``GET /health/ready``), next to the detailed ``GET /health`` for operators.

* Live: the process serves and its event loop is not stuck. A :class:`LoopMonitor` task
  (broker/core/loop_lag.py) measures how late the loop wakes it; not live when that lag
  passed HEALTH_LIVE_MAX_LAG_MS in the last 10 s, or when the monitor has not woken for
  that long (the loop was held until this very request, or the task died). PostgreSQL plays no part: a restart
  does not bring a database back.
* Ready: this broker can take traffic. PostgreSQL reachable (and writable); or, while it
  is not, the spool accepting pushes with room left (its writer healthy, below
  HEALTH_READY_SPOOL_MAX_PERCENT of FILE_BUFFER_MAX_BYTES). Never while it is stopping.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from broker.core.loop_lag import LoopMonitor
from broker.service.context import BrokerContext


def start_loop_monitor(ctx: BrokerContext) -> asyncio.Task[None]:
    """Start measuring this loop's lag (the task is the caller's to cancel at stop)."""
    ctx.loop_monitor = LoopMonitor(ctx.settings.health_live_max_lag_ms / 1000)
    return asyncio.get_running_loop().create_task(ctx.loop_monitor.run(), name="loop-monitor")


@dataclass
class Liveness:
    live: bool
    lag_ms: float  # the worst lag in the window, in milliseconds
    max_lag_ms: int


def liveness(ctx: BrokerContext) -> Liveness:
    live, worst = ctx.loop_monitor.verdict(ctx.loop_monitor.clock())
    return Liveness(live, round(worst * 1000, 1), ctx.settings.health_live_max_lag_ms)


@dataclass
class Readiness:
    ready: bool
    reason: str | None  # why not ready: stopping, spool_full, spool_failing
    database: str  # up or down (unknown while stopping: not asked)
    spool: dict[str, Any] = field(default_factory=dict)


async def readiness(ctx: BrokerContext) -> Readiness:
    """Can this broker take traffic now (see the module's docstring)?"""
    if ctx.stopping:
        return Readiness(False, "stopping", "unknown")
    up = await ctx.store.ping()
    stats = await ctx.spool.stats()
    max_bytes, pending = stats["maxBytes"], stats["pendingBytes"]
    limit = max_bytes * ctx.settings.health_ready_spool_max_percent / 100
    spool = {"healthy": stats["healthy"], "pendingBytes": pending, "maxBytes": max_bytes,
             "full": pending >= limit}
    if up:
        return Readiness(True, None, "up", spool)
    if not stats["healthy"]:  # its last write or sync failed: pushes are not acknowledged
        return Readiness(False, "spool_failing", "down", spool)
    if spool["full"]:
        return Readiness(False, "spool_full", "down", spool)
    return Readiness(True, None, "down", spool)
