"""The operator listings of the state surfaces (routes/ops/state): a page of keys of a
namespace, a page of held locks. Every malformed request is a coded 400 raised before
anything is read."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.http.wire.common import body_object, is_int
from broker.http.wire.kv import kv_key, kv_namespace, kv_refusal
from broker.http.wire.locks import lock_refusal, lock_text


@dataclass(frozen=True)
class KvListing:
    namespace: str
    prefix: str
    after: str | None
    limit: int
    include_expired: bool
    keys_only: bool


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
