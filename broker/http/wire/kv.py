"""Key/value on the wire: the operations of ``POST /api/v1/kv``, of its path-style sugar
(``/api/v1/kv/<ns>/<key>``: an ETag carries the version, ``If-Match`` / ``If-None-Match: *``
are ``expect``) and of a transaction's ``kv`` rider (coded 400s: kv_*), and the answers
around the operations' results (each result element is broker/store/kv.py's); and the
operator's view of the one ``queen-`` namespace clients write, ``queen-supervisor``
(``GET /api/v1/status/supervision``, docs/supervision.md)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.core.errors import BadRequest
from broker.core.times import iso_milli
from broker.core.validate import Invalid, payload_json, text_problem
from broker.http.wire.common import array_field, body_object, is_int, q_str
from broker.service.kv import BatchOutcome, KvOp
from broker.service.supervision import NAMESPACE as SUPERVISION_NS
from broker.service.supervision import Instance, Pool, SupervisionView

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
CLIENT_NAMESPACES = frozenset({SUPERVISION_NS})
"""The ``queen-`` namespaces clients write like any other: ``queen-supervisor``, where
``consume().supervision(...)`` publishes each consumer's status (docs/supervision.md)."""

_KV_OPS = ("get", "getMany", "getPrefix", "put", "putIfAbsent", "delete", "incr", "check")
_NS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def kv_refusal(message: str, code: str = "kv_bad_request") -> BadRequest:
    return BadRequest(message, code=code)


def kv_namespace(value: Any, where: str) -> str:
    if (not isinstance(value, str) or not value or len(value) > KV_NS_MAX
            or not set(value) <= _NS_CHARS):
        raise kv_refusal(f"{where} must be 1 to {KV_NS_MAX} characters of A-Z a-z 0-9 . _ : -",
                         "kv_bad_namespace")
    return value


def kv_key(value: Any, where: str) -> str:
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
    ns = kv_namespace(raw.get("ns"), f"{where}.ns")
    required = raw.get("required", False)
    if not isinstance(required, bool):
        raise kv_refusal(f"{where}.required must be a boolean")
    if op in ("put", "putIfAbsent", "delete", "incr") and ns.startswith(RESERVED_NS_PREFIX) \
            and ns not in CLIENT_NAMESPACES and not internal:
        raise kv_refusal(f"{where}: namespace {ns!r} is written by the broker only "
                         "(lock permits go through /api/v1/locks)", "kv_namespace_reserved")
    if op == "getMany":
        keys = raw.get("keys")
        if not isinstance(keys, list) or not keys or len(keys) > KV_GET_MANY_MAX_KEYS:
            raise kv_refusal(f"{where}.keys must be an array of 1 to {KV_GET_MANY_MAX_KEYS} keys")
        return KvOp("getMany", ns, keys=tuple(dict.fromkeys(
            kv_key(k, f"{where}.keys[{n}]") for n, k in enumerate(keys))), required=required)
    if op == "getPrefix":
        if in_transaction:
            raise kv_refusal(f"{where}: getPrefix is not allowed inside a transaction (its cost "
                             "is not bounded by the caller)", "kv_prefix_in_transaction")
        prefix = raw.get("prefix")
        if not isinstance(prefix, str) or not prefix:
            raise kv_refusal(f"{where}.prefix must be a non-empty string", "kv_prefix_required")
        kv_key(prefix, f"{where}.prefix")
        after = raw.get("after")
        if after is not None:
            after = kv_key(after, f"{where}.after")
        limit = raw.get("limit", KV_PREFIX_PAGE_DEFAULT)
        if not is_int(limit):
            raise kv_refusal(f"{where}.limit must be a whole number")
        keys_only = raw.get("keysOnly", False)
        if not isinstance(keys_only, bool):
            raise kv_refusal(f"{where}.keysOnly must be a boolean")
        return KvOp("getPrefix", ns, prefix=prefix, after=after, keys_only=keys_only,
                    limit=max(1, min(limit, KV_PREFIX_PAGE_MAX)), required=required)
    key = kv_key(raw.get("key"), f"{where}.key")
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


def kv_batch_answer(outcome: BatchOutcome) -> dict:
    """Every operation's result; a failed required one says so (HTTP 200)."""
    body: dict = {"results": outcome.results}
    if outcome.failed is not None:
        body.update(success=False, reason="kv_precondition", failedIndex=outcome.failed.index,
                    kvReason=outcome.failed.result.get("reason"))
    return body


def _expect_headers(if_match: str | None, if_none_match: str | None) -> dict:
    """``expect`` from the conditional headers of a path-style route."""
    if if_match is not None and if_none_match is not None:
        raise kv_refusal("give If-Match or If-None-Match, not both", "kv_bad_expect")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise kv_refusal("If-None-Match takes only *", "kv_bad_expect")
        return {"expect": 0}
    if if_match is not None:
        tag = if_match.strip().removeprefix("W/").strip('"')
        if not tag.isdigit():
            raise kv_refusal("If-Match must be an ETag of this route (a version)",
                             "kv_bad_expect")
        return {"expect": int(tag)}
    return {}


def parse_kv_get(ns: str, key: str) -> KvOp:
    """``GET /api/v1/kv/<ns>/<key>``."""
    return parse_kv_op({"op": "get", "ns": ns, "key": key}, "request")


def parse_kv_put(ns: str, key: str, body: Any, if_match: str | None,
                 if_none_match: str | None) -> KvOp:
    """``PUT /api/v1/kv/<ns>/<key>``: the body is a put's value and expiry."""
    fields = dict(body_object(body))
    for field in ("op", "ns", "key", "expect"):
        if field in fields:
            raise kv_refusal(f"{field} comes from the path and the headers, not the body")
    return parse_kv_op({**fields, "op": "put", "ns": ns, "key": key,
                        **_expect_headers(if_match, if_none_match)}, "request")


def parse_kv_delete(ns: str, key: str, if_match: str | None,
                    if_none_match: str | None) -> KvOp:
    """``DELETE /api/v1/kv/<ns>/<key>``."""
    return parse_kv_op({"op": "delete", "ns": ns, "key": key,
                        **_expect_headers(if_match, if_none_match)}, "request")


def kv_key_answer(op: KvOp, result: dict) -> tuple[dict, int, str | None]:
    """(body, status, ETag) of a path-style route: the operation's result, its version as
    the ETag when it was found or applied. A get of a key that is not live is a 404; a
    write whose precondition failed a 412, but a delete without one is idempotent (a key
    that is not there: 200, applied false)."""
    if op.op == "get":
        if not result["found"]:
            return ({"error": "kv_not_found", "detail": f"no live key {op.key!r} in {op.ns!r}"},
                    404, None)
        return result, 200, _etag(result["version"])
    if not result.get("applied"):
        return result, 412 if op.op == "put" or op.expect is not None else 200, None
    return result, 200, _etag(result.get("version"))


def _etag(version: int | None) -> str | None:
    return None if version is None else f'"{version}"'


# -- the supervision namespace's operator view ---------------------------------------------

SUPERVISION_GROUP_MAX = 255


def parse_supervision(args: Mapping[str, Any]) -> str | None:
    """``GET /api/v1/status/supervision?group=``: one supervision group, or every one."""
    group = q_str(args, "group")
    if group is None:
        return None
    if len(group) > SUPERVISION_GROUP_MAX or "/" in group or text_problem(group):
        raise BadRequest(f"group must be 1 to {SUPERVISION_GROUP_MAX} characters of storable "
                         "text without /")
    return group


def _pool(p: Pool) -> dict:
    return {"name": p.name, "queue": p.queue, "namespace": p.namespace, "task": p.task,
            "consumerGroup": p.consumer_group, "desired": p.desired, "running": p.running,
            "busy": p.busy, "completed": p.completed, "failed": p.failed,
            "lastCompletedAt": iso_milli(p.last_completed_at),
            "oldestInflightSeconds": p.oldest_inflight_seconds}


def _instance(i: Instance) -> dict:
    return {"instance": i.instance, "key": i.key, "status": i.status, "problem": i.problem,
            "state": i.state, "stale": i.stale, "schema": i.schema, "hostname": i.hostname,
            "pid": i.pid, "engine": i.engine, "executionModel": i.execution_model,
            "startedAt": iso_milli(i.started_at), "updatedAt": iso_milli(i.updated_at),
            "uptimeSeconds": i.uptime_seconds, "ageSeconds": i.age_seconds,
            "heartbeatTimeout": i.heartbeat_timeout, "publishedAt": iso_milli(i.published_at),
            "expiresAt": iso_milli(i.expires_at), "pools": [_pool(p) for p in i.pools]}


def _counts(instances: list[Instance]) -> dict:
    """``running``: running and heard from in time; ``stale``: not stopped and not heard
    from within its heartbeat timeout; ``problems``: not decoded (status other than ok)."""
    return {"instances": len(instances),
            "running": sum(i.state == "running" and i.stale is False for i in instances),
            "stopped": sum(i.state == "stopped" for i in instances),
            "stale": sum(bool(i.stale) and i.state != "stopped" for i in instances),
            "problems": sum(i.status != "ok" for i in instances)}


def supervision_answer(view: SupervisionView) -> dict:
    """Instances grouped by supervision group (groups and instances in key order)."""
    groups: dict[str, list[Instance]] = {}
    for i in view.instances:
        groups.setdefault(i.group, []).append(i)
    return {"namespace": SUPERVISION_NS, "asOf": iso_milli(view.as_of), "group": view.group,
            "groups": [{"group": name, "counts": _counts(members),
                        "instances": [_instance(i) for i in members]}
                       for name, members in groups.items()],
            "totals": {"groups": len(groups), **_counts(view.instances)},
            "keys": {"live": view.keys, "heads": view.heads, "chunks": view.chunks},
            "truncated": view.truncated}
