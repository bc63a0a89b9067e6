"""Proxy views: each actor's proxy as the type checker sees it (see actors/runtime.py).

pykka types every proxy attribute as Any. Each class here lists one actor's public
methods through `proxied`, so a call through ``typed_proxy(View, ref.proxy())`` is
checked against the actor's own signature, and its result is the AsyncioFuture the proxy
really returns. An actor method is declared once, on the actor: a view names it and takes
its signature from it (tests/unit/test_proxy_views.py checks that every view entry is the
actor's own method of that name). The broker's context (broker/service/context.py) types
its actor fields with these views, so mypy checks each call a service makes on an actor.

Nothing here runs per call: `proxied` returns the method itself, the classes are never
instantiated.
"""
from __future__ import annotations

from actors.batcher import Batcher
from actors.hotlist import HotList
from actors.leader_jobs import PeriodicJob
from actors.live_series import LiveSeries
from actors.pop_waiters import PopWaiterRegistry
from actors.runtime import proxied
from actors.spool import Spool
from actors.staging_merger import StagingMerger
from actors.timer_sweeper import TimerSweeper

__all__ = [
    "BatcherProxy",
    "HotListProxy",
    "JobProxy",
    "LiveSeriesProxy",
    "PopWaitersProxy",
    "SpoolProxy",
    "StagingMergerProxy",
    "TimerSweeperProxy",
]


class PopWaitersProxy:
    register = proxied(PopWaiterRegistry.register)
    unregister = proxied(PopWaiterRegistry.unregister)
    wake = proxied(PopWaiterRegistry.wake)
    wake_many = proxied(PopWaiterRegistry.wake_many)
    parked_count = proxied(PopWaiterRegistry.parked_count)
    stats = proxied(PopWaiterRegistry.stats)
    wake_stats = proxied(PopWaiterRegistry.wake_stats)
    close = proxied(PopWaiterRegistry.close)


class HotListProxy:
    mark = proxied(HotList.mark)
    mark_many = proxied(HotList.mark_many)
    pending_dirty = proxied(HotList.pending_dirty)
    drain_dirty = proxied(HotList.drain_dirty)
    take = proxied(HotList.take)
    take_sized = proxied(HotList.take_sized)
    size = proxied(HotList.size)
    pilot_took = proxied(HotList.pilot_took)
    wait_ms = proxied(HotList.wait_ms)
    check_in = proxied(HotList.check_in)
    ack_released = proxied(HotList.ack_released)
    seed = proxied(HotList.seed)
    seed_aborted = proxied(HotList.seed_aborted)
    reconcile = proxied(HotList.reconcile)
    forget_queue = proxied(HotList.forget_queue)
    stats = proxied(HotList.stats)


class SpoolProxy:
    identity = proxied(Spool.identity)
    append = proxied(Spool.append)
    finalize = proxied(Spool.finalize)
    pause = proxied(Spool.pause)
    resume = proxied(Spool.resume)
    kick = proxied(Spool.kick)
    backlog_ref = proxied(Spool.backlog_ref)
    recover = proxied(Spool.recover)
    quarantine_list = proxied(Spool.quarantine_list)
    quarantine_get = proxied(Spool.quarantine_get)
    quarantine_discard = proxied(Spool.quarantine_discard)
    quarantine_replay = proxied(Spool.quarantine_replay)
    stats = proxied(Spool.stats)


class StagingMergerProxy:
    kick = proxied(StagingMerger.kick)
    rate = proxied(StagingMerger.rate)
    stats = proxied(StagingMerger.stats)


class BatcherProxy:
    submit = proxied(Batcher.submit)
    stats = proxied(Batcher.stats)


class TimerSweeperProxy:
    due_in = proxied(TimerSweeper.due_in)
    stats = proxied(TimerSweeper.stats)


class LiveSeriesProxy:
    sample = proxied(LiveSeries.sample)
    sample_depth = proxied(LiveSeries.sample_depth)
    record_depths = proxied(LiveSeries.record_depths)
    throughput_series = proxied(LiveSeries.throughput_series)
    depth_series = proxied(LiveSeries.depth_series)
    stats = proxied(LiveSeries.stats)


class JobProxy:
    """Any of the leader jobs (actors/leader_jobs.py): retention, stats, metrics."""

    run_once = proxied(PeriodicJob.run_once)
    stats = proxied(PeriodicJob.stats)
