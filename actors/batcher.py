"""Folds concurrent requests of one kind into one SQL round trip.

Requests that arrive while earlier round trips are in flight wait in the
actor and go out together in the next one (group commit): under load, many
small HTTP requests become few large statements; when idle, a request goes
out at once with no added delay.

If a folded round trip fails because of what one request holds (the
database rejected a value), each request in it is retried on its own, so one
request the database rejects never fails its neighbours (libqueen's fused
batches did; docs/behaviour.md §11 says not to copy that). If it fails for a reason that
would fail every request alike (the database is unreachable, busy), every
request fails at once with that error: retrying them one by one would only
make the N-th caller wait N timeouts before it can fall back to the spool.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loguru import logger

from actors.runtime import AsyncioActor

_FLUSH_DONE = object()

Flush = Callable[[Sequence[Any]], Awaitable[Sequence[Any]]]


class Batcher(AsyncioActor):
    """``submit(items)`` answers a future of the results for exactly those items.

    ``flush(items)`` must return one result per item, in order.
    """

    def __init__(self, flush: Flush, *, max_items: int, max_concurrent: int, name: str,
                 retry_alone: Callable[[BaseException], bool] = lambda exc: True):
        super().__init__()
        self._flush = flush
        self._retry_alone = retry_alone
        self._max_items = max_items
        self._max_concurrent = max_concurrent
        self._name = name
        self._pending: list[tuple[Sequence[Any], asyncio.Future]] = []
        self._in_flight = 0
        self.round_trips = 0
        self.requests = 0

    def submit(self, items: Sequence[Any]) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        self.requests += 1
        self._maybe_flush()
        return future

    def stats(self) -> dict:
        return {"requests": self.requests, "round_trips": self.round_trips,
                "in_flight": self._in_flight, "pending": len(self._pending)}

    def on_receive(self, message: Any) -> None:
        if message is _FLUSH_DONE:
            self._in_flight -= 1
            self._maybe_flush()

    def _maybe_flush(self) -> None:
        while self._pending and self._in_flight < self._max_concurrent:
            group: list[tuple[Sequence[Any], asyncio.Future]] = []
            count = 0
            while self._pending and (not group or count + len(self._pending[0][0]) <= self._max_items):
                items, future = self._pending.pop(0)
                group.append((items, future))
                count += len(items)
            self._in_flight += 1
            self.round_trips += 1
            asyncio.get_running_loop().create_task(self._flush_group(group))

    async def _flush_group(self, group: list[tuple[Sequence[Any], asyncio.Future]]) -> None:
        try:
            await self._run_group(group)
        finally:
            # Back through the inbox: only the actor's own task touches its state.
            self.actor_ref.tell(_FLUSH_DONE)

    async def _run_group(self, group: list[tuple[Sequence[Any], asyncio.Future]]) -> None:
        flat = [item for items, _ in group for item in items]
        try:
            results = await self._flush(flat)
        except Exception as exc:
            if len(group) == 1 or not self._retry_alone(exc):
                for _items, future in group:
                    _settle(future, exc=exc)
                return
            logger.debug("{}: folded round trip of {} requests failed ({}); retrying one by one",
                         self._name, len(group), exc)
            for items, future in group:
                try:
                    _settle(future, value=list(await self._flush(items)))
                except Exception as one_exc:
                    _settle(future, exc=one_exc)
            return
        offset = 0
        for items, future in group:
            _settle(future, value=list(results[offset:offset + len(items)]))
            offset += len(items)


def _settle(future: asyncio.Future, *, value: Any = None, exc: BaseException | None = None) -> None:
    if future.done():  # the caller went away (cancelled); nothing to tell
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
