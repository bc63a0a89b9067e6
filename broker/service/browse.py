"""The operator's paged lists (routes/ops/browse.py, docs/wire-contract.md §20): queues,
a queue's partitions, consumer groups, a group's lag on a queue, a partition's messages;
one page per statement with the count of matching rows, searched on the server."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.service.context import BrokerContext
from broker.store import browse


async def queues(ctx: BrokerContext, search: str | None, limit: int,
                 offset: int) -> tuple[list[Any], int, float | None]:
    """A page of queues, how many match, and the age of queen.stats (s, None = never run)."""
    return await browse.queues_page(ctx.store, search, limit, offset)


async def queue(ctx: BrokerContext, queue: str) -> Any:
    """The queue's row (options included), or None."""
    return await browse.queue_header(ctx.store, queue)


async def partitions(ctx: BrokerContext, queue: str, search: str | None, limit: int,
                     offset: int) -> tuple[list[Any], int] | None:
    """A page of the queue's partitions and how many match; None: no such queue."""
    if await browse.queue_header(ctx.store, queue) is None:
        return None
    return await browse.partitions_page(ctx.store, queue, search, limit, offset)


async def groups(ctx: BrokerContext, search: str | None, limit: int,
                 offset: int) -> tuple[list[Any], int]:
    return await browse.groups_page(ctx.store, search, limit, offset)


async def group_lag(ctx: BrokerContext, group: str, queue: str, limit: int,
                    offset: int) -> tuple[list[Any], int, Any]:
    """The group's cursors on the queue (falling behind first), how many, and the stored
    subscription that applies (None: none stored)."""
    return await browse.group_lag_page(ctx.store, group, queue, limit, offset)


async def partition_messages(ctx: BrokerContext, queue: str, partition: str,
                             from_position: int, since: dt.datetime | None,
                             limit: int) -> list[Any]:
    return await browse.partition_messages(ctx.store, queue, partition, from_position, since,
                                           limit)
