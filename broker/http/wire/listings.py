"""The operator listings of the state surfaces (routes/ops/state): a page of keys of a
namespace, a page of held locks, and their answers. Every malformed request is a coded
400 raised before anything is read."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.core.times import iso_milli
from broker.http.wire.common import body_object, is_int
from broker.http.wire.kv import kv_key, kv_namespace, kv_refusal
from broker.http.wire.locks import lock_refusal, lock_text
from broker.service.state_ops import HeldLock, KvListing, KvPage, LocksPage


def _flag(raw: Mapping[str, Any], field: str) -> bool:
    value = raw.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise kv_refusal(f"{field} must be true or false")
    return value


def _page_limit(value: Any, default: int, most: int, refusal) -> int:
    """A page size: a whole number, clamped to 1..``most`` (never refused for its size)."""
    if value is None or value == "":
        return default
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise refusal("limit must be a whole number") from None
    if not is_int(value):
        raise refusal("limit must be a whole number")
    return max(1, min(int(value), most))


def parse_kv_listing(body: Any, default_limit: int, most: int) -> KvListing:
    """``POST /api/v1/resources/kv/list``: ``{namespace, prefix?, after?, limit?,
    includeExpired?, keysOnly?}``. The cursor travels in the body because it is a key
    (a key in a query string ends up in access logs)."""
    raw = body_object(body)
    namespace = kv_namespace(raw.get("namespace"), "namespace")
    prefix = raw.get("prefix")
    prefix = "" if prefix in (None, "") else kv_key(prefix, "prefix")
    after = raw.get("after")
    after = None if after in (None, "") else kv_key(after, "after")
    return KvListing(namespace, prefix, after,
                     _page_limit(raw.get("limit"), default_limit, most, kv_refusal),
                     _flag(raw, "includeExpired"), _flag(raw, "keysOnly"))


def parse_locks_listing(args: Mapping[str, str], default_limit: int, most: int
                        ) -> tuple[str, str | None, int]:
    """``GET /api/v1/resources/locks?prefix=&after=&limit=``: a name prefix, the name to
    continue after, a page size."""
    prefix = args.get("prefix") or ""
    if prefix:
        prefix = lock_text(prefix, "prefix", name=True)
    after = args.get("after") or None
    if after is not None:
        after = lock_text(after, "after", name=True)
    return prefix, after, _page_limit(args.get("limit"), default_limit, most, lock_refusal)


def kv_listing_answer(page: KvPage) -> dict:
    """``{namespace, rows, truncated, nextAfter, bytes, asOf}``: ``nextAfter`` (the last
    key) when more follow; ``value`` left out of the rows of a keys-only listing."""
    keys_only, rows = page.listing.keys_only, page.rows
    out = []
    for r in rows:
        row = {"key": r["key"], "version": r["version"], "expiresAt": iso_milli(r["expires_at"]),
               "createdAt": iso_milli(r["created_at"]), "updatedAt": iso_milli(r["updated_at"]),
               "expired": r["expired"], "bytes": r["size"]}
        if not keys_only:
            row["value"] = r["value"]
        out.append(row)
    return {"namespace": page.listing.namespace, "rows": out, "truncated": page.truncated,
            "nextAfter": rows[-1]["key"] if page.truncated and rows else None,
            "bytes": sum(r["size"] for r in rows), "asOf": iso_milli(page.as_of)}


def locks_listing_answer(page: LocksPage) -> dict:
    """``{locks, truncated, nextAfter, locksHeld, permitsHeld}``; a lock's ``expiresAt``
    is its soonest permit's."""
    locks = [_lock(lock) for lock in page.locks]
    return {"locks": locks, "truncated": page.truncated,
            "nextAfter": locks[-1]["name"] if page.truncated else None,
            "locksHeld": page.locks_held, "permitsHeld": page.permits_held}


def _lock(lock: HeldLock) -> dict:
    permits = [{"slot": r["slot"], "owner": r["owner"], "token": r["token"], "since": r["since"],
                "renewedAt": r["renewed_at"], "expiresAt": iso_milli(r["expires_at"])}
               for r in lock.permits]
    return {"name": lock.name, "lastToken": lock.last_token, "holders": len(permits),
            "permits": permits, "expiresAt": min(p["expiresAt"] for p in permits)}
