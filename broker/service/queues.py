"""Queues and their dead letters (docs/wire-contract.md §9, §10.1-§10.3, §12): configure,
list, one queue's detail, delete; a page of dead letters (payloads decrypted), and the
retry of a dead-lettered message. A changed or deleted queue is told to the config cache
here and on the peers; a retried copy wakes pops like a push. Shaped by routes/admin.py
and broker/http/wire/queues.py, wire/dlq.py."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from broker.core.ids import new_uuid7
from broker.service.context import BrokerContext
from broker.service.push import wake_after_commit
from broker.store.sql import QUEUE_OPTIONS as QUEUE_OPTIONS

# QUEUE_OPTIONS: every configure option as (wire name, column, type, default), the
# store's list, read by the wire's parsing and answers and by the OpenAPI document.


async def configure(ctx: BrokerContext, queue: str, namespace: str | None, task: str | None,
                    options: dict[str, Any]) -> Any:
    """Upsert the queue (options left out keep their values); its row as stored."""
    row = await ctx.store.configure(queue, namespace, task, options)
    ctx.hints.queue_config_changed(queue, deleted=False)
    return row


async def listing(ctx: BrokerContext) -> list[Any]:
    return await ctx.store.list_queues()


async def detail(ctx: BrokerContext, queue: str) -> tuple[Any, list[Any]]:
    """(the queue's row or None, its partitions' figures)."""
    return await ctx.store.queue_detail(queue)


async def delete(ctx: BrokerContext, queue: str) -> bool:
    """Whether the queue existed; it is gone either way, here and on the peers."""
    existed = await ctx.store.delete_queue(queue)
    ctx.hints.queue_config_changed(queue, deleted=True)
    return existed


@dataclass(frozen=True)
class DeadLetters:
    total: int
    rows: list[Any]
    payloads: list[Any]      # per row, decrypted when the queue encrypts and the key is set


async def dead_letters(ctx: BrokerContext, *, queue: str | None, partition: str | None,
                       group: str | None, since: dt.datetime | None, until: dt.datetime | None,
                       limit: int, offset: int) -> DeadLetters:
    total, rows = await ctx.store.dlq(queue=queue, partition=partition, group=group,
                                      since=since, until=until, limit=limit, offset=offset)
    cipher = ctx.cipher
    payloads = [cipher.decrypt(r["payload"]) if r["is_encrypted"] and cipher is not None
                else r["payload"] for r in rows]
    return DeadLetters(total, rows, payloads)


@dataclass(frozen=True)
class Retried:
    dead: list[Any]          # the DLQ rows removed
    copy_transaction_id: str
    pushed: Any              # the push row of the copy


async def retry_dead_letter(ctx: BrokerContext, partition_id: str,
                            transaction_id: str) -> Retried | None:
    """Re-enqueue a dead-lettered message: its DLQ rows go, and a copy with a derived
    transactionId is pushed to the same partition (every group sees the copy; the
    original stays where it is, so no cursor moves backwards). None: not dead-lettered."""
    copy_txid = f"{transaction_id}:retry:{new_uuid7()}"
    dead, pushed = await ctx.store.retry_dead_letter(partition_id, transaction_id,
                                                     new_uuid7(), copy_txid)
    if not dead or pushed is None:  # both or neither
        return None
    first = dead[0]
    wake_after_commit(ctx, {(first["queue"], first["partition"])})
    return Retried(dead, copy_txid, pushed)
