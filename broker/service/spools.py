"""The cluster's spool holds (docs/behaviour.md §5.8): which spools hold partitions back in
queen.spool_backlog, which of them are silent (no heartbeat for FILE_BUFFER_ORDER_WAIT_MS), and
the operator's release of one spool's holds. Cluster-wide figures, read from PostgreSQL;
``/health``, Prometheus, the dashboard and the operator routes show them."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from loguru import logger

from broker.core.errors import BadRequest
from broker.service.context import BrokerContext
from broker.store import spools
from broker.store.errors import StoreError, StoreUnavailable

# re-exported for broker/http, which imports no store module
from broker.store.spools import Release as Release

MAX_SPOOL_ID = 255
"""Longest spool id the release takes (a broker's id plus 9 characters)."""


@dataclass(frozen=True)
class SpoolHold:
    """One spool holding partitions: how many, the accept time of its oldest registered
    push, its last heartbeat (None: it never beat) and whether it is silent, for how long."""
    spool: str
    partitions: int
    oldest_accept_us: int
    last_heartbeat: dt.datetime | None
    silent: bool
    silent_seconds: float | None


@dataclass(frozen=True)
class Holds:
    """Every spool holding partitions, and the distinct partitions silent ones hold."""
    wait_ms: int
    forget_ms: int
    spools: list[SpoolHold]
    silent_partitions: int

    @property
    def silent_spools(self) -> list[SpoolHold]:
        return [s for s in self.spools if s.silent]


async def holds(ctx: BrokerContext) -> Holds:
    """Read now; raises the store's error when the database cannot be read."""
    wait = ctx.settings.file_buffer_order_wait_ms
    rows = await spools.holds(ctx.store, wait)
    return Holds(
        wait_ms=wait, forget_ms=ctx.settings.file_buffer_order_forget_ms,
        spools=[SpoolHold(spool=r["server_id"], partitions=int(r["partitions"]),
                          oldest_accept_us=int(r["oldest_accept_us"]),
                          last_heartbeat=r["seen_at"], silent=bool(r["silent"]),
                          silent_seconds=r["silent_seconds"]) for r in rows],
        silent_partitions=int(rows[0]["silent_pairs"]) if rows else 0)


async def holds_or_none(ctx: BrokerContext) -> Holds | None:
    """``holds``, or None when the database cannot be read (``/health`` still answers)."""
    try:
        return await holds(ctx)
    except (StoreUnavailable, StoreError):
        return None


class SpoolNotFound(LookupError):
    """No row of queen.spool_backlog or queen.spool_servers names the spool."""


class SpoolRefused(Exception):
    """The release was refused and nothing was deleted; the message says why."""


def check_spool_id(spool_id: str) -> str:
    if not spool_id or len(spool_id) > MAX_SPOOL_ID or not spool_id.isprintable():
        raise BadRequest(f"not a spool id: {spool_id[:80]!r}")
    return spool_id


async def release(ctx: BrokerContext, spool_id: str, force: bool) -> spools.Release:
    """Delete ``spool_id``'s holds and heartbeat row, so its partitions are no longer held
    back by it. Refused (SpoolRefused) for ``(staged)`` and, unless ``force``, for a spool
    that beat within FILE_BUFFER_ORDER_WAIT_MS. What it changes: if that spool's disk
    returns, its pushes land later, each counted as an order exception; nothing already in
    PostgreSQL (staged or stored) changes."""
    check_spool_id(spool_id)
    if spool_id == spools.STAGED:
        raise SpoolRefused(f"{spools.STAGED} is not a spool: it names the partitions with staged "
                           "pushes, and holds them until the merge has moved those on")
    wait = ctx.settings.file_buffer_order_wait_ms
    result = await spools.release(ctx.store, spool_id, wait, force)
    if result.verdict == "unknown":
        raise SpoolNotFound(f"no spool {spool_id} holds partitions or has a heartbeat row")
    if result.verdict == "fresh":
        raise SpoolRefused(
            f"spool {spool_id} beat less than FILE_BUFFER_ORDER_WAIT_MS ({wait} ms) ago "
            f"(last heartbeat {result.last_heartbeat.isoformat() if result.last_heartbeat else '-'}"
            f", {result.partitions} partition(s) held): it looks alive; release it with force "
            "only if its disk is gone for good")
    ctx.telemetry.spool_holds_ended["released"] += result.partitions
    logger.warning("spool holds: spool {} released by an operator{} ({} partition(s); last "
                   "heartbeat {})", spool_id, " (forced)" if force else "", result.partitions,
                   result.last_heartbeat)
    return result
