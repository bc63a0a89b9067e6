"""Timers on the wire: the operations of ``POST /api/v1/timers`` and of a transaction's
``timers`` rider, the path-style routes' addresses, pages and counts (coded 400s:
timers_*), and the answers around the operations' results (each result element is
broker/store/timers.py's)."""
from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import ujson

from broker.core.errors import BadRequest
from broker.core.ids import new_uuid7
from broker.core.validate import Invalid, payload_json, text_problem
from broker.http.wire.common import array_field, body_object, is_int, name_field
from broker.http.wire.zstd import Budget, unzstd
from broker.service.timers import TimerOp

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


# A zstd payload (payloadZstd) may unpack to at most this: MAX_BODY_BYTES' default, the
# most a plain JSON payload could be.
TIMER_ZSTD_MAX_BYTES = 16 * 1024 * 1024


def _bad_payload(message: str) -> BadRequest:
    return _timer_refusal(message, "timers_bad_payload")


def _timer_payload(value: Any, where: str, zstd: bool = False) -> Any:
    """The wire's base64 of the message body (JSON), decoded and held to the rule of
    what PostgreSQL stores; with ``zstd`` the base64 is of one zstd frame of that body (the
    client's ``payload_zstd=True``, its caller having compressed it)."""
    if not isinstance(value, str):
        raise _bad_payload(f"{where} must be base64 of the message's JSON body")
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise _bad_payload(f"{where} must be base64 of the message's JSON body") from None
    if zstd:
        raw = unzstd(raw, Budget(TIMER_ZSTD_MAX_BYTES, "a timer's payload"), where, _bad_payload)
    try:
        payload = ujson.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise _bad_payload(f"{where} must be base64 of the message's JSON body") from None
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
    zstd = raw.get("payloadZstd", False)
    if not isinstance(zstd, bool):
        raise _timer_refusal(f"{where}.payloadZstd must be true or false")
    delay = raw.get("delayMs")
    if not is_int(delay) or abs(delay) > TIMER_MAX_DELAY_MS:
        raise _timer_refusal(f"{where}.delayMs must be a whole number of milliseconds "
                             f"(at most {TIMER_MAX_DELAY_MS})")
    partition = raw.get("partition")
    partition = "Default" if partition is None else _timer_name(partition, f"{where}.partition")
    return TimerOp(op, queue, key, txn or new_uuid7(), partition,
                   _timer_payload(raw.get("payload"), f"{where}.payload", zstd), delay_ms=delay)


def parse_timer_cancel(queue: Any, key: Any, txn: str | None) -> TimerOp:
    """``DELETE /api/v1/timers/<queue>/<key>?txn=``: a cancel, ``txn`` echoed on ``absent``."""
    return parse_timer_op({"op": "cancel", "queue": queue, "timerKey": key, "txn": txn},
                          "request")


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


def timer_batch_answer(results: list[dict]) -> dict:
    return {"results": results}


def timer_count_answer(queue: str, prefix: str, count: int) -> dict:
    return {"queue": queue, "prefix": prefix, "count": count}
