"""Timers: schedule / reschedule / cancel (in a transaction the caller opened: the
``/api/v1/timers`` batch or a transaction's ``timers`` rider), reads, and delivery of
due timers as ordinary messages."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.core.domain import PushRow
from broker.core.ids import new_uuid7
from broker.core.times import iso_milli
from broker.store import timers_sql as sql
from broker.store.db import Store
from broker.store.errors import StoreBusy, StoreConflict


@dataclass(frozen=True)
class TimerOp:
    op: str                  # schedule reschedule cancel
    queue: str
    timer_key: str
    txn: str | None = None
    partition: str = "Default"
    payload: Any = None      # as the message will carry it (encrypted for encrypted queues)
    encrypted: bool = False
    delay_ms: int = 0
    producer_sub: str | None = None


def _base(op: TimerOp) -> dict:
    return {"op": op.op, "queue": op.queue, "timerKey": op.timer_key}


async def apply_one(conn: asyncpg.Connection, op: TimerOp) -> dict:
    """One result element: ``ok`` and ``status`` (scheduled | rescheduled | cancelled |
    absent | too_late), and the timer's ``txn`` (echoed on ``absent``)."""
    if op.op == "cancel":
        r = await conn.fetchrow(sql.CANCEL, op.queue, op.timer_key)
        return {**_base(op), "ok": r["status"] == "cancelled", "status": r["status"],
                "txn": r["txn"] or op.txn}
    r = await conn.fetchrow(sql.SCHEDULE, op.queue, op.timer_key, op.partition, op.payload,
                            op.encrypted, op.txn, new_uuid7(), op.producer_sub, op.delay_ms)
    if r["status"] == "too_late":
        return {**_base(op), "ok": False, "status": "too_late", "txn": op.txn}
    return {**_base(op), "ok": True, "status": r["status"], "txn": op.txn,
            "messageId": str(r["message_id"]), "partition": op.partition,
            "deliverAt": iso_milli(r["deliver_at"])}


async def apply_ops(conn: asyncpg.Connection, ops: list[TimerOp]) -> list[dict]:
    return [await apply_one(conn, op) for op in ops]


async def batch(store: Store, ops: list[TimerOp]) -> list[dict]:
    """The ``/api/v1/timers`` batch: every operation in one transaction, in order."""
    for attempt in range(3):
        try:
            async with store.connection() as conn:
                async with conn.transaction():
                    return await apply_ops(conn, ops)
        except StoreConflict:
            if attempt == 2:
                raise StoreBusy("timer batch kept conflicting; retry later") from None
    raise AssertionError("unreachable")


def _shape(r: Any, *, payload: bool) -> dict:
    out = {"queue": r["queue_name"], "timerKey": r["timer_key"],
           "partition": r["partition_name"], "txn": r["txn"],
           "messageId": str(r["message_id"]), "deliverAt": iso_milli(r["deliver_at"]),
           "attempts": r["attempts"], "encrypted": r["is_encrypted"],
           "createdAt": iso_milli(r["created_at"]), "updatedAt": iso_milli(r["updated_at"])}
    if payload:
        out["payload"] = r["payload"]
    return out


async def peek(store: Store, queue: str, key: str) -> dict:
    async with store.connection() as conn:
        r = await conn.fetchrow(sql.PEEK, queue, key)
    return {"found": False} if r is None else {"found": True, **_shape(r, payload=True)}


async def page(store: Store, queue: str, after: str | None, limit: int) -> dict:
    async with store.connection() as conn:
        rows = await conn.fetch(sql.LIST, queue, after, limit + 1)
    truncated = len(rows) > limit
    rows = rows[:limit]
    return {"rows": [_shape(r, payload=False) for r in rows], "truncated": truncated,
            "nextAfter": rows[-1]["timer_key"] if truncated else None}


async def count(store: Store, queue: str, prefix: str) -> int:
    async with store.connection() as conn:
        return await conn.fetchval(sql.COUNT_PREFIX, queue, prefix)


@dataclass(frozen=True)
class Delivery:
    pairs: set[tuple[str, str]]   # (queue, partition) that got a message
    delivered: int                # timers taken (pushed, or found already in the log)
    next_due_s: float | None      # seconds until the next pending timer is due


async def deliver_due(store: Store, limit: int) -> Delivery:
    """Push up to ``limit`` due timers as messages (transactionId = the timer's txn, so a
    delivery is deduplicated like any push) and delete them, in one transaction."""
    async with store.connection() as conn:
        async with conn.transaction():
            due = await conn.fetch(sql.CLAIM_DUE, limit)
            if due:
                rows = [PushRow(queue=t["queue_name"], partition=t["partition_name"],
                                message_id=str(t["message_id"]), transaction_id=t["txn"],
                                trace_id=None, payload=t["payload"], encrypted=t["is_encrypted"],
                                producer_sub=t["producer_sub"]) for t in due]
                await store.push(rows, conn=conn)
                # A push staged behind spooled ones (queen.staged) is durable and
                # merged in order: the timer is delivered as far as it is concerned.
                await conn.execute(sql.DELETE_DELIVERED, [t["queue_name"] for t in due],
                                   [t["timer_key"] for t in due])
        next_due = await conn.fetchval(sql.NEXT_DUE)
    pairs = {(t["queue_name"], t["partition_name"]) for t in due}
    return Delivery(pairs, len(due), None if next_due is None else float(next_due))
