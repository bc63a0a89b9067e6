"""Small HTTP helpers shared by the route modules: JSON in, JSON out."""
from __future__ import annotations

from typing import Any

import ujson
from sanic import Request
from sanic.response import HTTPResponse

from broker.core.errors import BadRequest

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Authorization",
}


# Seconds a client should wait before retrying a 503 (RFC 9110 §10.2.3): every 503 of this
# broker is temporary (database unreachable or busy, spool draining), so every one says so.
RETRY_AFTER_SECONDS = 1
_RETRY_AFTER = {"Retry-After": str(RETRY_AFTER_SECONDS)}


def json(body: Any, status: int = 200) -> HTTPResponse:
    """A JSON answer; a 503 carries Retry-After, whichever route gives it."""
    return HTTPResponse(
        ujson.dumps(body, escape_forward_slashes=False, ensure_ascii=False),
        status=status,
        headers=_RETRY_AFTER if status == 503 else None,
        content_type="application/json",
    )


def error(message: str, status: int) -> HTTPResponse:
    return json({"error": message}, status=status)


def read_json(request: Request[Any, Any]) -> Any:
    """The request body as JSON; an empty or absent body is ``{}`` (docs/wire-contract.md §1.4)."""
    raw = request.body
    if not raw or not raw.strip():
        return {}
    try:
        return ujson.loads(raw)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None


def args(request: Request[Any, Any]) -> dict[str, str]:
    """Query parameters, properly percent-decoded; the last value of a repeated key wins."""
    return {key: values[-1] for key, values in request.args.items()}
