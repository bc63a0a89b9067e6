"""Locks and semaphores over key/value rows, with fencing tokens.

A permit of lock ``name`` is the queen.kv row ``queen-locks / <name>#<slot>`` whose
version is its token and whose value names the owner. Every operation on a lock first
locks its queen.lock_fences row, so operations on one lock apply one at a time, and a
token is the fence's counter plus one: it only rises, across slots, expiry and deletion,
and every acquire and every renew gets a new one. Expired permits are dead rows: absent
to every operation here at once, deleted later by the retention job.

Each operation is one statement, a function of the lock_functions migration (locks_sql.py): one
round trip and its own transaction (a lock batch is not all-or-nothing). The rules
themselves are written there, in SQL, next to the rows they guard."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.core.times import iso_milli
from broker.store import locks_sql as sql
from broker.store.db import Store
from broker.store.errors import StoreBusy, StoreConflict

NAMESPACE = "queen-locks"


@dataclass(frozen=True)
class LockOp:
    op: str                    # acquire renew release get
    name: str
    ttl_seconds: int = 0
    owner: str | None = None
    limit: int = 1
    token: int | None = None
    slot: int | None = None


def permit_key(name: str, slot: int) -> str:
    return f"{name}#{slot}"


def guard(name: str, slot: int, token: int) -> dict:
    """The KV operation that holds while this permit is its holder's: a required check
    of the permit's row at its token (``.guard(lock)`` sends it in a transaction)."""
    return {"op": "check", "ns": NAMESPACE, "key": permit_key(name, slot), "expect": token,
            "required": True}


def _holder(row: Any) -> dict:
    return {"slot": row["slot"], "owner": row["owner"], "token": row["token"],
            "since": row["since"], "expiresAt": iso_milli(row["expires_at"]),
            "renewedAt": row["renewed_at"]}


def _permit(name: str, row: Any) -> dict:
    """The answer fields of the permit a verdict row names."""
    return {"slot": row["slot"], "token": row["token"], "owner": row["owner"],
            "guard": guard(name, row["slot"], row["token"]),
            "expiresAt": iso_milli(row["expires_at"])}


def _verdict(op: LockOp, rows: list[Any]) -> dict:
    """One operation's result from its function's rows (verdict first, then holders)."""
    outcome, holders = rows[0]["outcome"], [_holder(r) for r in rows[1:]]
    if outcome == "already":
        return {"acquired": True, "already": True, **_permit(op.name, rows[0])}
    if outcome == "acquired":
        return {"acquired": True, **_permit(op.name, rows[0])}
    if outcome in ("held", "contended"):
        return {"acquired": False, "reason": outcome, "holders": holders}
    if outcome == "renewed":
        return {"renewed": True, **_permit(op.name, rows[0])}
    if outcome == "released":
        return {"released": True, "slot": rows[0]["slot"]}
    if op.op == "renew":
        return {"renewed": False, "reason": "lost", "holders": holders}
    return {"released": False, "reason": "lost"}


async def _one(conn: asyncpg.Connection, op: LockOp) -> dict:
    """One statement per operation: no explicit transaction, so a write is one round
    trip (the function's statement is its own transaction)."""
    if op.op == "get":
        holders = [_holder(r) for r in await conn.fetch(sql.PERMITS, op.name)]
        return {"held": bool(holders), "holders": holders}
    if op.op == "acquire":
        rows = await conn.fetch(sql.ACQUIRE, op.name, op.owner, op.ttl_seconds, op.limit)
    elif op.op == "renew":
        rows = await conn.fetch(sql.RENEW, op.name, op.token, op.slot, op.owner,
                                op.ttl_seconds)
    else:
        rows = await conn.fetch(sql.RELEASE, op.name, op.token, op.slot)
    return _verdict(op, list(rows))


async def run(store: Store, ops: list[LockOp]) -> list[dict]:
    """Each operation in its own transaction, in order; one result per operation."""
    results = []
    for op in ops:
        for attempt in range(3):
            try:
                async with store.connection() as conn:
                    result = await _one(conn, op)
                break
            except StoreConflict:
                if attempt == 2:
                    raise StoreBusy("lock operation kept conflicting; retry later") from None
        results.append({"op": op.op, "name": op.name, **result})
    return results
