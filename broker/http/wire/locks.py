"""Locks on the wire: the operations of ``POST /api/v1/locks`` (coded 400s: lock_*), and
the answer around their results (each result element is broker/store/locks.py's)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.core.errors import BadRequest
from broker.http.wire.common import array_field, body_object, is_int
from broker.service.locks import LockOp

LOCK_MAX_OPS = 100
LOCK_NAME_MAX_BYTES = 256
LOCK_LIMIT_MAX = 1024
LOCK_TTL_MAX_SECONDS = 7 * 24 * 3600


def lock_refusal(message: str, code: str = "lock_bad_request") -> BadRequest:
    return BadRequest(message, code=code)


def lock_text(value: Any, where: str, *, name: bool) -> str:
    if (not isinstance(value, str) or not value
            or len(value.encode("utf-8", "surrogatepass")) > LOCK_NAME_MAX_BYTES
            or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF
                   for c in value) or (name and "#" in value)):
        raise lock_refusal(f"{where} must be a non-empty string of at most "
                           f"{LOCK_NAME_MAX_BYTES} bytes without control characters"
                           + (" and without '#'" if name else ""))
    return value


def _positive(raw: Mapping[str, Any], field: str, where: str, most: int, *,
              required: bool, least: int = 1) -> int | None:
    if field not in raw or raw[field] is None:
        if required:
            raise lock_refusal(f"{where}.{field} is required")
        return None
    value = raw[field]
    if not is_int(value) or not least <= value <= most:
        raise lock_refusal(f"{where}.{field} must be a whole number from {least} to {most}")
    return value


def parse_lock_op(raw: Any, where: str, minted_owner: str) -> LockOp:
    if not isinstance(raw, dict):
        raise lock_refusal(f"{where} must be an object")
    op = raw.get("op")
    if op not in ("acquire", "renew", "release", "get"):
        raise lock_refusal(f"{where}.op must be acquire, renew, release or get",
                           "lock_unknown_op")
    name = lock_text(raw.get("name"), f"{where}.name", name=True)
    if op == "get":
        return LockOp("get", name)
    owner = raw.get("owner")
    if owner is not None:
        owner = lock_text(owner, f"{where}.owner", name=False)
    slot = _positive(raw, "slot", where, LOCK_LIMIT_MAX - 1, required=False, least=0)
    if op == "release":
        return LockOp("release", name, token=_positive(raw, "token", where, 2**62, required=True),
                      slot=slot)
    ttl = _positive(raw, "ttlSeconds", where, LOCK_TTL_MAX_SECONDS, required=True)
    assert ttl is not None
    if op == "renew":
        return LockOp("renew", name, ttl, owner,
                      token=_positive(raw, "token", where, 2**62, required=True), slot=slot)
    limit = _positive(raw, "limit", where, LOCK_LIMIT_MAX, required=False) or 1
    return LockOp("acquire", name, ttl, owner or minted_owner, limit)


def parse_lock_batch(body: Any, minted_owner: str) -> list[LockOp]:
    """``{"operations": [...]}`` of POST /api/v1/locks, each on a different lock."""
    body = body_object(body)
    raw_ops = array_field(body, "operations", LOCK_MAX_OPS, code="lock_bad_request")
    ops = [parse_lock_op(raw, f"operations[{n}]", minted_owner)
           for n, raw in enumerate(raw_ops)]
    names = [op.name for op in ops]
    if len(set(names)) != len(names):
        raise lock_refusal("each operation of one call must be on a different lock")
    return ops


def lock_batch_answer(results: list[dict]) -> dict:
    """One result per operation, in order; a refusal is a verdict in its result (200)."""
    return {"results": results}
