"""LeanResponse (broker/http/responses.py) writes the header bytes Sanic's HTTPResponse
writes, for any headers, and its cache of encoded constants cannot grow with requests."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sanic.headers import format_http1_response
from sanic.response import HTTPResponse

from broker.http import responses
from broker.http.responses import CORS_HEADERS, LeanResponse

NAMES = st.sampled_from(["content-type", "connection", "alt-svc", "vary", "content-encoding",
                         "Retry-After", "X-Custom", "content-length", *CORS_HEADERS])
# Header values a route or a request could bring, CR/LF (header injection) included.
VALUES = st.one_of(st.text(max_size=40), st.integers(min_value=0, max_value=10**9),
                   st.sampled_from(["keep-alive", "close", "", "gzip", "zstd", "*",
                                    "a\r\nSet-Cookie: x=1", "v\nw"]))


def wire_bytes(cls: type[HTTPResponse], status: int, content_type: str,
               headers: list[tuple[str, object]]) -> bytes:
    r = cls(b"{}", status=status, content_type=content_type)
    for name, value in headers:
        r.headers[name] = value
    return format_http1_response(status, r.processed_headers)


@settings(max_examples=400, deadline=None)
@given(status=st.sampled_from([200, 201, 204, 304, 400, 409, 503]),
       content_type=st.sampled_from(["application/json", "text/plain; charset=utf-8"]),
       headers=st.lists(st.tuples(NAMES, VALUES), max_size=10))
def test_same_bytes_as_sanic(status, content_type, headers):
    # Twice: the second time the constants come from the cache.
    for _ in range(2):
        assert (wire_bytes(LeanResponse, status, content_type, headers)
                == wire_bytes(HTTPResponse, status, content_type, headers))


def test_the_cache_is_bounded_and_keeps_only_constant_names():
    for n in range(5000):
        wire_bytes(LeanResponse, 200, "application/json",
                   [("X-Request-Echo", f"v{n}"), ("vary", f"made-up-{n}"),
                    ("content-length", n)])
    assert len(responses._ENCODED) <= 256
    assert not any(name == "X-Request-Echo" for name, _ in responses._ENCODED)


def test_json_answers_are_lean_and_503s_say_retry_after():
    r = responses.json({"a": 1}, status=503)
    assert isinstance(r, LeanResponse)
    assert b"Retry-After: 1\r\n" in format_http1_response(503, r.processed_headers)
