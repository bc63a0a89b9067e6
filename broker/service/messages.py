"""Messages for operators (docs/wire-contract.md §13, §14.3): pages of messages with their
status, one message in detail (its payload decrypted, each group's view of it, its dead
letters), deletion, and the manual move of a queue-mode message to the DLQ. The answers'
shapes are routes/ops/message_admin.py's and routes/ops/status.py's."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from broker.service.context import BrokerContext
from broker.store import ops


async def page(ctx: BrokerContext, *, queue: str | None, partition: str | None = None,
               namespace: str | None = None, task: str | None = None,
               since: dt.datetime | None = None, until: dt.datetime | None = None,
               status: str | None = None, limit: int, offset: int) -> tuple[list[Any], Any]:
    """A page of messages (newest first) and the mode of the scope (has_queue_mode,
    bus_groups)."""
    return await ops.messages_page(ctx.store, queue=queue, partition=partition,
                                   namespace=namespace, task=task, since=since, until=until,
                                   status=status, limit=limit, offset=offset)


async def queue_exists(ctx: BrokerContext, queue: str) -> bool:
    return await ops.queue_exists(ctx.store, queue)


@dataclass(frozen=True)
class Detail:
    message: Any             # the message row (queue options included)
    status: dict             # store.ops.message_status: status, per group, lease
    payload: Any             # decrypted when the queue encrypts and the key is set
    dead: list[Any]          # its dead letters, newest first


async def detail(ctx: BrokerContext, partition_id: str, transaction_id: str) -> Detail | None:
    """None: no such message."""
    msg, groups, dead = await ops.message_detail(ctx.store, partition_id, transaction_id)
    if msg is None:
        return None
    payload = msg["payload"]
    if msg["is_encrypted"] and ctx.cipher is not None:
        payload = ctx.cipher.decrypt(payload)
    return Detail(msg, ops.message_status(msg["seq"], groups, dead), payload, dead)


async def delete(ctx: BrokerContext, partition_id: str, transaction_id: str) -> bool:
    """Delete one message; its dead letters and traces go with it (cascade)."""
    return await ops.delete_message(ctx.store, partition_id, transaction_id)


async def move_to_dlq(ctx: BrokerContext, partition_id: str, transaction_id: str,
                      error: str) -> str:
    """'moved', 'not_found', 'consumed', 'leased' or 'not_next'."""
    return await ops.move_to_dlq(ctx.store, partition_id, transaction_id, error)

