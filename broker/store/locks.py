"""Locks and semaphores over key/value rows, with fencing tokens.

A permit of lock ``name`` is the queen.kv row ``queen-locks / <name>#<slot>`` whose
version is its token and whose value names the owner. Every operation on a lock first
locks its queen.lock_fences row, so operations on one lock apply one at a time, and a
token is the fence's counter plus one: it only rises, across slots, expiry and deletion,
and every acquire and every renew gets a new one. Expired permits are dead rows: absent
to every operation here at once, deleted later by the retention job.

Each operation runs in its own transaction (a lock batch is not all-or-nothing)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.store import kv_sql
from broker.store import locks_sql as sql
from broker.store.db import Store, StoreBusy, StoreConflict
from broker.wire import iso_milli

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
    value = row["value"] if isinstance(row["value"], dict) else {}
    return {"slot": int(row["key"].rpartition("#")[2]), "owner": value.get("owner"),
            "token": row["version"], "since": value.get("since"),
            "expiresAt": iso_milli(row["expires_at"]), "renewedAt": value.get("renewedAt")}


async def _permits(conn: asyncpg.Connection, name: str) -> list[Any]:
    return list(await conn.fetch(sql.PERMITS, f"{name}#", f"{name}$"))


async def _grant(conn: asyncpg.Connection, op: LockOp, slot: int, since: str | None,
                 now: dt.datetime) -> dict:
    """Write the permit ``slot`` of ``op.name`` with a new token; its answer fields."""
    token = await conn.fetchval(sql.NEXT_TOKEN, op.name)
    key = permit_key(op.name, slot)
    locked = await conn.fetchrow(kv_sql.LOCK, NAMESPACE, key)
    value = {"owner": op.owner, "token": token, "since": since or iso_milli(now),
             "renewedAt": iso_milli(now)}
    row = await conn.fetchrow(kv_sql.WRITE_VERSION, NAMESPACE, key, value,
                              now + dt.timedelta(seconds=op.ttl_seconds), locked["live"], token)
    return {"slot": slot, "token": token, "owner": op.owner, "guard": guard(op.name, slot, token),
            "expiresAt": iso_milli(row["expires_at"])}


async def _acquire(conn: asyncpg.Connection, op: LockOp, now: dt.datetime) -> dict:
    permits = await _permits(conn, op.name)
    holders = [_holder(r) for r in permits]
    mine = next((h for h in holders if h["owner"] == op.owner), None)
    if mine is not None:  # a retry of an acquire whose answer was lost: the same permit
        return {"acquired": True, "already": True, "slot": mine["slot"], "token": mine["token"],
                "owner": op.owner, "guard": guard(op.name, mine["slot"], mine["token"]),
                "expiresAt": mine["expiresAt"]}
    taken = {h["slot"] for h in holders}
    if len(taken) >= op.limit:
        return {"acquired": False, "reason": "held" if op.limit == 1 else "contended",
                "holders": holders}
    slot = next(s for s in range(op.limit) if s not in taken)
    return {"acquired": True, **await _grant(conn, op, slot, None, now)}


def _find(op: LockOp, holders: list[dict]) -> dict | None:
    """The permit ``op`` names: its slot when given, and its token (or, for a renew
    that names its owner, the owner: a renew retried after a lost answer)."""
    for h in holders:
        if op.slot is not None and h["slot"] != op.slot:
            continue
        if h["token"] == op.token or (op.op == "renew" and op.owner is not None
                                      and h["owner"] == op.owner):
            return h
    return None


async def _renew(conn: asyncpg.Connection, op: LockOp, now: dt.datetime) -> dict:
    holders = [_holder(r) for r in await _permits(conn, op.name)]
    mine = _find(op, holders)
    if mine is None:
        return {"renewed": False, "reason": "lost", "holders": holders}
    renewed = LockOp("renew", op.name, op.ttl_seconds, mine["owner"])
    return {"renewed": True, **await _grant(conn, renewed, mine["slot"], mine["since"], now)}


async def _release(conn: asyncpg.Connection, op: LockOp) -> dict:
    holders = [_holder(r) for r in await _permits(conn, op.name)]
    mine = _find(op, holders)
    if mine is None:
        return {"released": False, "reason": "lost"}
    await conn.fetchrow(kv_sql.LOCK, NAMESPACE, permit_key(op.name, mine["slot"]))
    await conn.execute(kv_sql.KILL, NAMESPACE, permit_key(op.name, mine["slot"]))
    return {"released": True, "slot": mine["slot"]}


async def _one(conn: asyncpg.Connection, op: LockOp) -> dict:
    if op.op == "get":
        holders = [_holder(r) for r in await _permits(conn, op.name)]
        return {"held": bool(holders), "holders": holders}
    await conn.fetchval(sql.FENCE, op.name)
    now = await conn.fetchval(kv_sql.NOW)
    if op.op == "acquire":
        return await _acquire(conn, op, now)
    if op.op == "renew":
        return await _renew(conn, op, now)
    return await _release(conn, op)


async def run(store: Store, ops: list[LockOp]) -> list[dict]:
    """Each operation in its own transaction, in order; one result per operation."""
    results = []
    for op in ops:
        for attempt in range(3):
            try:
                async with store.connection() as conn:
                    async with conn.transaction():
                        result = await _one(conn, op)
                break
            except StoreConflict:
                if attempt == 2:
                    raise StoreBusy("lock operation kept conflicting; retry later") from None
        results.append({"op": op.op, "name": op.name, **result})
    return results
