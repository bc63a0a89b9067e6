"""The key/value operations, applied in order on one connection inside a transaction
the caller opened (the ``/api/v1/kv`` batch, a transaction's ``kv`` rider, the lock
operations). Each operation answers one result element (Queen's shapes); a write that
did not apply says why in ``reason``: ``exists`` (expect 0 met a live row), ``absent``
(no live row), ``version`` (another version), ``min`` / ``max`` (an incr past a bound),
``not_a_number`` (an incr of a value that is not a number). A ``required`` operation
that did not apply raises :class:`KvPreconditionFailed`: the caller rolls back."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.core.times import iso_milli
from broker.store import kv_sql as sql
from broker.store.db import Store
from broker.store.errors import StoreBusy, StoreConflict

FOREVER = None  # expires_at of a row written with ``forever: true``


@dataclass(frozen=True)
class KvOp:
    """One parsed operation. ``ttl_seconds`` None with ``forever`` means no expiry."""
    op: str                       # get getMany getPrefix put putIfAbsent delete incr check
    ns: str
    key: str = ""
    value: Any = None
    keys: tuple[str, ...] = ()
    prefix: str = ""
    after: str | None = None
    limit: int = 100
    keys_only: bool = False
    ttl_seconds: int | None = None
    forever: bool = False
    expect: int | None = None     # None: no precondition; 0: must not exist
    required: bool = False
    delta: int | float = 1
    min: int | float | None = None
    max: int | float | None = None

    @property
    def writes(self) -> bool:
        return self.op in WRITE_OPS


WRITE_OPS = frozenset({"put", "putIfAbsent", "delete", "incr"})
GET_MANY_MAX_BYTES = 4 * 1024 * 1024
"""Bytes of values one getMany answers; keys past it are in neither list (``truncated``)."""


class KvPreconditionFailed(Exception):
    """A ``required`` operation did not apply: nothing of its batch may commit."""

    def __init__(self, index: int, result: dict):
        super().__init__(f"kv operation {index} did not apply: {result.get('reason')}")
        self.index = index
        self.result = result


def _row(key: str, r: Any) -> dict:
    return {"key": key, "value": r["value"], "version": r["version"],
            "expiresAt": iso_milli(r["expires_at"]), "updatedAt": iso_milli(r["updated_at"])}


def prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` in byte order
    (UTF-8 byte order is code point order), or None when there is none."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:  # surrogates are not storable text
                nxt = 0xE000
            return "".join(chars) + chr(nxt)
    return None


def _expiry(op: KvOp, now: dt.datetime) -> dt.datetime | None:
    return FOREVER if op.ttl_seconds is None else now + dt.timedelta(seconds=op.ttl_seconds)


def _refusal(op: KvOp, reason: str, locked: Any) -> dict:
    """A write that did not apply, with what a reader sees now (nothing when not live)."""
    out: dict = {"op": op.op, "ns": op.ns, "key": op.key, "applied": False, "reason": reason}
    if locked is not None and locked["live"]:
        out["value"], out["version"] = locked["value"], locked["version"]
    else:
        out["value"], out["version"] = None, None
    return out


def _precondition(op: KvOp, locked: Any) -> str | None:
    """Why ``expect`` does not hold on the locked row, or None."""
    if op.expect is None:
        return None
    if op.expect == 0:
        return "exists" if locked["live"] else None
    if not locked["live"]:
        return "absent"
    return None if locked["version"] == op.expect else "version"


async def _write(conn: asyncpg.Connection, op: KvOp, value: Any, expires: Any, live: bool
                 ) -> dict:
    w = await conn.fetchrow(sql.WRITE, op.ns, op.key, value, expires, live)
    return {"op": op.op, "ns": op.ns, "key": op.key, "applied": True, "value": value,
            "version": w["version"], "expiresAt": iso_milli(w["expires_at"]),
            "updatedAt": iso_milli(w["updated_at"])}


async def _incr(conn: asyncpg.Connection, op: KvOp, locked: Any, now: dt.datetime) -> dict:
    current = locked["value"] if locked["live"] else 0
    if isinstance(current, bool) or not isinstance(current, (int, float)):
        return _refusal(op, "not_a_number", locked)
    new = current + op.delta
    if op.min is not None and new < op.min:
        return _refusal(op, "min", locked)
    if op.max is not None and new > op.max:
        return _refusal(op, "max", locked)
    # The expiry is create-only: a live counter keeps its window.
    expires = locked["expires_at"] if locked["live"] else _expiry(op, now)
    return await _write(conn, op, new, expires, locked["live"])


async def apply_one(conn: asyncpg.Connection, op: KvOp, now: dt.datetime) -> dict:
    """Apply one operation (inside the caller's transaction); its result element."""
    if op.op == "get":
        r = await conn.fetchrow(sql.GET, op.ns, op.key)
        if r is None:
            return {"op": "get", "ns": op.ns, "key": op.key, "found": False}
        return {"op": "get", "ns": op.ns, "found": True, **_row(op.key, r)}
    if op.op == "getMany":
        found = {r["key"]: r for r in await conn.fetch(sql.GET_MANY, op.ns, list(op.keys))}
        rows: list[dict] = []
        missing: list[str] = []
        used, truncated = 0, False
        for key in op.keys:
            r = found.get(key)
            if r is None:
                missing.append(key)
                continue
            if rows and used + r["size"] > GET_MANY_MAX_BYTES:
                truncated = True
                continue
            used += r["size"]
            rows.append(_row(key, r))
        return {"op": "getMany", "ns": op.ns, "found": bool(rows), "rows": rows,
                "missing": missing, "truncated": truncated}
    if op.op == "getPrefix":
        rows = await conn.fetch(sql.GET_PREFIX, op.ns, op.prefix, prefix_end(op.prefix),
                                op.after, op.keys_only, op.limit + 1)
        truncated = len(rows) > op.limit
        rows = rows[:op.limit]
        shaped = [_row(r["key"], r) for r in rows]
        if op.keys_only:
            for row in shaped:
                del row["value"]
        return {"op": "getPrefix", "ns": op.ns, "found": bool(shaped), "rows": shaped,
                "truncated": truncated, "nextAfter": rows[-1]["key"] if truncated else None}
    if op.op == "check":
        locked = await conn.fetchrow(sql.LOCK if op.expect == 0 else sql.CHECK, op.ns, op.key)
        if locked is None:
            held = None if op.expect == 0 else "absent"
        else:
            held = _precondition(op, locked)
        if held is not None:
            return _refusal(op, held, locked)
        return {"op": "check", "ns": op.ns, "key": op.key, "applied": True,
                "version": locked["version"] if locked is not None and locked["live"] else None}
    locked = await conn.fetchrow(sql.LOCK, op.ns, op.key)
    if op.op == "incr":
        return await _incr(conn, op, locked, now)
    why = _precondition(op, locked)
    if why is not None:
        return _refusal(op, why, locked)
    if op.op == "delete":
        if not locked["live"]:
            return _refusal(op, "absent", locked)
        await conn.execute(sql.KILL, op.ns, op.key)
        return {"op": "delete", "ns": op.ns, "key": op.key, "applied": True,
                "version": locked["version"]}
    return await _write(conn, op, op.value, _expiry(op, now), locked["live"])


def succeeded(result: dict) -> bool:
    return bool(result.get("applied", result.get("found", True)))


async def apply_ops(conn: asyncpg.Connection, ops: list[KvOp],
                    into: list[dict] | None = None) -> list[dict]:
    """Every operation in order, results appended to ``into`` (so a caller sees what ran
    before a failure); a ``required`` one that did not apply raises
    KvPreconditionFailed (the caller's transaction must then roll back)."""
    now = await conn.fetchval(sql.NOW)
    results = [] if into is None else into
    for n, op in enumerate(ops):
        result = await apply_one(conn, op, now)
        if op.required and not succeeded(result):
            raise KvPreconditionFailed(n, result)
        results.append(result)
    return results


@dataclass(frozen=True)
class BatchOutcome:
    results: list[dict]
    failed: KvPreconditionFailed | None  # the required operation that rolled it all back


def rolled_back(ops: list[KvOp], results: list[dict], failed: KvPreconditionFailed
                ) -> list[dict]:
    """The answer of a batch a required operation rolled back: the failed one's verdict,
    ``rolled_back`` for the writes before it (undone), ``not_run`` after it."""
    out = []
    for n, op in enumerate(ops):
        if n == failed.index:
            out.append(failed.result)
        elif n < failed.index and not op.writes:
            out.append(results[n])
        else:
            out.append({"op": op.op, "ns": op.ns, "key": op.key, "applied": False,
                        "reason": "rolled_back" if n < failed.index else "not_run"})
    return out


async def batch(store: Store, ops: list[KvOp]) -> BatchOutcome:
    """The ``/api/v1/kv`` batch: every operation in one transaction, in order."""
    for attempt in range(3):
        done: list[dict] = []
        try:
            async with store.connection() as conn:
                async with conn.transaction():
                    done = await apply_ops(conn, ops, into=done)
            return BatchOutcome(done, None)
        except KvPreconditionFailed as failed:
            return BatchOutcome(rolled_back(ops, done, failed), failed)
        except StoreConflict:
            # Two batches locked keys in opposite orders; nothing was committed.
            if attempt == 2:
                raise StoreBusy("key/value batch kept deadlocking; retry later") from None
    raise AssertionError("unreachable")
