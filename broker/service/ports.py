"""What the services (and the routes) call on the actors, as Protocols: the ports.

Each actor runs behind a pykka proxy, whose method calls return an awaitable future (an
``actors.runtime.AsyncioFuture``): awaited, it gives what the actor's method returned
(what its coroutine returned, for an ``async def``). A call nobody awaits still reaches the
actor (``merger.kick()``): the future is dropped. So each port method returns an
``Awaitable`` of the actor method's result, and lists only what is called through
:class:`~broker.service.context.BrokerContext`, with only the parameters that are passed.

These are for the type checker: nothing here is instantiated or checked at run time.
broker/http/app.py stores the proxies it starts, typed with the views of actors/proxies.py,
in the context's fields typed with these ports; that assignment is where mypy checks that
each actor offers what is called on it.
"""
from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from actors.autopilot import Ask, Decision
    from actors.hotlist import SizedTake, Take

__all__ = [
    "BatcherPort",
    "HotListPort",
    "JobPort",
    "LiveSeriesPort",
    "PopWaitersPort",
    "SpoolPort",
    "StagingMergerPort",
    "TimerSweeperPort",
]


class PopWaitersPort(Protocol):
    """actors.pop_waiters.PopWaiterRegistry: the parked pops (their figures; the pops park
    through ``long_poll`` on the actor's ref, ``BrokerContext.waiters``)."""

    def parked_count(self) -> Awaitable[int]: ...

    def wake_stats(self) -> Awaitable[dict[str, int]]: ...

    def close(self) -> Awaitable[int]: ...


class HotListPort(Protocol):
    """actors.hotlist.HotList: the candidate partitions of wildcard pops."""

    def take(self, queue: str, group: str, k: int) -> Awaitable[Take]: ...

    def take_sized(self, queue: str, group: str, ask: Ask, extra: int) -> Awaitable[SizedTake]: ...

    def check_in(self, queue: str, group: str,
                 verdicts: Sequence[tuple[str, int, str, Any]], now: float | None = ...,
                 took: tuple[list[str], int, float | None, bool] | None = ...
                 ) -> Awaitable[bool]: ...

    def size(self, queue: str, group: str, ask: Ask) -> Awaitable[Decision]: ...

    def pilot_took(self, queue: str, group: str, partitions: list[str], messages: int,
                   lease_s: float | None, full: bool) -> Awaitable[None]: ...

    def wait_ms(self, queue: str | None) -> Awaitable[int]: ...

    def seed(self, queue: str, group: str, partitions: Iterable[str]) -> Awaitable[bool]: ...

    def seed_aborted(self, queue: str, group: str) -> Awaitable[None]: ...

    def reconcile(self, at: float | None = ...) -> Awaitable[int]: ...

    def stats(self) -> Awaitable[dict[str, int]]: ...


class SpoolPort(Protocol):
    """actors.spool.Spool: the file buffer of pushes the database could not take, and its
    quarantine."""

    def append(self, events: list[dict[str, Any]]) -> Awaitable[asyncio.Future[None]]: ...

    def stats(self) -> Awaitable[dict[str, Any]]: ...

    def quarantine_list(self) -> Awaitable[list[dict[str, Any]]]: ...

    def quarantine_get(self, ident: str) -> Awaitable[dict[str, Any] | None]: ...

    def quarantine_discard(self, ident: str) -> Awaitable[bool]: ...

    def quarantine_replay(self, ident: str,
                          overrides: Mapping[str, str]) -> Awaitable[dict[str, Any]]: ...


class StagingMergerPort(Protocol):
    """actors.staging_merger.StagingMerger: merges queen.staged into the queues."""

    def kick(self) -> Awaitable[None]: ...

    def stats(self) -> Awaitable[dict[str, Any]]: ...


class BatcherPort(Protocol):
    """actors.batcher.Batcher: folds concurrent requests into one statement. ``submit``
    answers, once the actor took the items, a future of their results (one per item, in
    order): ``await (await batcher.submit(items))``."""

    def submit(self, items: Sequence[Any]) -> Awaitable[asyncio.Future[Any]]: ...


class TimerSweeperPort(Protocol):
    """actors.timer_sweeper.TimerSweeper: delivers due timers."""

    def due_in(self, seconds: float) -> Awaitable[None]: ...

    def stats(self) -> Awaitable[dict[str, Any]]: ...


class LiveSeriesPort(Protocol):
    """actors.live_series.LiveSeries: per-second throughput and depth history."""

    def throughput_series(self, seconds: int) -> Awaitable[list[tuple[int, int, int, int]]]: ...

    def depth_series(self, queue: str) -> Awaitable[list[tuple[float, int | None]]]: ...

    def stats(self) -> Awaitable[dict[str, Any]]: ...


class JobPort(Protocol):
    """actors.leader_jobs.PeriodicJob: one of the leader jobs (retention, stats, metrics)."""

    def run_once(self, **options: Any) -> Awaitable[dict[str, Any]]: ...

    def stats(self) -> Awaitable[dict[str, Any]]: ...
