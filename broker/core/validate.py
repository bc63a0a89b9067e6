"""The acceptance rule: what PostgreSQL will store, checked before a push is acknowledged.

A push is answered ``queued`` or ``buffered`` only when every item passes these
checks. The same rule runs on the direct path, on the spool path (maintenance,
an outage, a partition with a spool backlog) and inside transactions, and once
more on every spooled event at replay (files written by an older version were
never checked). Without it, a value PostgreSQL refuses could be acknowledged as
``buffered`` and only be discovered at replay, when the client is gone.

What PostgreSQL refuses, and so what is checked here:

* a NUL character in any text (``text`` columns and ``jsonb`` strings and keys
  both refuse ``\\u0000``);
* text that is not valid UTF-8 (a lone surrogate such as ``\\ud800``);
* a non-finite number anywhere in a payload (``NaN``, ``Infinity``, or a
  literal like ``1e400`` that parses to infinity): ``jsonb`` has none;
* a trace id that is not a canonical 36-character UUID (PostgreSQL's ``uuid``
  also takes braces and other spellings; Queen's clients send the canonical one,
  and one spelling keeps traces searchable);
* names longer than ``MAX_NAME`` characters.

Every check names what is wrong and where (``items[3].payload.a[2]``), never a
driver's words.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import ujson

MAX_NAME = 255

_CANONICAL_UUID = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class Invalid(ValueError):
    """A value PostgreSQL would refuse; ``str()`` is ``"<where>: <what>"``."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")
        self.where = where
        self.what = what


def text_problem(value: str) -> str | None:
    """Why PostgreSQL would refuse this text, or None."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8 (a lone surrogate such as \\ud800)"
    return None


def check_text(value: str, where: str) -> None:
    problem = text_problem(value)
    if problem is not None:
        raise Invalid(where, problem)


def name_problem(value: Any, required: bool = True) -> str | None:
    """Why a queue, partition or transaction id could not be stored, or None."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > MAX_NAME:
        return f"must be at most {MAX_NAME} characters, got {len(value)}"
    return text_problem(value)


def check_name(value: Any, where: str, *, required: bool = True) -> None:
    problem = name_problem(value, required)
    if problem is not None:
        raise Invalid(where, problem)


def trace_id_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and _CANONICAL_UUID.match(value)):
        return None
    return f"must be a UUID like 0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a, got {value!r}"[:200]


def payload_json(payload: Any, where: str) -> str:
    """The payload as the JSON text PostgreSQL will be sent, or :class:`Invalid`.

    The push has to serialize the payload once anyway; serializing it here
    makes the check almost free: UTF-8 encoding refuses a lone surrogate, ujson writes a
    NUL as ``\\u0000``, NaN as ``NaN`` and infinities as ``Infinity``. Only when
    one of those letters shows up (perhaps inside an ordinary string) does the
    exact walk of :func:`check_payload` decide."""
    try:
        text = ujson.dumps(payload, ensure_ascii=False, escape_forward_slashes=False)
        if not text.isascii():
            text.encode("utf-8")  # ujson passes lone surrogates through; this refuses them
    except (UnicodeEncodeError, OverflowError, TypeError, ValueError):
        check_payload(payload, where)  # names the place
        raise Invalid(where, "is not storable as JSON") from None
    if "\\u0000" in text or "NaN" in text or "Infinity" in text:
        check_payload(payload, where)
    return text


def check_payload(payload: Any, where: str) -> None:
    """Every string (keys too) and number of a JSON value; raises :class:`Invalid`
    naming the first offending place. Iterative: ujson already caps nesting at
    1024 levels, and a stack never overflows here."""
    stack: list[tuple[Any, str]] = [(payload, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            check_text(value, at)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise Invalid(at, f"is {value!r}: JSON payloads cannot hold NaN or Infinity")
        elif isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):  # only from Python callers; JSON keys are strings
                    raise Invalid(at, f"has a non-string key {key!r}")
                problem = text_problem(key)
                if problem is not None:
                    raise Invalid(f"{at} key {key!r}"[:200], problem)
            # reversed: the stack pops the first key first, so the first problem is named
            stack.extend((item, f"{at}.{key}" if len(at) < 200 else at)
                         for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, f"{at}[{i}]" if len(at) < 200 else at)
                         for i, item in reversed(list(enumerate(value))))
        elif value is None or isinstance(value, (bool, int)):
            pass
        else:
            raise Invalid(at, f"is not a JSON value ({type(value).__name__})")


def _names_storable(queue: Any, partition: Any, transaction_id: Any, trace_id: Any,
                    producer_sub: Any) -> bool:
    """The fast screen of :func:`check_push`: True when every name surely
    passes (one join, one scan); False sends the item through the exact checks."""
    if (type(queue) is not str or type(partition) is not str or type(transaction_id) is not str
            or not queue or not partition or not transaction_id
            or len(queue) > MAX_NAME or len(partition) > MAX_NAME
            or len(transaction_id) > MAX_NAME):
        return False
    if producer_sub is not None and (type(producer_sub) is not str or len(producer_sub) > MAX_NAME):
        return False
    joined = queue + partition + transaction_id + (producer_sub or "")
    if "\x00" in joined or not (joined.isascii() or text_problem(joined) is None):
        return False
    return trace_id is None or (type(trace_id) is str and _CANONICAL_UUID.match(trace_id) is not None)


def check_push(queue: Any, partition: Any, transaction_id: Any, trace_id: Any, payload: Any,
               where: str, producer_sub: Any = None) -> str:
    """One push item (or one spooled event): raises :class:`Invalid`, or
    returns the payload's JSON text (what the store sends PostgreSQL)."""
    if not _names_storable(queue, partition, transaction_id, trace_id, producer_sub):
        for field, value, required in (("queue", queue, True), ("partition", partition, True),
                                       ("transactionId", transaction_id, True),
                                       ("producerSub", producer_sub, False)):
            problem = name_problem(value, required)
            if problem is not None:
                raise Invalid(f"{where}.{field}", problem)
        problem = trace_id_problem(trace_id)
        if problem is not None:
            raise Invalid(f"{where}.traceId", problem)
    return payload_json(payload, where + ".payload")


def event_problem(event: Mapping[str, Any]) -> str | None:
    """Why a spooled event could never be stored, or None. Encrypted events
    carry an envelope the broker built itself; its payload is still checked."""
    if not isinstance(event, Mapping):
        return "not a JSON object"
    try:
        check_push(event.get("queue"), event.get("partition") or "Default",
                   event.get("transactionId"), event.get("traceId") or None,
                   event.get("payload"), "event", event.get("producerSub"))
    except Invalid as exc:
        return str(exc)
    return None
