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
from typing import Any, Mapping

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


def check_name(value: Any, where: str, *, required: bool = True) -> None:
    """A queue, partition or transaction id: a non-empty string PostgreSQL stores."""
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise Invalid(where, "must be a non-empty string")
    if len(value) > MAX_NAME:
        raise Invalid(where, f"must be at most {MAX_NAME} characters, got {len(value)}")
    check_text(value, where)


def check_trace_id(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not _CANONICAL_UUID.match(value):
        raise Invalid(where, f"must be a UUID like 0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a, got {value!r}"[:200])


def check_payload(payload: Any, where: str) -> None:
    """Every string (keys too) and number of a JSON value. Iterative: ujson
    already caps nesting at 1024 levels, and a stack never overflows here."""
    stack: list[tuple[Any, str]] = [(payload, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            check_text(value, at)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise Invalid(at, f"is {value!r}: JSON payloads cannot hold NaN or Infinity")
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):  # only from Python callers; JSON keys are strings
                    raise Invalid(at, f"has a non-string key {key!r}")
                problem = text_problem(key)
                if problem is not None:
                    raise Invalid(f"{at} key {key!r}"[:200], problem)
                stack.append((item, f"{at}.{key}" if len(at) < 200 else at))
        elif isinstance(value, list):
            stack.extend((item, f"{at}[{i}]" if len(at) < 200 else at)
                         for i, item in enumerate(value))
        elif value is None or isinstance(value, (bool, int)):
            pass
        else:
            raise Invalid(at, f"is not a JSON value ({type(value).__name__})")


def check_push(queue: Any, partition: Any, transaction_id: Any, trace_id: Any, payload: Any,
               where: str, producer_sub: Any = None) -> None:
    """One push item (or one spooled event): raises :class:`Invalid`."""
    check_name(queue, f"{where}.queue")
    check_name(partition, f"{where}.partition")
    check_name(transaction_id, f"{where}.transactionId")
    check_trace_id(trace_id, f"{where}.traceId")
    check_name(producer_sub, f"{where}.producerSub", required=False)
    check_payload(payload, f"{where}.payload")


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
