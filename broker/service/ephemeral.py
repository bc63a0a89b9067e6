"""Ephemeral queues (docs/ephemeral.md): the eight verbs over this broker's rings
(``ctx.ephemeral``, owned by the EphemeralKeeper actor) and the declared configuration in
PostgreSQL (broker/store/ephemeral.py).

Push, pop and ack touch RAM only: the rings' methods are synchronous and never await, so
push and ack are plain functions and a pop awaits only its long poll, parked on the rings'
gate (no timer, no database). Configure and delete write the declaration first and change
RAM after it committed, so an unreachable database (503) changes nothing.

Every function takes the queue name as its own argument, so a route can decide where a queue
is served (another broker may own it) between reading the name and calling here.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger

from actors.ephemeral.options import QueueOptions, effective, parse_patch
from actors.ephemeral.queues import MemoryFull as MemoryFull
from actors.ephemeral.queues import PushVerdict, QueueFigures
from actors.ephemeral.rings import Delivery
from broker.core.errors import BadRequest
from broker.service.context import BrokerContext
from broker.store import ephemeral as store


@dataclass(frozen=True, slots=True)
class EphemeralPop:
    queue: str
    partition: str | None
    group: str
    batch: int
    wait: bool
    timeout_ms: int
    auto_ack: bool


def push(ctx: BrokerContext, queue: str, partition: str, items: Sequence[tuple[str, int]],
         nbytes: int) -> PushVerdict:
    """Append the messages ((payload JSON text, bytes)) to the partition's ring, all or
    nothing; parked pops of the queue are woken."""
    return ctx.ephemeral.push(queue, partition, items, nbytes)


async def pop(ctx: BrokerContext, req: EphemeralPop) -> list[Delivery]:
    """Take up to ``req.batch`` messages for the group. Waiting: park on the rings' gate until
    something is there (a push or a redelivery wakes it), the deadline passes, or, with the
    queue's windowBuffer, the window that lets the batch fill up to ``count`` ends."""
    rings = ctx.ephemeral
    q, group, part = req.queue, req.group, req.partition
    if not req.wait:
        return rings.take(q, group, part, req.batch, req.auto_ack)
    options = rings.options_of(q)
    target = min(req.batch, options.window_count or req.batch) if options.window_ms else 1
    now = time.monotonic()
    deadline = now + req.timeout_ms / 1000
    window_end: float | None = None
    while True:
        ready = rings.available(q, group, part)
        if ready and (ready >= target or (window_end is not None and now >= window_end)
                      or now >= deadline):
            taken = rings.take(q, group, part, req.batch, req.auto_ack)
            if taken:
                if rings.available(q, group, part):
                    rings.wake_group(q, group, part)  # more left: the next pop of the group
                return taken
            ready = 0
        if now >= deadline:
            return []
        if not ready:
            window_end = None
        elif window_end is None:
            window_end = min(now + options.window_ms / 1000, deadline)
        waiter = rings.park(q, group, part)
        try:
            await asyncio.wait((waiter.future,), timeout=(window_end or deadline) - now)
        except asyncio.CancelledError:  # the client went away: pass an unused wake on
            if waiter.future.done():
                rings.wake_group(q, group, part)
            raise
        finally:
            rings.unpark(q, waiter)
        now = time.monotonic()
        if rings.gate.closed:  # the broker is stopping: answer as at the deadline
            deadline = now


def ack(ctx: BrokerContext, queue: str, group: str,
        acks: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
    """(outcome, dropped) per (id, status): acked, redelivered, stale, unknown."""
    return ctx.ephemeral.ack(queue, group, acks)


async def configure(ctx: BrokerContext, queue: str, knobs: Mapping[str, Any]) -> QueueOptions:
    """Declare the queue: merge ``knobs`` (checked by :func:`parse_patch`) over its stored
    ones in PostgreSQL, then apply the result (defaults for the rest) to the live queue."""
    stored = await store.declare(ctx.store, queue, knobs)
    return ctx.ephemeral.configure(queue, effective(_checked(queue, stored)))


def reset(ctx: BrokerContext, queue: str) -> int:
    return ctx.ephemeral.reset(queue)


async def delete(ctx: BrokerContext, queue: str) -> bool:
    """Forget the declaration, then the contents and cursors; True when there was either."""
    declared = await store.forget(ctx.store, queue)
    return ctx.ephemeral.delete(queue) or declared


def queues(ctx: BrokerContext) -> list[QueueFigures]:
    return ctx.ephemeral.summaries()


def depth(ctx: BrokerContext, queue: str) -> QueueFigures | None:
    return ctx.ephemeral.depth(queue)


def figures(ctx: BrokerContext) -> dict[str, Any]:
    return ctx.ephemeral.figures()


async def load_declared(ctx: BrokerContext) -> int:
    """Apply every declaration in PostgreSQL to this broker's queues (at start; safe to run
    again: a declared queue's options are replaced, its contents kept)."""
    rows = await store.declared(ctx.store)
    return ctx.ephemeral.load((name, effective(_checked(name, knobs))) for name, knobs in rows)


def _checked(queue: str, stored: Any) -> dict[str, Any]:
    """Stored knobs as parse_patch takes them, one at a time: a knob this broker cannot read
    (written by another version, or by hand) is left at its default and logged."""
    knobs: dict[str, Any] = {}
    for name, value in (stored.items() if isinstance(stored, Mapping) else ()):
        try:
            knobs.update(parse_patch({name: value}))
        except BadRequest as exc:
            logger.warning("ephemeral queue {}: stored option ignored: {}", queue, exc.message)
    return {k: v for k, v in knobs.items() if v is not None}
