"""Request parsing for the state surfaces (offset reads, key/value, locks, timers) and
their transaction riders: every malformed body is a :class:`BadRequest` (400) raised
before anything is read or written. Shared by several route modules (``routes/reads``,
``routes/kv``, ``routes/locks``, ``routes/timers`` and the transaction in
``routes/ack``), which is why it is not in any one of them."""
from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ujson

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid, new_uuid7
from broker.core.times import parse_timestamp
from broker.core.validate import MAX_NAME, Invalid, payload_json, text_problem
from broker.http.wire.messages import body_object
from broker.service.reads import ChangedQuery, FetchEntry
from broker.store.kv import KvOp
from broker.store.locks import LockOp
from broker.store.timers import TimerOp

FETCH_MAX_ENTRIES = 1024
FETCH_MAX_ENTRY_BYTES = 8 * 1024 * 1024
FETCH_MAX_CALL_BYTES = 32 * 1024 * 1024
CHANGED_MAX_ENTRIES = 100
CHANGED_PAGE_MAX = 1000


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def name_field(value: Any, where: str, *, max_len: int = MAX_NAME, code: str | None = None
               ) -> str:
    """A non-empty string PostgreSQL can store, at most ``max_len`` characters."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where} must be a non-empty string", code=code)
    if len(value) > max_len:
        raise BadRequest(f"{where} is longer than {max_len} characters", code=code)
    problem = text_problem(value)
    if problem:
        raise BadRequest(f"{where} {problem}", code=code)
    return value


def array_field(body: Mapping[str, Any], field: str, most: int, *, code: str | None = None,
                allow_empty: bool = False) -> list:
    items = body.get(field)
    if not isinstance(items, list):
        raise BadRequest(f"{field} must be an array", code=code)
    if not items and not allow_empty:
        raise BadRequest(f"{field} must not be empty", code=code)
    if len(items) > most:
        raise BadRequest(f"{field} holds {len(items)} elements, at most {most}", code=code)
    return items


def _clamped_bytes(value: Any, where: str, ceiling: int) -> int:
    if value is None:
        return ceiling
    if not is_int(value) or value < 1:
        raise BadRequest(f"{where} must be a positive integer")
    return min(value, ceiling)


# -- offset reads ------------------------------------------------------------------------

def parse_fetch(body: Any) -> tuple[list[FetchEntry], int]:
    """``{"entries": [{queue, partition, offset, maxBytes}], "maxBytes"}``."""
    body = body_object(body)
    entries = []
    for n, raw in enumerate(array_field(body, "entries", FETCH_MAX_ENTRIES)):
        if not isinstance(raw, dict):
            raise BadRequest(f"entries[{n}] must be an object")
        queue = name_field(raw.get("queue"), f"entries[{n}].queue")
        partition = raw.get("partition", "Default")
        partition = name_field(partition, f"entries[{n}].partition")
        offset = raw.get("offset", 0)
        if not is_int(offset) or not 0 <= offset < 2**62:
            raise BadRequest(f"entries[{n}].offset must be a non-negative integer")
        entries.append(FetchEntry(queue, partition, offset,
                                  _clamped_bytes(raw.get("maxBytes"), f"entries[{n}].maxBytes",
                                                 FETCH_MAX_ENTRY_BYTES)))
    return entries, _clamped_bytes(body.get("maxBytes"), "maxBytes", FETCH_MAX_CALL_BYTES)


def _page_cursor(value: Any, where: str) -> tuple[dt.datetime, str]:
    if not isinstance(value, str) or value.count("|") != 1:
        raise BadRequest(f"{where} must be the 'next' of a previous page")
    stamp, pid = value.split("|")
    if not is_uuid(pid):
        raise BadRequest(f"{where} must be the 'next' of a previous page")
    return parse_timestamp(stamp, where), pid


def parse_changed(body: Any) -> list[ChangedQuery]:
    """``{"entries": [{queue, since?, after?, limit?}]}``."""
    body = body_object(body)
    out = []
    for n, raw in enumerate(array_field(body, "entries", CHANGED_MAX_ENTRIES)):
        if not isinstance(raw, dict):
            raise BadRequest(f"entries[{n}] must be an object")
        queue = name_field(raw.get("queue"), f"entries[{n}].queue")
        since = raw.get("since")
        if since is not None:
            if not isinstance(since, str):
                raise BadRequest(f"entries[{n}].since must be an ISO-8601 timestamp")
            since = parse_timestamp(since, f"entries[{n}].since")
        after = raw.get("after")
        cursor = None if after is None else _page_cursor(after, f"entries[{n}].after")
        limit = raw.get("limit", CHANGED_PAGE_MAX)
        if not is_int(limit) or limit < 1:
            raise BadRequest(f"entries[{n}].limit must be a positive integer")
        out.append(ChangedQuery(queue, since, cursor, min(limit, CHANGED_PAGE_MAX)))
    return out


# -- key/value ---------------------------------------------------------------------------

KV_MAX_OPS = 1000
KV_NS_MAX = 128
KV_KEY_MAX = 1024
KV_GET_MANY_MAX_KEYS = 1000
KV_PREFIX_PAGE_DEFAULT = 100
KV_PREFIX_PAGE_MAX = 1000
KV_TTL_MAX_SECONDS = 10 * 365 * 24 * 3600
KV_VALUE_MAX_BYTES = 1024 * 1024
RESERVED_NS_PREFIX = "queen-"
"""Namespaces the broker writes itself (``queen-locks``: lock permits): readable and
checkable by anyone, writable only through their own routes."""

_KV_OPS = ("get", "getMany", "getPrefix", "put", "putIfAbsent", "delete", "incr", "check")
_NS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def kv_refusal(message: str, code: str = "kv_bad_request") -> BadRequest:
    return BadRequest(message, code=code)


def _ns(value: Any, where: str) -> str:
    if (not isinstance(value, str) or not value or len(value) > KV_NS_MAX
            or not set(value) <= _NS_CHARS):
        raise kv_refusal(f"{where} must be 1 to {KV_NS_MAX} characters of A-Z a-z 0-9 . _ : -",
                         "kv_bad_namespace")
    return value


def _key(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise kv_refusal(f"{where} must be a non-empty string", "kv_bad_key")
    problem = text_problem(value)
    if problem:
        raise kv_refusal(f"{where} {problem}", "kv_bad_key")
    if len(value.encode("utf-8")) > KV_KEY_MAX:
        raise kv_refusal(f"{where} is longer than {KV_KEY_MAX} bytes", "kv_bad_key")
    return value


def _number(value: Any, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value in (float("inf"), float("-inf")) or abs(value) > 2**53:
        raise kv_refusal(f"{where} must be a finite number (at most 2^53 in size)")
    return value


def _expiry(raw: Mapping[str, Any], where: str) -> tuple[int | None, bool]:
    has_ttl, forever = "ttlSeconds" in raw, raw.get("forever")
    if forever not in (None, True):
        raise kv_refusal(f"{where}.forever must be true when given", "kv_expiry_not_specified")
    if has_ttl == (forever is True):
        raise kv_refusal(f"{where} needs exactly one of ttlSeconds and forever:true",
                         "kv_expiry_not_specified")
    if forever:
        return None, True
    ttl = raw["ttlSeconds"]
    if not is_int(ttl) or not 1 <= ttl <= KV_TTL_MAX_SECONDS:
        raise kv_refusal(f"{where}.ttlSeconds must be a whole number of seconds from 1 to "
                         f"{KV_TTL_MAX_SECONDS}", "kv_expiry_not_specified")
    return ttl, False


def _expect(raw: Mapping[str, Any], where: str) -> int | None:
    if "expect" not in raw:
        return None
    expect = raw["expect"]
    if not is_int(expect) or not 0 <= expect < 2**62:
        raise kv_refusal(f"{where}.expect must be a version (a whole number, 0 for "
                         "\"must not exist\")", "kv_bad_expect")
    return expect


def _value(raw: Mapping[str, Any], where: str) -> Any:
    if "value" not in raw:
        raise kv_refusal(f"{where}.value is required")
    try:
        text = payload_json(raw["value"], f"{where}.value")
    except Invalid as exc:
        raise kv_refusal(str(exc), "kv_bad_value") from None
    if len(text.encode("utf-8")) > KV_VALUE_MAX_BYTES:
        raise kv_refusal(f"{where}.value is larger than {KV_VALUE_MAX_BYTES} bytes",
                         "kv_value_too_large")
    return raw["value"]


def parse_kv_op(raw: Any, where: str, *, in_transaction: bool = False,
                internal: bool = False) -> KvOp:
    """One operation of a batch (or of a transaction's ``kv`` rider). ``internal``: the
    broker's own writes of a reserved namespace (lock permits)."""
    if not isinstance(raw, dict):
        raise kv_refusal(f"{where} must be an object")
    op = raw.get("op")
    if op not in _KV_OPS:
        raise kv_refusal(f"{where}.op must be one of {', '.join(_KV_OPS)}", "kv_unknown_op")
    ns = _ns(raw.get("ns"), f"{where}.ns")
    required = raw.get("required", False)
    if not isinstance(required, bool):
        raise kv_refusal(f"{where}.required must be a boolean")
    if op in ("put", "putIfAbsent", "delete", "incr") and ns.startswith(RESERVED_NS_PREFIX) \
            and not internal:
        raise kv_refusal(f"{where}: namespace {ns!r} is written by the broker only "
                         "(lock permits go through /api/v1/locks)", "kv_namespace_reserved")
    if op == "getMany":
        keys = raw.get("keys")
        if not isinstance(keys, list) or not keys or len(keys) > KV_GET_MANY_MAX_KEYS:
            raise kv_refusal(f"{where}.keys must be an array of 1 to {KV_GET_MANY_MAX_KEYS} keys")
        return KvOp("getMany", ns, keys=tuple(dict.fromkeys(
            _key(k, f"{where}.keys[{n}]") for n, k in enumerate(keys))), required=required)
    if op == "getPrefix":
        if in_transaction:
            raise kv_refusal(f"{where}: getPrefix is not allowed inside a transaction (its cost "
                             "is not bounded by the caller)", "kv_prefix_in_transaction")
        prefix = raw.get("prefix")
        if not isinstance(prefix, str) or not prefix:
            raise kv_refusal(f"{where}.prefix must be a non-empty string", "kv_prefix_required")
        _key(prefix, f"{where}.prefix")
        after = raw.get("after")
        if after is not None:
            after = _key(after, f"{where}.after")
        limit = raw.get("limit", KV_PREFIX_PAGE_DEFAULT)
        if not is_int(limit):
            raise kv_refusal(f"{where}.limit must be a whole number")
        keys_only = raw.get("keysOnly", False)
        if not isinstance(keys_only, bool):
            raise kv_refusal(f"{where}.keysOnly must be a boolean")
        return KvOp("getPrefix", ns, prefix=prefix, after=after, keys_only=keys_only,
                    limit=max(1, min(limit, KV_PREFIX_PAGE_MAX)), required=required)
    key = _key(raw.get("key"), f"{where}.key")
    if op == "get":
        return KvOp("get", ns, key, required=required)
    expect = _expect(raw, where)
    if op == "check":
        if expect is None:
            raise kv_refusal(f"{where}: check needs expect", "kv_bad_expect")
        return KvOp("check", ns, key, expect=expect, required=required)
    if op == "delete":
        if expect == 0:
            raise kv_refusal(f"{where}: a delete with expect 0 (must not exist) deletes "
                             "nothing; omit expect or give a version", "kv_bad_expect")
        return KvOp("delete", ns, key, expect=expect, required=required)
    ttl, forever = _expiry(raw, where)
    if op == "incr":
        if "expect" in raw:
            raise kv_refusal(f"{where}: incr takes no expect", "kv_bad_expect")
        bounds = {b: None if raw.get(b) is None else _number(raw[b], f"{where}.{b}")
                  for b in ("min", "max")}
        return KvOp("incr", ns, key, ttl_seconds=ttl, forever=forever, required=required,
                    delta=_number(raw.get("delta", 1), f"{where}.delta"),
                    min=bounds["min"], max=bounds["max"])
    if op == "putIfAbsent":
        if "expect" in raw:
            raise kv_refusal(f"{where}: putIfAbsent is put with expect 0; it takes no expect",
                             "kv_bad_expect")
        expect = 0
    return KvOp(op, ns, key, value=_value(raw, where), ttl_seconds=ttl, forever=forever,
                expect=expect, required=required)


def parse_kv_batch(body: Any) -> list[KvOp]:
    """``{"operations": [...]}`` of POST /api/v1/kv."""
    body = body_object(body)
    ops = array_field(body, "operations", KV_MAX_OPS, code="kv_bad_request", allow_empty=True)
    return [parse_kv_op(raw, f"operations[{n}]") for n, raw in enumerate(ops)]


# -- operator listings (routes/ops/state) -------------------------------------------------

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
    namespace = _ns(raw.get("namespace"), "namespace")
    prefix = raw.get("prefix")
    prefix = "" if prefix in (None, "") else _key(prefix, "prefix")
    after = raw.get("after")
    after = None if after in (None, "") else _key(after, "after")
    return KvListing(namespace, prefix, after,
                     _page_limit(raw.get("limit"), default_limit, most, kv_refusal),
                     _flag(raw, "includeExpired"), _flag(raw, "keysOnly"))


def parse_locks_listing(args: Mapping[str, str], default_limit: int, most: int
                        ) -> tuple[str, str | None, int]:
    """``GET /api/v1/resources/locks?prefix=&after=&limit=``: a name prefix, the name to
    continue after, a page size."""
    prefix = args.get("prefix") or ""
    if prefix:
        prefix = _lock_text(prefix, "prefix", name=True)
    after = args.get("after") or None
    if after is not None:
        after = _lock_text(after, "after", name=True)
    return prefix, after, _page_limit(args.get("limit"), default_limit, most, _lock_refusal)


# -- locks -------------------------------------------------------------------------------

LOCK_MAX_OPS = 100
LOCK_NAME_MAX_BYTES = 256
LOCK_LIMIT_MAX = 1024
LOCK_TTL_MAX_SECONDS = 7 * 24 * 3600


def _lock_refusal(message: str, code: str = "lock_bad_request") -> BadRequest:
    return BadRequest(message, code=code)


def _lock_text(value: Any, where: str, *, name: bool) -> str:
    if (not isinstance(value, str) or not value
            or len(value.encode("utf-8", "surrogatepass")) > LOCK_NAME_MAX_BYTES
            or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF
                   for c in value) or (name and "#" in value)):
        raise _lock_refusal(f"{where} must be a non-empty string of at most "
                            f"{LOCK_NAME_MAX_BYTES} bytes without control characters"
                            + (" and without '#'" if name else ""))
    return value


def _positive(raw: Mapping[str, Any], field: str, where: str, most: int, *,
              required: bool, least: int = 1) -> int | None:
    if field not in raw or raw[field] is None:
        if required:
            raise _lock_refusal(f"{where}.{field} is required")
        return None
    value = raw[field]
    if not is_int(value) or not least <= value <= most:
        raise _lock_refusal(f"{where}.{field} must be a whole number from {least} to {most}")
    return value


def parse_lock_op(raw: Any, where: str, minted_owner: str) -> LockOp:
    if not isinstance(raw, dict):
        raise _lock_refusal(f"{where} must be an object")
    op = raw.get("op")
    if op not in ("acquire", "renew", "release", "get"):
        raise _lock_refusal(f"{where}.op must be acquire, renew, release or get",
                            "lock_unknown_op")
    name = _lock_text(raw.get("name"), f"{where}.name", name=True)
    if op == "get":
        return LockOp("get", name)
    owner = raw.get("owner")
    if owner is not None:
        owner = _lock_text(owner, f"{where}.owner", name=False)
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
        raise _lock_refusal("each operation of one call must be on a different lock")
    return ops


# -- timers ------------------------------------------------------------------------------

TIMER_MAX_OPS = 1000
TIMER_KEY_MAX_BYTES = 1024
TIMER_MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000
TIMER_PAGE_DEFAULT = 100
TIMER_PAGE_MAX = 1000
SERVER_OWNED = frozenset({
    "producerSub", "producer_sub", "messageId", "message_id", "tenant", "tenantId",
    "tenant_id", "deliverAt", "deliver_at", "delaySeconds", "delay_seconds", "attempts",
    "claimToken", "claim_token", "claimedUntil"})
"""Fields of a timer the broker owns: present in an op they are a 400, never dropped."""


def _timer_refusal(message: str, code: str = "timers_bad_request") -> BadRequest:
    return BadRequest(message, code=code)


def timer_key_field(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _timer_refusal(f"{where} must be a non-empty string")
    problem = text_problem(value)
    if problem:
        raise _timer_refusal(f"{where} {problem}")
    if len(value.encode("utf-8")) > TIMER_KEY_MAX_BYTES:
        raise _timer_refusal(f"{where} is longer than {TIMER_KEY_MAX_BYTES} bytes")
    return value


def _timer_name(value: Any, where: str) -> str:
    try:
        return name_field(value, where, code="timers_bad_request")
    except BadRequest as exc:
        raise _timer_refusal(exc.message) from None


def _timer_payload(value: Any, where: str) -> Any:
    """The wire's base64 of the message body (JSON), decoded and held to the rule of
    what PostgreSQL stores."""
    if not isinstance(value, str):
        raise _timer_refusal(f"{where} must be base64 of the message's JSON body",
                             "timers_bad_payload")
    try:
        payload = ujson.loads(base64.b64decode(value, validate=True).decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise _timer_refusal(f"{where} must be base64 of the message's JSON body",
                             "timers_bad_payload") from None
    try:
        payload_json(payload, where)
    except Invalid as exc:
        raise _timer_refusal(str(exc), "timers_bad_payload") from None
    return payload


def parse_timer_op(raw: Any, where: str) -> TimerOp:
    if not isinstance(raw, dict):
        raise _timer_refusal(f"{where} must be an object")
    owned = sorted(f for f in raw if isinstance(f, str) and (f in SERVER_OWNED
                                                           or f.startswith("_")))
    if owned:
        raise _timer_refusal(f"{where}.{owned[0]} is set by the broker and cannot be sent",
                             "timers_server_owned_field")
    op = raw.get("op")
    if op not in ("schedule", "reschedule", "cancel"):
        raise _timer_refusal(f"{where}.op must be schedule, reschedule or cancel",
                             "timers_unknown_op")
    queue = _timer_name(raw.get("queue"), f"{where}.queue")
    key = timer_key_field(raw.get("timerKey"), f"{where}.timerKey")
    txn = raw.get("txn")
    if txn is not None:
        txn = _timer_name(txn, f"{where}.txn")
    if op == "cancel":
        return TimerOp("cancel", queue, key, txn)
    if raw.get("payloadZstd"):
        raise _timer_refusal(f"{where}.payloadZstd: this broker does not take zstd payloads; "
                             "send the JSON body uncompressed", "timers_zstd_unsupported")
    delay = raw.get("delayMs")
    if not is_int(delay) or abs(delay) > TIMER_MAX_DELAY_MS:
        raise _timer_refusal(f"{where}.delayMs must be a whole number of milliseconds "
                             f"(at most {TIMER_MAX_DELAY_MS})")
    partition = raw.get("partition")
    partition = "Default" if partition is None else _timer_name(partition, f"{where}.partition")
    return TimerOp(op, queue, key, txn or new_uuid7(), partition,
                   _timer_payload(raw.get("payload"), f"{where}.payload"), delay_ms=delay)


def timer_address(queue: Any, key: Any | None = None) -> tuple[str, str | None]:
    """The (queue, timerKey) of a path-style timer route."""
    return (_timer_name(queue, "queue"),
            None if key is None else timer_key_field(key, "timerKey"))


def parse_timer_batch(body: Any) -> list[TimerOp]:
    """``{"operations": [...]}`` of POST /api/v1/timers."""
    body = body_object(body)
    raw_ops = array_field(body, "operations", TIMER_MAX_OPS, code="timers_bad_request",
                          allow_empty=True)
    return [parse_timer_op(raw, f"operations[{n}]") for n, raw in enumerate(raw_ops)]


def parse_timer_page(args: Mapping[str, str]) -> tuple[str | None, int]:
    after = args.get("after") or None
    if after is not None:
        timer_key_field(after, "after")
    limit_text = args.get("limit")
    try:
        limit = TIMER_PAGE_DEFAULT if limit_text is None else int(limit_text)
    except ValueError:
        raise _timer_refusal("limit must be a whole number") from None
    return after, max(1, min(limit, TIMER_PAGE_MAX))


def parse_timer_count(args: Mapping[str, str]) -> str | None:
    """``?mode=count&prefix=``: the prefix to count a queue's pending timers under, or
    None when the call is not a count (a page). The prefix must not be empty, as the
    reference broker's count route requires (a whole queue's count is one figure of
    ``GET /api/v1/resources/timers``)."""
    mode = args.get("mode")
    if mode in (None, "", "list"):
        return None
    if mode != "count":
        raise _timer_refusal("mode must be list or count")
    return timer_key_field(args.get("prefix"), "prefix")


# -- transaction riders ------------------------------------------------------------------

def parse_riders(body: Mapping[str, Any]) -> tuple[list[KvOp], list[TimerOp]]:
    """The ``kv`` and ``timers`` arrays of POST /api/v1/transaction (absent: none)."""
    kv_raw = body.get("kv")
    timers_raw = body.get("timers")
    kv_ops = [] if kv_raw is None else [
        parse_kv_op(raw, f"kv[{n}]", in_transaction=True)
        for n, raw in enumerate(array_field(body, "kv", KV_MAX_OPS, code="kv_bad_request",
                                            allow_empty=True))]
    timer_ops = [] if timers_raw is None else [
        parse_timer_op(raw, f"timers[{n}]")
        for n, raw in enumerate(array_field(body, "timers", TIMER_MAX_OPS,
                                            code="timers_bad_request", allow_empty=True))]
    return kv_ops, timer_ops
