"""What operators see of the state surfaces (key/value namespaces and keys, held locks,
pending timers): the operator routes, /metrics and the dashboard's State view. Figures
from the database are exact at the call, cluster-wide; the counters of deliveries,
cancellations and lock operations are this broker's since it started (telemetry).

The pages of keys and of held locks are results, shaped by broker/http/wire/listings.py.
The namespace and timer figures are still shaped here: /metrics reads
:func:`metric_figures`'s dict (routes/ops/metrics.py), and the operator views share its
leaves, so they move to wire together."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from broker.core.times import iso_milli
from broker.service.context import BrokerContext
from broker.store import state_ops

KV_PAGE_DEFAULT = 100
KV_PAGE_MAX = 1000
KV_PAGE_BYTES = 4 * 1024 * 1024
"""A key listing stops after the row that crosses this many bytes of values (so a page
of large values stays bounded; one row larger than this is still listed, alone)."""
LOCKS_PAGE_DEFAULT = 100
LOCKS_PAGE_MAX = 1000

TIMER_VERDICTS = ("scheduled", "rescheduled", "cancelled", "absent", "too_late", "delivered")
LOCK_OUTCOMES = ("acquire:acquired", "acquire:already", "acquire:refused", "renew:renewed",
                 "renew:refused", "release:released", "release:refused")


def _namespace(r: Any) -> dict:
    return {"namespace": r["namespace"], "keys": r["keys"], "liveKeys": r["live_keys"],
            "withTtl": r["with_ttl"], "expired": r["expired"], "deleted": r["deleted"],
            "bytes": r["bytes"]}


async def kv_namespaces(ctx: BrokerContext) -> dict:
    return {"namespaces": [_namespace(r) for r in await state_ops.kv_namespaces(ctx.store)]}


@dataclass(frozen=True)
class KvListing:
    """A page of keys asked for: ``after`` the last key of the previous page."""
    namespace: str
    prefix: str
    after: str | None
    limit: int
    include_expired: bool
    keys_only: bool


@dataclass(frozen=True)
class KvPage:
    """The keys' rows (key, version, value unless keys only, size, expiry and write
    times, expired) in key order; ``truncated``: more follow; ``as_of``: PostgreSQL's
    clock at the read."""
    listing: KvListing
    rows: list[Any]
    truncated: bool
    as_of: dt.datetime


async def kv_list(ctx: BrokerContext, q: KvListing) -> KvPage:
    """A keyset page of one namespace, bounded by ``limit`` and by KV_PAGE_BYTES."""
    rows, now = await state_ops.kv_list(ctx.store, q.namespace, q.prefix, q.after, q.limit,
                                        q.include_expired, q.keys_only)
    page, used = [], 0
    for r in rows[:q.limit]:
        page.append(r)
        used += r["size"]
        if used >= KV_PAGE_BYTES:
            break
    return KvPage(q, page, len(rows) > len(page), now)


@dataclass(frozen=True)
class HeldLock:
    """A lock with live permits: its fence's last token and the permits' rows (slot,
    owner, token, since, renewed_at, expires_at) in slot order."""
    name: str
    last_token: int
    permits: list[Any]


@dataclass(frozen=True)
class LocksPage:
    """Held locks in name order; ``truncated``: more follow; the cluster's totals."""
    locks: list[HeldLock]
    truncated: bool
    locks_held: int
    permits_held: int


async def locks(ctx: BrokerContext, prefix: str, after: str | None, limit: int) -> LocksPage:
    """Held locks in name order, each with its live permits and its fence's last token."""
    rows, summary = await state_ops.locks_page(ctx.store, prefix, after, limit)
    by_name: dict[str, HeldLock] = {}
    for r in rows:
        lock = by_name.get(r["name"])
        if lock is None:
            lock = by_name[r["name"]] = HeldLock(r["name"], r["last_token"], [])
        lock.permits.append(r)
    held = list(by_name.values())
    return LocksPage(held[:limit], len(held) > limit, summary["locks"], summary["permits"])


def timer_counters(ctx: BrokerContext) -> dict:
    m = ctx.telemetry.messages
    return {"delivered": m.get("timer_delivered", 0), "cancelled": m.get("timer_cancelled", 0),
            "scheduled": m.get("timer_scheduled", 0),
            "rescheduled": m.get("timer_rescheduled", 0), "tooLate": m.get("timer_too_late", 0),
            "absent": m.get("timer_absent", 0)}


def lock_counters(ctx: BrokerContext) -> dict:
    c = ctx.telemetry.locks
    return {"acquired": c.get("acquire:acquired", 0), "reacquired": c.get("acquire:already", 0),
            "acquireRefused": c.get("acquire:refused", 0), "renewed": c.get("renew:renewed", 0),
            "renewRefused": c.get("renew:refused", 0), "released": c.get("release:released", 0),
            "releaseRefused": c.get("release:refused", 0)}


def _timer_queue(r: Any) -> dict:
    return {"queue": r["queue"], "pending": r["pending"], "overdue": r["overdue"],
            "nextDueAt": iso_milli(r["next_due_at"]), "maxAttempts": r["max_attempts"]}


def _timer_totals(rows: list[Any]) -> dict:
    due = [r["next_due_at"] for r in rows]
    return {"queues": len(rows), "pending": sum(r["pending"] for r in rows),
            "overdue": sum(r["overdue"] for r in rows),
            "nextDueAt": iso_milli(min(due)) if due else None}


async def timers(ctx: BrokerContext) -> dict:
    """Pending timers per queue and in total (cluster-wide), and this broker's counters."""
    rows, now = await state_ops.timers_by_queue(ctx.store)
    sweeper = ctx.timer_sweeper
    return {"asOf": iso_milli(now), "queues": [_timer_queue(r) for r in rows],
            "totals": _timer_totals(rows),
            "thisBroker": {**timer_counters(ctx),
                           "sweeper": await sweeper.stats() if sweeper is not None else None}}


async def metric_figures(ctx: BrokerContext) -> dict:
    """The state figures of /metrics (JSON) and /metrics/prometheus."""
    f = await state_ops.metric_figures(ctx.store)
    return {"kv": [_namespace(r) for r in f["kv"]],
            "locks": {"held": f["locks"]["locks"], "permits": f["locks"]["permits"],
                      **lock_counters(ctx)},
            "timers": {**_timer_totals(f["timers"]), **timer_counters(ctx),
                       "byQueue": [_timer_queue(r) for r in f["timers"]]}}
