"""The typed proxies (actors/proxies.py, broker/service/ports.py): typing only, so nothing
changes at run time, and each view names its actor's own methods.

mypy does the real check (app.py stores each view-typed proxy in a port-typed context
field); these tests keep the pieces honest where mypy cannot look: the views hold the
actors' functions themselves, `typed_proxy` hands back the very proxy, and every method a
port names is on the view app.py uses for it.
"""
from __future__ import annotations

import inspect

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
from broker.service import ports

VIEWS = {
    proxies.PopWaitersProxy: (PopWaiterRegistry, ports.PopWaitersPort),
    proxies.HotListProxy: (HotList, ports.HotListPort),
    proxies.SpoolProxy: (Spool, ports.SpoolPort),
    proxies.StagingMergerProxy: (StagingMerger, ports.StagingMergerPort),
    proxies.BatcherProxy: (Batcher, ports.BatcherPort),
    proxies.TimerSweeperProxy: (TimerSweeper, ports.TimerSweeperPort),
    proxies.LiveSeriesProxy: (LiveSeries, ports.LiveSeriesPort),
    proxies.JobProxy: (PeriodicJob, ports.JobPort),
}


def members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_every_view_and_port_is_listed():
    assert set(VIEWS) == {getattr(proxies, name) for name in proxies.__all__}
    assert {port for _, port in VIEWS.values()} == {getattr(ports, n) for n in ports.__all__}


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda v: v.__name__)
def test_a_view_holds_its_actors_own_methods(view):
    actor, _ = VIEWS[view]
    assert members(view)
    for name in members(view):
        assert getattr(view, name) is getattr(actor, name), name


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda v: v.__name__)
def test_a_port_names_only_what_its_view_has(view):
    _, port = VIEWS[view]
    assert members(port) <= members(view), members(port) - members(view)
    for name in members(port):  # and no parameter the actor's method lacks
        wanted = inspect.signature(getattr(port, name)).parameters
        offered = inspect.signature(getattr(view, name)).parameters
        assert set(wanted) <= set(offered) or any(
            p.kind is p.VAR_KEYWORD for p in offered.values()), name


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
