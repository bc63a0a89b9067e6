"""Compressed answers (docs/wire-contract.md §1.1): a large answer is sent zstd- or
gzip-encoded when the request's ``Accept-Encoding`` takes one of them. The 2.6 client (httpx)
sends ``gzip, deflate, zstd`` and decodes both, so a big pop or listing crosses the network at
a fraction of its size.

Only bodies of at least ``RESPONSE_COMPRESSION_MIN_BYTES`` are compressed: below a few KiB the
CPU costs more than the bytes saved, on loopback above all. zstd is preferred (faster at a
better ratio); both run at their fastest level. ``zstandard`` and Python's ``zlib`` do the
work; nothing here is hand-written compression.
"""
from __future__ import annotations

import zlib

import zstandard
from sanic.response import HTTPResponse

# Types whose bodies compress well; anything else (images of the dashboard) goes as it is.
_COMPRESSIBLE = ("application/json", "text/", "application/javascript",
                 "application/openapi+json", "image/svg+xml")

_zstd = zstandard.ZstdCompressor(level=1, write_content_size=True)


def accepted(header: str | None) -> str | None:
    """The encoding to answer with: ``zstd`` or ``gzip`` when ``header`` (an
    ``Accept-Encoding`` value) takes it with a q-value above 0, zstd first; else None."""
    if not header:
        return None
    taken: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        taken[name.strip().lower()] = q
    wildcard = taken.get("*", 0.0)
    for encoding in ("zstd", "gzip"):
        if taken.get(encoding, wildcard) > 0:
            return encoding
    return None


def compress(response: HTTPResponse, accept_encoding: str | None, min_bytes: int) -> None:
    """Encode ``response``'s body in place when it is worth it and the caller takes it."""
    body = getattr(response, "body", None)  # a streamed answer has none: left as it is
    if (min_bytes <= 0 or not isinstance(body, bytes) or len(body) < min_bytes
            or "content-encoding" in response.headers):
        return
    kind = (response.content_type or "").lower()
    if not kind.startswith(_COMPRESSIBLE):
        return
    response.headers["vary"] = "Accept-Encoding"
    encoding = accepted(accept_encoding)
    if encoding is None:
        return
    if encoding == "zstd":
        packed = _zstd.compress(body)
    else:
        packer = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: the gzip wrapper
        packed = packer.compress(body) + packer.flush()
    response.body = packed
    response.headers["content-encoding"] = encoding
    if "content-length" in response.headers:
        response.headers["content-length"] = str(len(packed))
