"""The Sanic application: starts the store and the actors before serving and
stops them after; maps errors to Queen's ``{"error": ...}`` envelope."""
from __future__ import annotations

import asyncio
import time

import httpx
from loguru import logger
from sanic import Blueprint, Request, Sanic
from sanic.exceptions import BadURL, MethodNotAllowed, NotFound, SanicException
from sanic.response import HTTPResponse

from actors.batcher import Batcher
from actors.ephemeral import EphemeralKeeper, EphemeralQueues
from actors.hints import Hints
from actors.hotlist import HotList
from actors.leader_jobs import start_jobs
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
from broker.core.config import Settings
from broker.core.crypto import PayloadCipher
from broker.core.errors import BadRequest
from broker.core.logs import Throttle, dropped_note
from broker.core.telemetry import telemetry
from broker.http.auth import Authenticator
from broker.http.compression import compress
from broker.http.responses import CORS_HEADERS, error, json
from broker.http.routes import (
    ack,
    admin,
    dashboard,
    docs,
    ephemeral,
    identity,
    kv,
    locks,
    migration,
    ops,
    pop,
    push,
    quarantine,
    reads,
    spools,
    streams,
    supervision,
    system,
    timers,
)
from broker.http.types import BrokerApp, HttpContext
from broker.service import drain as drain_service
from broker.service import ephemeral as ephemeral_service
from broker.service import push as push_service
from broker.service import timers as timers_service
from broker.service.ephemeral_ownership import watch_members
from broker.service.gauges import gauges
from broker.service.migration import Migration
from broker.store import browse as browse_store
from broker.store.db import (
    PartitionHeld,
    Store,
    StoreBusy,
    StoreConflict,
    StoreError,
    StoreInvalidValue,
    StoreUnavailable,
    fails_every_request,
    unverified_tls,
)
from broker.store.streams import read_state


class QueenRequest(Request):
    """Sanic's request, except for the stand-in Sanic builds to answer a request it could not
    parse (method ``NONE``): Sanic 25 builds it from the same bad URL (``GET health``, no
    leading slash), so it raised again inside the error path, logged ~40 lines of traceback
    and closed without answering. The stand-in gets ``/`` instead; the 400 for the original
    ``BadURL`` is then answered like any other."""

    def __init__(self, url_bytes: bytes, headers, version, method, transport, app,
                 head: bytes = b"", stream_id: int = 0):
        try:
            super().__init__(url_bytes, headers, version, method, transport, app, head, stream_id)
        except BadURL:
            if method != "NONE":
                raise
            super().__init__(b"/", headers, version, method, transport, app, head, stream_id)


def answer_head_like_get(blueprint: Blueprint) -> None:
    """Register HEAD next to GET on every GET route of ``blueprint`` (load balancers and
    uptime checkers send HEAD). The handler runs as for GET; Sanic sends its status and
    headers, Content-Length included, and drops the body. The pop routes are left out on
    purpose: a pop is not safe (it takes a lease), so a HEAD there would hide messages."""
    blueprint._future_routes = {
        route._replace(methods=frozenset({*route.methods, "HEAD"}))
        if route.methods and "GET" in route.methods else route
        for route in blueprint._future_routes}


async def read_ignored_body(request: Request) -> None:
    """Read a body Sanic left unread: it does not read the body of a GET, HEAD or OPTIONS
    request (nor of one no route matched), and then logs "body not consumed" at ERROR for
    each such request it answers 2xx. The body is read and dropped (REQUEST_MAX_SIZE bounds
    it as for any request)."""
    if request.stream is not None and not request.body:
        await request.receive_body()


def access_line(request: Request, response: HTTPResponse, started: float | None) -> None:
    """ACCESS_LOG: one line per request; its fields are also the line's JSON context."""
    ms = round((time.perf_counter() - started) * 1000, 3) if started is not None else None
    claims = getattr(request.ctx, "jwt_claims", None)
    subject = claims.get("sub") if isinstance(claims, dict) else None
    logger.bind(access=True, method=request.method, path=request.path,
                status=response.status, duration_ms=ms,
                subject=None if subject is None else str(subject)).info(
        "{} {} {} {} ms{}", request.method, request.path, response.status, ms,
        "" if subject is None else f" sub={subject}")


def create_app(settings: Settings, dsn: str, name: str = "queen") -> BrokerApp:
    ctx = HttpContext(
        settings=settings,
        cipher=PayloadCipher(settings.encryption_key) if settings.encryption_key else None,
        auth=Authenticator(settings), telemetry=telemetry)
    app: BrokerApp = Sanic(name, env_prefix=None, request_class=QueenRequest, ctx=ctx)
    throttle = Throttle(60.0)  # busy / conflict lines: at most one a minute per route
    app.config.REQUEST_MAX_SIZE = settings.max_body_bytes
    app.config.REQUEST_TIMEOUT = 60
    # Long polls hold a response for up to `timeout` ms; never cut them short.
    app.config.RESPONSE_TIMEOUT = 3600
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.NOISY_EXCEPTIONS = False
    app.config.ACCESS_LOG = False

    for blueprint in (push.bp, pop.bp, ack.bp, admin.bp, system.bp, quarantine.bp, spools.bp,
                      docs.bp, streams.bp, reads.bp, kv.bp, locks.bp, timers.bp, migration.bp,
                      ephemeral.bp, dashboard.bp, identity.bp, supervision.bp, *ops.blueprints):
        if blueprint is not pop.bp:
            answer_head_like_get(blueprint)
        app.blueprint(blueprint)

    background: list[asyncio.Task[None]] = []  # tasks the app itself runs, stopped with it

    @app.before_server_start
    async def start(app: BrokerApp) -> None:
        app.ctx.forward_client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))
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
        app.ctx.store = store
        app.ctx.migration = Migration(dsn)
        # Refs for long_poll, proxies (built once: pykka introspects on each
        # proxy() call) for everything else, each typed with its actor's view
        # (actors/proxies.py).
        app.ctx.waiters = PopWaiterRegistry.start()
        app.ctx.waiters_proxy = typed_proxy(PopWaitersProxy, app.ctx.waiters.proxy())
        cache = QueueConfigCache(store.load_encryption_flags)
        flags = MaintenanceFlags()
        try:  # seed both flags from the database (unreachable: off)
            state = await store.read_system_flags()
            flags.push = state.get("maintenance_mode", False)
            flags.pop = state.get("pop_maintenance_mode", False)
        except (StoreUnavailable, StoreError) as exc:
            logger.warning("could not read maintenance flags at boot ({}); assuming off", exc)
        app.ctx.queue_cache, app.ctx.flags = cache, flags
        app.ctx.reconciler = CacheReconciler.start(
            cache, flags, store.read_system_flags, settings.queen_cache_refresh_interval_ms)
        app.ctx.hotlist = None
        if settings.queen_hotlist:
            app.ctx.hotlist = typed_proxy(HotListProxy, HotList.start(
                reseed_ms=settings.queen_hotlist_reseed_ms,
                track_dirty=settings.mesh_active).proxy())
            # After an outage the rings are set right at once (HotList.reconcile).
            store.health.on_back.append(app.ctx.hotlist.reconcile)
        hints = Hints(waiters=app.ctx.waiters_proxy, cache=cache, flags=flags,
                      hotlist=app.ctx.hotlist)
        app.ctx.hints = hints
        app.ctx.mesh = None
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
            app.ctx.mesh = hints.mesh = mesh
            if app.ctx.auth.enabled and not settings.queen_sync_secret:
                logger.warning("ephemeral queues: JWT auth is on and the mesh has no "
                               "QUEEN_SYNC_SECRET, so requests are not forwarded to a queue's "
                               "owner (callers' tokens would go to unauthenticated peers): "
                               "each broker keeps its own rings")
            hints.start_dirty_flusher()
        elif settings.queen_sync_enabled:
            logger.info("mesh sync enabled but no peers configured: local waker only")
        # The spool: recover what a previous run left before serving (docs/behaviour.md §5.5).
        merger = typed_proxy(StagingMergerProxy, StagingMerger.start(
            lambda limit: drain_service.merge_once(app.ctx, limit),
            lambda: drain_service.staged_count(app.ctx),
            batch=settings.file_buffer_max_batch).proxy())
        app.ctx.merger = merger
        spool = typed_proxy(SpoolProxy, Spool.start(
            settings.file_buffer_dir,
            upload=lambda name, events, indexes, oldest: drain_service.upload_spooled(
                app.ctx, name, events, indexes, oldest),
            replay=lambda events: push_service.push_spooled(app.ctx, events),
            register=store.register_spool,
            on_uploaded=lambda _n: merger.kick(),
            events_per_file=settings.file_buffer_events_per_file,
            flush_ms=settings.file_buffer_flush_ms,
            max_bytes=settings.file_buffer_max_bytes,
            sync_interval_ms=settings.file_buffer_fsync,
            is_transient=lambda exc: fails_every_request(exc) or isinstance(exc, StoreConflict),
            start_paused=flags.push, owner=settings.queen_server_id).proxy())
        app.ctx.spool = spool
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

        flags.listeners.append(spool_follows_push_maintenance)
        app.ctx.spool_backlog = await spool.backlog_ref()
        replayed = await spool.recover()
        if replayed:  # DEBUG: the spool's "drained" line tells it, timed from the first
            logger.debug("spool: replayed {} event(s) left by a previous run", replayed)
        app.ctx.push_batcher = typed_proxy(BatcherProxy, Batcher.start(
            store.push, max_items=settings.push_max_batch_items,
            max_concurrent=settings.push_max_concurrent, name="push",
            retry_alone=lambda exc: not fails_every_request(exc)).proxy())
        app.ctx.ack_batcher = typed_proxy(BatcherProxy, Batcher.start(
            store.ack, max_items=settings.ack_max_batch_items,
            max_concurrent=settings.ack_max_concurrent, name="ack",
            retry_alone=lambda exc: not fails_every_request(exc)).proxy())
        app.ctx.streams_state_batcher = typed_proxy(BatcherProxy, Batcher.start(
            lambda reads: read_state(store, reads), max_items=settings.ack_max_batch_items,
            max_concurrent=settings.ack_max_concurrent, name="streams_state",
            retry_alone=lambda exc: not fails_every_request(exc)).proxy())
        app.ctx.timer_sweeper = typed_proxy(TimerSweeperProxy, TimerSweeper.start(
            lambda: timers_service.deliver_due(app.ctx),
            batch=timers_service.SWEEP_BATCH).proxy())
        app.ctx.live = typed_proxy(LiveSeriesProxy, LiveSeries.start(
            telemetry.throughput_totals, lambda: browse_store.depths(store),
            depth_interval_s=settings.dashboard_depth_interval_ms / 1000).proxy())
        # Ephemeral queues: RAM owned by one actor; their declarations read from PostgreSQL.
        app.ctx.ephemeral = EphemeralQueues(settings.ephemeral_max_bytes)
        EphemeralKeeper.start(app.ctx.ephemeral)
        try:
            await ephemeral_service.load_declared(app.ctx)
        except (StoreUnavailable, StoreError) as exc:
            logger.warning("ephemeral queues: declarations not read at start ({}); declared "
                           "queues get the defaults until configured again", exc)
        # With peers, each ephemeral queue has one owner among the brokers alive.
        background.append(asyncio.get_running_loop().create_task(
            watch_members(app.ctx), name="ephemeral-members"))
        jobs = await start_jobs(store=store, settings=settings, telemetry=telemetry,
                                gauges=lambda: gauges(app.ctx))
        app.ctx.jobs = {name: typed_proxy(JobProxy, job) for name, job in jobs.items()}
        logger.info("broker {} serving on http://{}:{}", settings.queen_server_id,
                    settings.host, settings.port)

    @app.before_server_stop
    async def end_long_polls(app: BrokerApp) -> None:
        # Before Sanic's graceful stop waits for in-flight requests: parked pops answer
        # what they have now (empty, as at their deadline) instead of holding the stop
        # for up to GRACEFUL_SHUTDOWN_TIMEOUT and then being cut off unanswered.
        parked = await app.ctx.waiters_proxy.close() + app.ctx.ephemeral.gate.close()
        if parked:
            logger.info("stopping: {} parked long poll(s) answered empty", parked)

    @app.after_server_stop
    async def stop(app: BrokerApp) -> None:
        await app.ctx.hints.stop()
        if app.ctx.mesh is not None:
            await app.ctx.mesh.stop()
        await app.ctx.forward_client.aclose()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await stop_all()
        await app.ctx.store.close()

    @app.on_request
    async def authenticate(request: Request):
        request.ctx.started = time.perf_counter()
        if request.method in ("GET", "HEAD", "OPTIONS"):
            await read_ignored_body(request)
        return await app.ctx.auth.authorize(request)

    @app.on_response
    async def finish(request: Request, response: HTTPResponse) -> None:
        compress(response, request.headers.get("accept-encoding"),
                 settings.response_compression_min_bytes)
        response.headers.update(CORS_HEADERS)
        route = request.route.name if request.route else "unrouted"
        telemetry.requests[route] += 1
        if response.status >= 500:
            telemetry.errors[route] += 1
        started = getattr(request.ctx, "started", None)
        if started is not None:
            telemetry.observe(route, time.perf_counter() - started)
        if settings.access_log:
            access_line(request, response, started)


    @app.exception(BadRequest)
    async def bad_request(_request: Request, exc: BadRequest):
        if exc.code is not None:
            return json({"error": exc.code, "detail": exc.message}, exc.status)
        return error(exc.message, exc.status)

    @app.exception(StoreUnavailable)
    async def unavailable(request: Request, exc: StoreUnavailable):
        # The store's DatabaseHealth says once that the database is gone and when it is back.
        logger.debug("{} {}: {}", request.method, request.path, exc)
        return error("Database unavailable, retry later", 503)

    @app.exception(PartitionHeld)
    async def partition_held(_request: Request, exc: PartitionHeld):
        return error(str(exc), 503)  # with Retry-After, like every 503

    @app.exception(StoreBusy, StoreConflict)
    async def busy(request: Request, exc: StoreError):
        # Nothing was written (the statement or transaction was rolled back): a plain retry.
        dropped = throttle.allow((type(exc), request.route.name if request.route else None))
        if dropped is not None:
            logger.warning("{} {}: {}{}", request.method, request.path, exc,
                           dropped_note(dropped))
        return error(str(exc), 503)

    @app.exception(StoreInvalidValue)
    async def invalid_value(_request: Request, exc: StoreInvalidValue):
        return error(str(exc), 400)

    @app.exception(UnicodeError)
    async def bad_unicode(_request: Request, exc: UnicodeError):
        # UnicodeError itself has no .reason; its encode/decode/translate subclasses do
        reason = (exc.reason if isinstance(
            exc, UnicodeEncodeError | UnicodeDecodeError | UnicodeTranslateError) else str(exc))
        return error(f"invalid text (not encodable as UTF-8): {reason}", 400)

    @app.exception(StoreError)
    async def store_error(request: Request, exc: StoreError):
        # The body stays generic; the driver's own words go to the log only.
        logger.error("{} {}: {} ({!r})", request.method, request.path, exc, exc.__cause__)
        return error(str(exc), 500)

    @app.exception(NotFound, MethodNotAllowed)
    async def no_route(request: Request, exc: SanicException):
        if request.method == "OPTIONS":  # CORS preflight, for any path
            await read_ignored_body(request)
            return HTTPResponse(status=204, headers={**CORS_HEADERS, "Access-Control-Max-Age": "86400"})
        if isinstance(exc, MethodNotAllowed):
            return error(f"Method {request.method} not allowed on {request.path}", 405)
        return error("no_such_route", 404)

    @app.exception(SanicException)
    async def sanic_error(_request: Request, exc: SanicException):
        if exc.status_code == 413:  # Sanic's own words do not say which limit, nor where
            return error(f"request body larger than MAX_BODY_BYTES={settings.max_body_bytes} "
                         f"bytes; send a smaller body or raise MAX_BODY_BYTES", 413)
        # 405, malformed requests...
        return error(str(exc) or exc.__class__.__name__, exc.status_code)

    @app.exception(Exception)
    async def internal(request: Request, exc: Exception):
        logger.opt(exception=exc).error("{} {} failed", request.method, request.path)
        return error(f"Internal error: {exc.__class__.__name__}", 500)

    return app
