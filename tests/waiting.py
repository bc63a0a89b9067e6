"""The one way tests wait for a condition: poll it, return its first truthy value, and fail
the test with ``AssertionError`` when it never comes.

    wait_until(lambda: parked(b) == 1, 10, "pop parked on B")             # sync tests
    stats = await wait_until_async(lambda: spool.stats(), 5, "spool stats")  # async tests

A timeout is a failure, never a value to check: a helper that returned the last falsy value
let a caller that forgot its ``assert`` pass on a timeout. Timeouts bound how long a broken
run takes to fail, not how fast a correct one must be, so they are generous; a test whose
point is speed (a wake versus a timer) asserts on the time it measured itself.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["wait_until", "wait_until_async"]


def _timed_out(what: str, timeout: float, last: Any) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def wait_until(condition: Callable[[], T], timeout: float = 15.0, what: str = "condition",
               *, interval: float = 0.05) -> T:
    """Call ``condition()`` every ``interval`` s until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, value)
        time.sleep(interval)


async def wait_until_async(condition: Callable[[], T | Awaitable[T]], timeout: float = 15.0,
                           what: str = "condition", *, interval: float = 0.01) -> T:
    """``wait_until`` for async tests: ``condition`` may be a plain function or return an
    awaitable (an ``async def``, an actor proxy call), which is awaited each round."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, value)
        await asyncio.sleep(interval)
