"""Timers (``POST /api/v1/timers``, its cancel route, peek and list): messages
scheduled "not before" a time. A due timer is delivered by the TimerSweeper of some
broker (actors/timer_sweeper.py) as an ordinary message: its ``transactionId`` is the
timer's ``txn`` (deduplicated like any push), its id the ``messageId`` promised at
schedule time. A delivered timer has no row: cancel then answers ``absent``."""
from __future__ import annotations

from dataclasses import replace

from broker.service.context import BrokerContext
from broker.service.push import wake_after_commit
from broker.store import timers
from broker.store.timers import TimerOp

SWEEP_BATCH = 500
"""Timers one sweep delivers in one transaction (a full batch sweeps again at once)."""


async def prepared(ctx: BrokerContext, ops: list[TimerOp], producer_sub: str | None
                   ) -> list[TimerOp]:
    """Payloads as the messages will carry them (encrypted for encrypted queues), and
    the producer's identity from the token, never from the body."""
    flags: dict[str, bool] = {}
    cipher = ctx.cipher
    if cipher is not None:
        flags = await ctx.queue_cache.encryption_flags(
            {op.queue for op in ops if op.op != "cancel"})
    out = []
    for op in ops:
        if op.op == "cancel":
            out.append(op)
            continue
        encrypt = cipher is not None and flags.get(op.queue, False)
        out.append(replace(op, producer_sub=producer_sub, encrypted=encrypt,
                           payload=cipher.encrypt(op.payload) if encrypt and cipher
                           else op.payload))
    return out


def scheduled(ctx: BrokerContext, ops: list[TimerOp], results: list[dict]) -> None:
    """After commit: this broker's sweeper learns when the new timers are due."""
    sweeper = ctx.timer_sweeper
    if sweeper is None:
        return
    soonest = min((op.delay_ms for op, r in zip(ops, results)
                   if op.op != "cancel" and r.get("ok")), default=None)
    if soonest is not None:
        sweeper.due_in(soonest / 1000)


async def batch(ctx: BrokerContext, ops: list[TimerOp], producer_sub: str | None
                ) -> list[dict]:
    ops = await prepared(ctx, ops, producer_sub)
    results = await timers.batch(ctx.store, ops)
    scheduled(ctx, ops, results)
    counted(ctx, results)
    return results


def counted(ctx: BrokerContext, results: list[dict]) -> None:
    """Verdicts of committed timer operations, in this broker's counters
    (``timer_<status>`` of telemetry.messages: /metrics and the operator view)."""
    for r in results:
        ctx.telemetry.messages["timer_" + r["status"]] += 1


async def cancel(ctx: BrokerContext, op: TimerOp) -> dict:
    result = (await timers.batch(ctx.store, [op]))[0]
    counted(ctx, [result])
    return result


async def peek(ctx: BrokerContext, queue: str, key: str) -> dict:
    return await timers.peek(ctx.store, queue, key)


async def page(ctx: BrokerContext, queue: str, after: str | None, limit: int) -> dict:
    return await timers.page(ctx.store, queue, after, limit)


async def count(ctx: BrokerContext, queue: str, prefix: str) -> int:
    """Pending timers of ``queue`` whose key starts with ``prefix``."""
    return await timers.count(ctx.store, queue, prefix)


async def deliver_due(ctx: BrokerContext) -> tuple[int, float | None]:
    """One sweep (the TimerSweeper's ``deliver``); pops are woken after the commit."""
    delivery = await timers.deliver_due(ctx.store, SWEEP_BATCH)
    wake_after_commit(ctx, delivery.pairs)
    if delivery.delivered:
        ctx.telemetry.messages["timer_delivered"] += delivery.delivered
    return delivery.delivered, delivery.next_due_s
