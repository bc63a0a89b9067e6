"""The Sanic application: its routes, the subsystems started before serving and stopped
after (each wired by broker/wiring.py), the request hooks, and errors mapped to Queen's
``{"error": ...}`` envelope."""
from __future__ import annotations

import asyncio
import time

from loguru import logger
from sanic import Blueprint, Request, Sanic
from sanic.exceptions import BadURL, MethodNotAllowed, NotFound, SanicException
from sanic.http import Http
from sanic.response import HTTPResponse

from broker import wiring
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
from broker.store.errors import (
    PartitionHeld,
    StoreBusy,
    StoreConflict,
    StoreError,
    StoreInvalidValue,
    StoreUnavailable,
)


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
    """The broker's Sanic app: its limits, its routes, its subsystems (started before it
    serves, stopped after), the request hooks and the error answers."""
    ctx = HttpContext(
        settings=settings,
        cipher=PayloadCipher(settings.encryption_key) if settings.encryption_key else None,
        auth=Authenticator(settings), telemetry=telemetry)
    app: BrokerApp = Sanic(name, env_prefix=None, request_class=QueenRequest, ctx=ctx)
    set_limits(app, settings)
    register_routes(app)
    run_subsystems(app, dsn)
    hook_requests(app, settings)
    answer_errors(app, settings)
    return app


def set_limits(app: BrokerApp, settings: Settings) -> None:
    """Sanic's limits: the body size, and no response timeout a long poll could hit."""
    app.config.REQUEST_MAX_SIZE = settings.max_body_bytes
    app.config.REQUEST_TIMEOUT = 60
    # Long polls hold a response for up to `timeout` ms; never cut them short.
    app.config.RESPONSE_TIMEOUT = 3600
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.NOISY_EXCEPTIONS = False
    app.config.ACCESS_LOG = False


def register_routes(app: BrokerApp) -> None:
    """Every route group; HEAD answered like GET except on the pop routes."""
    for blueprint in (push.bp, pop.bp, ack.bp, admin.bp, system.bp, quarantine.bp, spools.bp,
                      docs.bp, streams.bp, reads.bp, kv.bp, locks.bp, timers.bp, migration.bp,
                      ephemeral.bp, dashboard.bp, identity.bp, supervision.bp, *ops.blueprints):
        if blueprint is not pop.bp:
            answer_head_like_get(blueprint)
        app.blueprint(blueprint)


def run_subsystems(app: BrokerApp, dsn: str) -> None:
    """Start the subsystems (broker/wiring.py) before serving, end the long polls before
    Sanic's graceful stop, stop the subsystems after."""
    settings = app.ctx.settings
    background: list[asyncio.Task[None]] = []  # tasks the app itself runs, stopped with it

    @app.before_server_start
    async def start(app: BrokerApp) -> None:
        # The subsystems in start order (broker/wiring.py), before any request is served.
        ctx = app.ctx
        wiring.start_forwarding(ctx)
        await wiring.connect_store(ctx, dsn)
        wiring.start_pop_waiters(ctx)
        await wiring.start_flags(ctx)
        wiring.start_hotlist(ctx)
        await wiring.start_hints_and_mesh(ctx)
        if ctx.mesh is not None and ctx.auth.enabled and not settings.queen_sync_secret:
            logger.warning("ephemeral queues: JWT auth is on and the mesh has no "
                           "QUEEN_SYNC_SECRET, so requests are not forwarded to a queue's "
                           "owner (callers' tokens would go to unauthenticated peers): "
                           "each broker keeps its own rings")
        await wiring.start_spool(ctx)
        wiring.start_batchers(ctx)
        wiring.start_timer_sweeper(ctx)
        wiring.start_live_series(ctx)
        background.append(await wiring.start_ephemeral(ctx))
        background.append(wiring.start_loop_monitor(ctx))
        await wiring.start_jobs(ctx)
        logger.info("broker {} serving on http://{}:{}", settings.queen_server_id,
                    settings.host, settings.port)

    @app.before_server_stop
    async def end_long_polls(app: BrokerApp) -> None:
        # From here GET /health/ready answers 503 (the server still listens until this
        # returns). Before Sanic's graceful stop waits for in-flight requests: parked pops
        # answer what they have now (empty, as at their deadline) instead of holding the
        # stop for up to GRACEFUL_SHUTDOWN_TIMEOUT and then being cut off unanswered.
        app.ctx.stopping = True
        parked = await app.ctx.waiters_proxy.close() + app.ctx.ephemeral.gate.close()
        if parked:
            logger.info("stopping: {} parked long poll(s) answered empty", parked)
        if settings.stop_unready_ms:
            # Serving on, unready, so that load balancers take this broker out before it
            # stops listening (pops that would park answer at once from now on).
            logger.info("stopping: serving {} ms more with /health/ready unready",
                        settings.stop_unready_ms)
            await asyncio.sleep(settings.stop_unready_ms / 1000)

    @app.after_server_stop
    async def stop(app: BrokerApp) -> None:
        await wiring.stop(app.ctx, background)


def hook_requests(app: BrokerApp, settings: Settings) -> None:
    """Every request: timed, its ignored body read, authorized; every answer: compressed,
    CORS headers, counted, access line."""

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
        if app.ctx.stopping and isinstance(request.stream, Http):
            # A stopping broker closes each connection after its answer. Kept alive, a
            # client's connection (a parked pop answered at the stop, say) would hold the
            # stop until Sanic's graceful timeout (15 s) ran out; closed, the client's next
            # request goes, through the load balancer, to a broker that stays.
            request.stream.keep_alive = False


def answer_errors(app: BrokerApp, settings: Settings) -> None:
    """Errors as Queen's ``{"error": ...}`` answers: 400 for a caller's mistake, 503 (with
    Retry-After) for an unavailable or busy database, 500 for a bug."""
    throttle = Throttle(60.0)  # busy / conflict lines: at most one a minute per route

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
