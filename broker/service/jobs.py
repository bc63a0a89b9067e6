"""The background jobs for operators (docs/behaviour.md §7): each job's counters as its
actor reports them, and one cycle run now (``retention`` | ``stats`` | ``metrics``)."""
from __future__ import annotations

from typing import Any

from broker.service.context import BrokerContext


async def stats(ctx: BrokerContext) -> dict[str, dict[str, Any]]:
    """Per job name: cycles run / skipped / failed, the last result."""
    return {name: await job.stats() for name, job in ctx.jobs.items()}


async def run_once(ctx: BrokerContext, name: str, **kwargs: Any) -> dict[str, Any] | None:
    """One cycle of job ``name`` now, its result; None: no such job runs here."""
    job = ctx.jobs.get(name)
    if job is None:
        return None
    return await job.run_once(**kwargs)
