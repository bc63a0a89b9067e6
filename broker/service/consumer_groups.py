"""Consumer groups for operators (docs/wire-contract.md §11): listing, lag, deletion,
subscription rewrite, seek.

Cursors are positions (``seq``): a seek sets the position, releases the lease (its
holder's acks then fail with "Invalid or expired lease") and, when the partition has
messages after the new position, tells the wakers, the hot-list and the peers, like a
push would. A deletion forgets what this broker cached of the group (its stored
subscriptions and conflation policies), so the next pop stores them again."""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from broker.service.context import BrokerContext
from broker.store import ops


def _announce(ctx: BrokerContext, pairs: Iterable[tuple[str, str]]) -> None:
    """Partitions that have messages after a group's (new) cursor: wake parked
    pops and mark them in the hot-list (and on the peers)."""
    found = sorted(set(pairs))
    if found:
        ctx.hints.pushed(found)


async def groups(ctx: BrokerContext) -> list[dict]:
    return await ops.consumer_groups(ctx.store)


async def cursors(ctx: BrokerContext, *, group: str | None = None,
                  min_lag_seconds: float | None = None) -> list[Any]:
    """Cursor rows: of ``group``, or every group's whose oldest unconsumed message is
    older than ``min_lag_seconds``."""
    if min_lag_seconds is not None:
        return await ops.cursor_rows(ctx.store, min_lag_seconds=min_lag_seconds)
    return await ops.cursor_rows(ctx.store, group=group)


async def delete(ctx: BrokerContext, group: str, queue: str | None,
                 delete_metadata: bool) -> tuple[int, int]:
    """Remove the group's cursors (on ``queue``, else everywhere) and, with
    ``delete_metadata``, its stored subscriptions; (cursors removed, metadata rows removed)."""
    gone, meta = await ops.delete_group(ctx.store, group, queue, delete_metadata)
    if delete_metadata:  # let this broker store the group's subscription again
        stored = ctx.queue_cache.subscriptions_stored
        stored.difference_update({k for k in stored if k[0] == group and queue in (None, k[1])})
        policies = ctx.queue_cache.group_policies
        for key in [k for k in policies if k[1] == group and queue in (None, k[0])]:
            del policies[key]
    # The next pop re-seeds these partitions from the subscription (or the start).
    _announce(ctx, ((r["queue_name"], r["partition_name"]) for r in gone if r["last_seq"] > 0))
    return len(gone), meta


async def update_subscription(ctx: BrokerContext, group: str, timestamp: dt.datetime) -> int:
    return await ops.update_subscription(ctx.store, group, timestamp)


async def seek(ctx: BrokerContext, group: str, queue: str, to_end: bool,
               timestamp: dt.datetime | None) -> list[Any] | None:
    """Move the group's cursors on ``queue`` (to its end, or to ``timestamp``); the rows
    (partition_name, old_seq, seq), or None when there is no such queue."""
    rows = await ops.seek_queue(ctx.store, group, queue, to_end, timestamp)
    if rows is not None:
        _announce(ctx, ((queue, r["partition_name"]) for r in rows if r["seq"] < r["last_seq"]))
    return rows


async def seek_partition(ctx: BrokerContext, group: str, queue: str, partition: str) -> Any:
    """The cursor moved to the partition's newest message, or None: no such partition."""
    return await ops.seek_partition(ctx.store, group, queue, partition)
