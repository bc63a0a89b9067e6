"""zstd frames a caller sends (binary push groups, a timer's payload), unpacked within a
byte budget: a frame must declare its content size, and no request may unpack past its
limit, so a small body cannot make the broker allocate a large one (zstandard does the
work; nothing here is hand-written compression)."""
from __future__ import annotations

from collections.abc import Callable

import zstandard

from broker.core.errors import BadRequest


def refused(what: str) -> BadRequest:
    return BadRequest(f"Invalid binary body: {what}")


class Budget:
    """The bytes a request may still unpack to: one limit for all of its zstd frames
    (``name``: what sets the limit, for the 413's text)."""

    __slots__ = ("limit", "left", "name")

    def __init__(self, limit: int, name: str = "MAX_BODY_BYTES") -> None:
        self.limit = self.left = limit
        self.name = name

    def spend(self, size: int, what: str) -> None:
        if size > self.left:
            raise BadRequest(f"{what} would unpack the request past the {self.limit} bytes "
                             f"this broker accepts in one request ({self.name})", 413)
        self.left -= size


def unzstd(frame: bytes, budget: Budget, what: str,
           refuse: Callable[[str], BadRequest] = refused) -> bytes:
    """One zstd frame's content, refused (by ``refuse``, a 400) when it does not declare its
    size or is not what it declares, and a 413 when it declares more than the budget has
    left."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError:
        raise refuse(f"{what} is not a zstd frame") from None
    if size < 0:
        raise refuse(f"{what}: the zstd frame must declare its content size")
    budget.spend(size, what)
    try:
        raw = zstandard.ZstdDecompressor().decompress(frame)
    except zstandard.ZstdError as exc:
        raise refuse(f"{what}: {exc}") from None
    if len(raw) != size:
        raise refuse(f"{what}: the zstd frame is not the size it declares")
    return raw
