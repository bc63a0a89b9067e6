"""Locks and semaphores with fencing tokens (``POST /api/v1/locks``); the rules are in
broker/store/locks.py."""
from __future__ import annotations

from broker.core.ids import new_uuid7
from broker.service.context import BrokerContext
from broker.store import locks
from broker.store.locks import LockOp


def minted_owner() -> str:
    """The owner of an acquire that names none: nobody else's, so such a call is not
    idempotent (the client always sends its own)."""
    return f"anonymous:{new_uuid7()}"


def outcome(result: dict) -> str:
    """``op:outcome`` of one result, the key of the lock counters (telemetry.locks)."""
    op = result["op"]
    if op == "acquire":
        return "acquire:" + ("refused" if not result["acquired"]
                             else "already" if result.get("already") else "acquired")
    if op == "renew":
        return "renew:" + ("renewed" if result["renewed"] else "refused")
    return "release:" + ("released" if result["released"] else "refused")


async def run(ctx: BrokerContext, ops: list[LockOp]) -> list[dict]:
    results = await locks.run(ctx.store, ops)
    for r in results:
        if r["op"] != "get":
            ctx.telemetry.locks[outcome(r)] += 1
    return results
