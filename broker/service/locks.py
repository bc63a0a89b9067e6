"""Locks and semaphores with fencing tokens (``POST /api/v1/locks``); the rules are in
broker/store/locks.py."""
from __future__ import annotations

from broker.service.context import BrokerContext
from broker.store import locks
from broker.store.locks import LockOp
from broker.wire import new_uuid7


def minted_owner() -> str:
    """The owner of an acquire that names none: nobody else's, so such a call is not
    idempotent (the client always sends its own)."""
    return f"anonymous:{new_uuid7()}"


async def run(ctx: BrokerContext, ops: list[LockOp]) -> list[dict]:
    return await locks.run(ctx.store, ops)
