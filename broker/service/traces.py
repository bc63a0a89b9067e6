"""Message traces for operators (docs/wire-contract.md §13): record one (as this broker),
the trace names, the traces of a name, the traces of a message. Shaped by
routes/ops/traces.py."""
from __future__ import annotations

import datetime as dt
from typing import Any

from broker.service.context import BrokerContext
from broker.store import ops


async def add_trace(ctx: BrokerContext, *, partition_id: str, transaction_id: str, group: str,
                    event_type: str, data: Any, names: list[str]) -> str | None:
    """Record a trace event as this broker; its id, or None when the message does not exist."""
    return await ops.add_trace(ctx.store, partition_id=partition_id,
                               transaction_id=transaction_id, group=group,
                               event_type=event_type, data=data,
                               worker_id=ctx.settings.queen_server_id, names=names)


async def trace_names(ctx: BrokerContext, search: str | None, limit: int,
                      offset: int) -> list[Any]:
    return await ops.trace_names(ctx.store, search, limit, offset)


async def traces_by_name(ctx: BrokerContext, name: str, since: dt.datetime | None,
                         until: dt.datetime | None, limit: int,
                         offset: int) -> tuple[int, list[Any]]:
    return await ops.traces_by_name(ctx.store, name, since, until, limit, offset)


async def traces_for_message(ctx: BrokerContext, partition_id: str,
                             transaction_id: str) -> list[Any] | None:
    """The message's traces, oldest first; None when the message does not exist."""
    return await ops.traces_for_message(ctx.store, partition_id, transaction_id)
