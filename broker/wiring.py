"""The composition root: each subsystem of a broker started and wired, one function each.

``broker.http.app.create_app`` calls these in order while the server starts, before any
request is served, filling the :class:`~broker.service.context.BrokerContext`; ``stop``
undoes them after the server stopped. This is the one place that knows the store, the
actors and the services at once: an actor's callbacks up to the services are bound here
(the services' functions with the context), typed by what the actor's own module declares
(``actors.spool.upload.Upload``, ``actors.timer_sweeper.Deliver``...). Each proxy is typed
with its actor's view (actors/proxies.py); proxies are built once, since pykka introspects
the actor on each ``proxy()`` call.

It sits between the services and HTTP (tests/unit/test_import_graph.py): it imports
neither Sanic nor anything of broker.http.
"""
from __future__ import annotations

import asyncio
from functools import partial

from loguru import logger

from actors.batcher import Batcher
from actors.ephemeral import EphemeralKeeper, EphemeralQueues
from actors.hints import Hints
from actors.hotlist import HotList
from actors.leader_jobs import start_jobs as start_job_actors
from actors.live_series import LiveSeries
from actors.mesh import Mesh, MeshTLS
from actors.pop_waiters import PopWaiterRegistry
from actors.proxies import (
    BatcherProxy,
    HotListProxy,
    JobProxy,
    LiveSeriesProxy,
    PopWaitersProxy,
    SpoolProxy,
    StagingMergerProxy,
    TimerSweeperProxy,
)
from actors.reconciler import CacheReconciler, MaintenanceFlags, QueueConfigCache
from actors.runtime import stop_all, typed_proxy
from actors.spool import Spool
from actors.staging_merger import StagingMerger
from actors.timer_sweeper import TimerSweeper
from broker.service import drain as drain_service
from broker.service import ephemeral as ephemeral_service
from broker.service import push as push_service
from broker.service import timers as timers_service
from broker.service.context import BrokerContext
from broker.service.ephemeral_ownership import watch_members
from broker.service.gauges import gauges
from broker.service.health import start_loop_monitor
from broker.service.migration import Migration
from broker.store import browse as browse_store
from broker.store.connect import unverified_tls
from broker.store.db import Store
from broker.store.errors import (
    StoreConflict,
    StoreError,
    StoreUnavailable,
    fails_every_request,
)
from broker.store.streams import read_state

__all__ = [
    "connect_store",
    "start_batchers",
    "start_ephemeral",
    "start_flags",
    "start_forwarding",
    "start_hints_and_mesh",
    "start_hotlist",
    "start_jobs",
    "start_live_series",
    "start_loop_monitor",
    "start_pop_waiters",
    "start_spool",
    "start_timer_sweeper",
    "stop",
]


def start_forwarding(ctx: BrokerContext) -> None:
    """The client that passes an ephemeral queue's requests on to its owner: only with a mesh,
    since a broker learns its peers' queues and addresses from it and forwards nothing without
    one. httpx is imported here rather than at the top: it costs a broker 5 MB of memory (11 MB
    where its command line's rich and click are installed), which one without a mesh would
    carry for nothing."""
    if not ctx.settings.mesh_active:
        return
    import httpx

    ctx.forward_client = httpx.AsyncClient(
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))


async def connect_store(ctx: BrokerContext, dsn: str) -> None:
    """The pool to PostgreSQL (every PG_HOST server listed), and this process's migration
    state."""
    settings = ctx.settings
    store = await Store.connect(
        dsn, pool_size=settings.db_pool_size,
        connect_timeout_ms=settings.db_connection_timeout,
        statement_timeout_ms=settings.db_statement_timeout,
        lock_timeout_ms=settings.db_lock_timeout,
        idle_timeout_ms=settings.db_idle_timeout,
        application_name=f"queen-broker:{settings.queen_server_id}",
        tls=unverified_tls() if settings.pg_tls_unverified else None)
    store.order_wait_ms = settings.file_buffer_order_wait_ms
    store.settle_ms = settings.settle_ms
    ctx.store = store
    ctx.migration = Migration(dsn)


def start_pop_waiters(ctx: BrokerContext) -> None:
    """The parked long polls: the ref (long_poll parks on it) and its proxy."""
    ctx.waiters = PopWaiterRegistry.start()
    ctx.waiters_proxy = typed_proxy(PopWaitersProxy, ctx.waiters.proxy())


async def start_flags(ctx: BrokerContext) -> None:
    """The queue-config cache and the maintenance flags, seeded from the database
    (unreachable: off), and the reconciler that keeps both converging on it."""
    store = ctx.store
    cache = QueueConfigCache(store.load_encryption_flags)
    flags = MaintenanceFlags()
    try:
        state = await store.read_system_flags()
        flags.push = state.get("maintenance_mode", False)
        flags.pop = state.get("pop_maintenance_mode", False)
    except (StoreUnavailable, StoreError) as exc:
        logger.warning("could not read maintenance flags at boot ({}); assuming off", exc)
    ctx.queue_cache, ctx.flags = cache, flags
    ctx.reconciler = CacheReconciler.start(
        cache, flags, store.read_system_flags, ctx.settings.queen_cache_refresh_interval_ms)


def start_hotlist(ctx: BrokerContext) -> None:
    """The wildcard pops' candidate rings (none with QUEEN_HOTLIST=false); after an outage
    they are set right at once (HotList.reconcile)."""
    ctx.hotlist = None
    if ctx.settings.queen_hotlist:
        ctx.hotlist = typed_proxy(HotListProxy, HotList.start(
            reseed_ms=ctx.settings.queen_hotlist_reseed_ms,
            track_dirty=ctx.settings.mesh_active).proxy())
        ctx.store.health.on_back.append(ctx.hotlist.reconcile)


async def start_hints_and_mesh(ctx: BrokerContext) -> None:
    """The hints (the wakes after a commit or a released lease) and, with peers, the mesh
    that carries them to the other brokers."""
    settings = ctx.settings
    hints = Hints(waiters=ctx.waiters_proxy, cache=ctx.queue_cache, flags=ctx.flags,
                  hotlist=ctx.hotlist)
    ctx.hints = hints
    ctx.mesh = None
    if settings.mesh_active:
        # all three QUEEN_MESH_TLS_* or none (checked at load)
        cert, key, ca = (settings.queen_mesh_tls_cert, settings.queen_mesh_tls_key,
                         settings.queen_mesh_tls_ca)
        tls = (MeshTLS(cert, key, ca)
               if cert is not None and key is not None and ca is not None else None)
        mesh = Mesh(server_id=settings.queen_server_id, port=settings.queen_mesh_port,
                    peers=settings.queen_mesh_peers, secret=settings.queen_sync_secret,
                    heartbeat_ms=settings.queen_sync_heartbeat_ms,
                    dead_threshold_ms=settings.queen_sync_dead_threshold_ms,
                    on_frame=hints.on_frame, bind_host=settings.queen_mesh_host,
                    max_skew_ms=settings.queen_mesh_max_skew_ms,
                    max_frame_bytes=settings.queen_mesh_max_frame_bytes,
                    max_connections=settings.queen_mesh_max_connections, tls=tls,
                    advertise_url=settings.queen_advertise_url)
        await mesh.start()  # a bind failure is logged; the local waker still works
        ctx.mesh = hints.mesh = mesh
        hints.start_dirty_flusher()
    elif settings.queen_sync_enabled:
        logger.info("mesh sync enabled but no peers configured: local waker only")


def _upload_is_transient(exc: BaseException) -> bool:
    """An upload failure the spool retries as a whole later (the file stays)."""
    return fails_every_request(exc) or isinstance(exc, StoreConflict)


async def start_spool(ctx: BrokerContext) -> None:
    """The staging merger and the disk spool, which follows push maintenance; what a
    previous run left is recovered before serving (docs/behaviour.md §5.5)."""
    settings, store = ctx.settings, ctx.store
    merger = typed_proxy(StagingMergerProxy, StagingMerger.start(
        partial(drain_service.merge_once, ctx), partial(drain_service.staged_count, ctx),
        batch=settings.file_buffer_max_batch).proxy())
    ctx.merger = merger

    def kick_merger(_uploaded: int) -> None:
        merger.kick()  # a message: nobody awaits its future

    spool = typed_proxy(SpoolProxy, Spool.start(
        settings.file_buffer_dir,
        upload=partial(drain_service.upload_spooled, ctx),
        replay=partial(push_service.push_spooled, ctx),
        register=store.register_spool,
        on_uploaded=kick_merger,
        events_per_file=settings.file_buffer_events_per_file,
        flush_ms=settings.file_buffer_flush_ms,
        max_bytes=settings.file_buffer_max_bytes,
        sync_interval_ms=settings.file_buffer_fsync,
        is_transient=_upload_is_transient,
        start_paused=ctx.flags.push, owner=settings.queen_server_id).proxy())
    ctx.spool = spool
    # Rows of queen.spool_backlog name the spool (its files), not the process.
    store.server_id = await spool.identity()

    def spool_follows_push_maintenance(which: str, enabled: bool) -> None:
        # Messages to the spool: nobody awaits their futures.
        if which != "push":
            return
        if enabled:
            spool.pause()
        else:
            spool.resume()

    ctx.flags.listeners.append(spool_follows_push_maintenance)
    ctx.spool_backlog = await spool.backlog_ref()
    replayed = await spool.recover()
    if replayed:  # DEBUG: the spool's "drained" line tells it, timed from the first
        logger.debug("spool: replayed {} event(s) left by a previous run", replayed)


def _retry_alone(exc: BaseException) -> bool:
    """A folded batch that failed is retried request by request, unless the failure
    would fail every request (the database is away)."""
    return not fails_every_request(exc)


def start_batchers(ctx: BrokerContext) -> None:
    """The batchers folding concurrent pushes, acks and /streams/v1 state reads into one
    round trip each."""
    settings, store = ctx.settings, ctx.store
    ctx.push_batcher = typed_proxy(BatcherProxy, Batcher.start(
        store.push, max_items=settings.push_max_batch_items,
        max_concurrent=settings.push_max_concurrent, name="push",
        retry_alone=_retry_alone).proxy())
    ctx.ack_batcher = typed_proxy(BatcherProxy, Batcher.start(
        store.ack, max_items=settings.ack_max_batch_items,
        max_concurrent=settings.ack_max_concurrent, name="ack",
        retry_alone=_retry_alone).proxy())
    ctx.streams_state_batcher = typed_proxy(BatcherProxy, Batcher.start(
        partial(read_state, store), max_items=settings.ack_max_batch_items,
        max_concurrent=settings.ack_max_concurrent, name="streams_state",
        retry_alone=_retry_alone).proxy())


def start_timer_sweeper(ctx: BrokerContext) -> None:
    """The sweeper delivering due timers."""
    ctx.timer_sweeper = typed_proxy(TimerSweeperProxy, TimerSweeper.start(
        partial(timers_service.deliver_due, ctx), batch=timers_service.SWEEP_BATCH).proxy())


def start_live_series(ctx: BrokerContext) -> None:
    """The dashboard's throughput and depth rings."""
    ctx.live = typed_proxy(LiveSeriesProxy, LiveSeries.start(
        ctx.telemetry.throughput_totals, partial(browse_store.depths, ctx.store),
        depth_interval_s=ctx.settings.dashboard_depth_interval_ms / 1000).proxy())


async def start_ephemeral(ctx: BrokerContext) -> asyncio.Task[None]:
    """Ephemeral queues: RAM owned by one actor, their declarations read from PostgreSQL;
    answers the task that watches the brokers alive (with peers, each queue has one owner
    among them), which ``stop`` ends."""
    ctx.ephemeral = EphemeralQueues(ctx.settings.ephemeral_max_bytes)
    EphemeralKeeper.start(ctx.ephemeral)
    try:
        await ephemeral_service.load_declared(ctx)
    except (StoreUnavailable, StoreError) as exc:
        logger.warning("ephemeral queues: declarations not read at start ({}); declared "
                       "queues get the defaults until configured again", exc)
    return asyncio.get_running_loop().create_task(watch_members(ctx), name="ephemeral-members")


async def start_jobs(ctx: BrokerContext) -> None:
    """The leader jobs: retention, stats, the metrics collector."""
    jobs = await start_job_actors(store=ctx.store, settings=ctx.settings,
                                  telemetry=ctx.telemetry, gauges=partial(gauges, ctx))
    ctx.jobs = {name: typed_proxy(JobProxy, job) for name, job in jobs.items()}


async def stop(ctx: BrokerContext, background: list[asyncio.Task[None]]) -> None:
    """After the server stopped: the hints and the mesh, the forwarding client, the
    background tasks, every actor, then the pool."""
    await ctx.hints.stop()
    if ctx.mesh is not None:
        await ctx.mesh.stop()
    if ctx.forward_client is not None:
        await ctx.forward_client.aclose()
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    await stop_all()
    await ctx.store.close()
