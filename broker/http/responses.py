"""Small HTTP helpers shared by the route modules: JSON in, JSON out."""
from __future__ import annotations

from typing import Any

import ujson
from sanic import Request
from sanic.helpers import has_message_body
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


# Header names whose values come from a small fixed set (this module's constants, Sanic's
# own "keep-alive"/"close" and "", the compression middleware's two encodings): their
# encoded (name, value) pairs are kept, so a response does not sanitise and encode the
# same constant bytes again. Any other header takes Sanic's path, uncached, so the cache
# cannot grow with what requests bring.
_CONSTANT_NAMES = frozenset({
    "content-type", "connection", "alt-svc", "vary", "content-encoding", "Retry-After",
    *CORS_HEADERS, "Access-Control-Max-Age"})
_ENCODED: dict[tuple[str, Any], tuple[bytes, bytes]] = {}


class LeanResponse(HTTPResponse):
    """Sanic's HTTPResponse with the header encoding of constant values done once.

    Sanic sanitises and encodes every header of every response (``processed_headers``):
    ~25 µs of a small answer on this project's hot paths, for values that never change.
    The bytes written are the same (tests/unit/test_responses.py compares them)."""

    __slots__ = ()

    @property
    def processed_headers(self):  # a list where Sanic builds a generator: both iterate
        if has_message_body(self.status):
            self.headers.setdefault("content-type", self.content_type)
        out = []
        sanitize = self._sanitize_header_value
        for name, value in self.headers.items():
            if name == "content-length" and value.__class__ is int:  # set by Sanic
                out.append((b"content-length", b"%d" % value))
                continue
            pair = _ENCODED.get((name, value))
            if pair is None:
                pair = (sanitize(name).encode("ascii"),
                        sanitize(f"{value}").encode(errors="surrogateescape"))
                if name in _CONSTANT_NAMES and len(_ENCODED) < 256:
                    _ENCODED[(name, value)] = pair
            out.append(pair)
        return out


def dumps(value: Any) -> str:
    """A value as JSON text, spelled as every JSON answer spells it."""
    return ujson.dumps(value, escape_forward_slashes=False, ensure_ascii=False)


def json(body: Any, status: int = 200) -> HTTPResponse:
    """A JSON answer; a 503 carries Retry-After, whichever route gives it."""
    return json_text(dumps(body), status)


def json_text(text: str, status: int = 200) -> HTTPResponse:
    """A JSON answer already written as text (``json``, and wire/pop.py's pop_answer)."""
    return LeanResponse(text, status=status, headers=_RETRY_AFTER if status == 503 else None,
                        content_type="application/json")


def error(message: str, status: int) -> HTTPResponse:
    return json({"error": message}, status=status)


NOT_JSON = "the request body is not valid JSON (send one JSON document, e.g. an object {...})"


def read_json(request: Request[Any, Any]) -> Any:
    """The request body as JSON; an empty or absent body is ``{}`` (docs/wire-contract.md §1.4).
    Every route that takes a JSON body reads it here (tests/unit/test_json_bodies.py), so a
    body that is not JSON is the same 400 on each; ujson's own reason is left out, as it
    names its parser's state ("when decoding 'null'"), not the caller's mistake."""
    raw = request.body
    if not raw or not raw.strip():
        return {}
    try:
        return ujson.loads(raw)
    except (ValueError, TypeError):
        raise BadRequest(NOT_JSON) from None


def args(request: Request[Any, Any]) -> dict[str, str]:
    """Query parameters, properly percent-decoded; the last value of a repeated key wins."""
    return {key: values[-1] for key, values in request.args.items()}
