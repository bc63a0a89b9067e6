"""What the parsing of every route shares (docs/wire-contract.md §1.5, §1.6): a body that
must be a JSON object, query-string values, names, arrays with a bound; and a queue's
options as the answers show them. Each request kind's own parsing and shaping is in its
module beside this one (push, pop, ack, transaction, queues, ...).

Parsing never touches the database; a request that fails here has written nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from broker.core.errors import BadRequest
from broker.core.validate import MAX_NAME, text_problem

# -- bodies -------------------------------------------------------------------------------

def body_object(body: Any, what: str = "Request body") -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return body


def required_name(value: Any, message: str) -> str:
    """A queue or partition name of a push or a configure: ``message`` when it is not a
    non-empty string of at most MAX_NAME characters."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise BadRequest(message)
    return value


def is_int(value: Any) -> TypeGuard[int]:
    """An integer, and not a bool (which Python counts as one)."""
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


# -- query strings ------------------------------------------------------------------------

TRUE_STRINGS = ("true", "1")


def q_bool(args: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = args.get(name)
    if value is None or value == "":
        return default
    if value.lower() in TRUE_STRINGS:
        return True
    if value.lower() in ("false", "0"):
        return False
    raise BadRequest(f"{name} must be true or false, got {value!r}")


INT32_MAX = 2**31 - 1


def q_int(args: Mapping[str, Any], name: str, default: int, minimum: int | None = None,
          maximum: int = INT32_MAX) -> int:
    value = args.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        return minimum
    return min(number, maximum)


def q_str(args: Mapping[str, Any], name: str) -> str | None:
    value = args.get(name)
    return value if value not in (None, "") else None


# -- answers ------------------------------------------------------------------------------

