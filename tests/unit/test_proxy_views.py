"""The typed proxies (actors/proxies.py): typing only, so nothing changes at run time, and
each view is made of its actor's own methods, so an actor method is declared once.

mypy does the real check (the context's actor fields are typed with these views, so every
call a service makes is checked against the actor's signature); these tests keep the
pieces honest where mypy cannot look: each entry of a view is the actor's own method of
that name (same name, hence the same signature), `typed_proxy` hands back the very proxy.
"""
from __future__ import annotations

import pytest

from actors import proxies
from actors.batcher import Batcher
from actors.hotlist import HotList
from actors.leader_jobs import PeriodicJob
from actors.live_series import LiveSeries
from actors.pop_waiters import PopWaiterRegistry
from actors.runtime import AsyncioFuture, proxied, stop_all, typed_proxy
from actors.spool import Spool
from actors.staging_merger import StagingMerger
from actors.timer_sweeper import TimerSweeper

VIEWS = {
    proxies.PopWaitersProxy: PopWaiterRegistry,
    proxies.HotListProxy: HotList,
    proxies.SpoolProxy: Spool,
    proxies.StagingMergerProxy: StagingMerger,
    proxies.BatcherProxy: Batcher,
    proxies.TimerSweeperProxy: TimerSweeper,
    proxies.LiveSeriesProxy: LiveSeries,
    proxies.JobProxy: PeriodicJob,
}


def members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def disagreements(view: type, actor: type) -> list[str]:
    """The entries of ``view`` that are not ``actor``'s own public method of that name."""
    return sorted(name for name in members(view)
                  if getattr(view, name) is not getattr(actor, name, None)
                  or not callable(getattr(view, name)))


def test_every_view_is_listed():
    assert set(VIEWS) == {getattr(proxies, name) for name in proxies.__all__}


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda v: v.__name__)
def test_a_view_holds_its_actors_own_methods(view):
    assert members(view)
    assert disagreements(view, VIEWS[view]) == []


def test_the_check_sees_a_view_that_renames_or_invents_a_method():
    class Renamed:
        take = proxied(HotList.take_sized)  # another method under this name
        stats = proxied(HotList.stats)

    class Invented:
        stats = proxied(HotList.stats)
        kick = proxied(StagingMerger.kick)  # HotList has no kick

    assert disagreements(Renamed, HotList) == ["take"]
    assert disagreements(Invented, HotList) == ["kick"]


def test_proxied_is_the_method_itself():
    assert proxied(Batcher.submit) is Batcher.submit


async def test_typed_proxy_is_the_proxy_itself():
    async def flush(items):
        return [item * 2 for item in items]

    proxy = Batcher.start(flush, max_items=10, max_concurrent=1, name="t").proxy()
    try:
        batcher = typed_proxy(proxies.BatcherProxy, proxy)
        assert batcher is proxy
        submitted = batcher.submit([1, 2])
        assert isinstance(submitted, AsyncioFuture)
        assert await (await submitted) == [2, 4]
        assert (await batcher.stats())["requests"] == 1
    finally:
        await stop_all()
