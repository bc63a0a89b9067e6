"""``python -m broker`` / ``queen-broker``: configuration -> HTTP socket -> database -> HTTP.

With PG_HOST unset the broker uses its embedded PostgreSQL, with its data in EMBEDDED_PG_DIR
so it survives restarts. It starts the server when none runs there, and then (only then)
restarts it when its postmaster dies and stops it at exit; a server another broker started
is used and left running.

Every failure to start is one line naming what to change, and leaves the database as it was.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import socket
import ssl
import sys
import textwrap
import time
from urllib.parse import quote

import asyncpg
from loguru import logger

from actors.spool.lock import SpoolDirectoryBusy, SpoolDirectoryLock
from broker import __version__
from broker.core.config import VARIABLES, ConfigError, Settings, load_settings, suspicious_variables
from broker.core.logs import Throttle, add_sink, dropped_note

# Variables shown by --help; docs/operations/configuration.md has all of them.
HELP_VARIABLES = ("HOST", "PORT", "PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB",
                  "PG_CONNECT_WAIT_MS", "EMBEDDED_PG_DIR", "EMBEDDED_PG_PORT",
                  "QUEEN_ENCRYPTION_KEY", "QUEEN_MESH_PEERS", "FILE_BUFFER_DIR", "JWT_ENABLED",
                  "LOG_LEVEL", "LOG_FORMAT", "ACCESS_LOG")

# How often a broker waiting for PostgreSQL (PG_CONNECT_WAIT_MS) says it still waits.
WAIT_LOG_EVERY_S = 5.0
RETRY_EVERY_S = 0.5


class StartupError(Exception):
    """The broker cannot start; the message is the one line that says why and what to set."""


def external_dsn(settings: Settings) -> str:
    """A libpq-style URI naming every PG_HOST server, so that each new connection (the pool's,
    after a failover too) is made to the first one that answers with the session attributes
    asked for (the writable primary, when several are listed)."""
    user = quote(settings.pg_user, safe="")
    password = quote(settings.pg_password, safe="")
    hosts = ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                     for host, port in settings.pg_servers)
    query = {"target_session_attrs": settings.pg_session_attrs}
    if settings.pg_use_ssl and not settings.pg_tls_unverified:
        # verify-full checks the chain (against PGSSLROOTCERT, or ~/.postgresql/root.crt) and
        # the host name, and fails when there is no CA file: asyncpg's "require" would skip
        # verification then, silently. Unverified TLS is a context given with the connection
        # (Store.connect's tls). Never "prefer": it falls back to plain text.
        query["sslmode"] = "verify-full"
    return (f"postgresql://{user}:{password}@{hosts}/{quote(settings.pg_db, safe='')}?"
            + "&".join(f"{k}={v}" for k, v in query.items()))


# The loggers Sanic(...) gives stream handlers of its own (sanic.logging.default), which would
# print its lines ("Starting worker", "Worker ready", errors) in its own format to stdout.
SANIC_LOGGERS = ("sanic.root", "sanic.error", "sanic.access", "sanic.server", "sanic.websockets")


class InterceptHandler(logging.Handler):
    """Hands every stdlib logging record (pykka, Sanic, asyncpg) to loguru, at its level and
    with its caller's place, so the broker's lines have one format and one stream.

    The recipe of loguru's documentation ("Entirely compatible with standard logging").
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        # The first frame outside the logging module is the one that logged.
        frame, depth = inspect.currentframe(), 0
        while frame is not None:
            filename = frame.f_code.co_filename
            is_logging = filename == logging.__file__
            is_frozen = "importlib" in filename and "_bootstrap" in filename
            if depth > 0 and not (is_logging or is_frozen):
                break
            frame = frame.f_back
            depth += 1
        message, exc_info = record.getMessage(), record.exc_info
        error = exc_info[1] if exc_info else None
        if error is not None and _is_connection_error(error):
            # asyncpg's pool says "Failed to restore the pool connection floor; retrying" with
            # ~25 lines of traceback each time it retries during an outage: the error's one
            # line is all it tells, at DEBUG and once a minute (the outage itself is told by
            # the store's DatabaseHealth: one line when it starts, one when it ends).
            dropped = NOISY.allow((record.name, record.msg))
            if dropped is None:
                return
            message = f"{message} ({type(error).__name__}: {error}){dropped_note(dropped)}"
            exc_info, level = None, "DEBUG"
        # The message is already formatted: loguru formats only when given arguments, so
        # braces in it (a JSON body, a repr) are left alone.
        logger.opt(depth=depth, exception=exc_info).log(level, message)


NOISY = Throttle(60.0)


def _is_connection_error(error: BaseException) -> bool:
    from broker.store.errors import UNAVAILABLE_ERRORS
    return isinstance(error, UNAVAILABLE_ERRORS)


def setup_logging(level: str, log_format: str = "text") -> None:
    """loguru to stderr at ``level`` in ``log_format`` (LOG_FORMAT: text or json), and stdlib
    logging routed into it."""
    logger.remove()
    add_sink(logger, level, log_format)
    # The root logger's level is loguru's (their numbers agree: DEBUG 10, INFO 20, ...), so
    # records loguru would drop are not even made.
    logging.basicConfig(handlers=[InterceptHandler()], level=logger.level(level.upper()).no,
                        force=True)
    route_sanic_logs()


def route_sanic_logs() -> None:
    """Take Sanic's own handlers off its loggers: their records then reach the root logger's
    InterceptHandler. Sanic(...) installs them (dictConfig) when the app is created, so this
    runs again once it is."""
    for name in SANIC_LOGGERS:
        sanic_logger = logging.getLogger(name)
        for handler in list(sanic_logger.handlers):
            sanic_logger.removeHandler(handler)
        sanic_logger.propagate = True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    by_name = {v.name: v for v in VARIABLES}
    lines = []
    for name in HELP_VARIABLES:
        var = by_name[name]
        default = "unset" if var.default is None else repr(var.default) if not var.default \
            else var.default
        lines += textwrap.wrap(f"{var.doc} (default: {default})", width=78,
                               initial_indent=f"  {name:<22} ", subsequent_indent=" " * 25)
    parser = argparse.ArgumentParser(
        prog="queen-broker",
        description="A PostgreSQL-backed, partitioned message broker speaking the Queen MQ\n"
                    "HTTP API. It is configured by environment variables only.",
        epilog="main variables:\n" + "\n".join(lines) + "\n\nEvery variable, with its "
               "default, is in docs/operations/configuration.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"queen-broker {__version__}")
    return parser.parse_args(argv)


def bind_http(settings: Settings) -> socket.socket:
    """The HTTP listening socket, bound before the database is touched; Sanic serves on it."""
    try:
        family = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((settings.host, settings.port), family=family, backlog=100)
    except OSError as exc:
        # create_server's strerror repeats the address; the errno's own words are enough.
        code = exc.errno
        reason = os.strerror(code) if code is not None and code > 0 else (exc.strerror or exc)
        raise StartupError(f"cannot listen on {settings.host}:{settings.port} ({reason}); "
                           f"set PORT (or HOST) to a free address") from None


def hold_spool_directory(settings: Settings) -> SpoolDirectoryLock | None:
    """FILE_BUFFER_DIR's lock, taken before the database is touched: a directory another live
    broker holds is a one-line refusal. A directory that cannot be made or opened is left to
    the spool, which reports itself unhealthy (pushes then cannot be buffered)."""
    lock = SpoolDirectoryLock(settings.file_buffer_dir)
    try:
        lock.acquire()
    except SpoolDirectoryBusy as exc:
        raise StartupError(str(exc)) from None
    except OSError as exc:
        logger.warning("spool: cannot lock {}: {}", lock.path, exc)
        return None
    return lock


def start_embedded(settings: Settings):
    from broker.store.embedded_pg import (
        EmbeddedPortInUse,
        EmbeddedPostgres,
        EmbeddedPostgresError,
    )

    embedded = EmbeddedPostgres(settings.embedded_pg_dir, port=settings.embedded_pg_port)
    logger.info("starting embedded PostgreSQL in {}", settings.embedded_pg_dir)
    try:
        embedded.start()
    except EmbeddedPortInUse as exc:
        raise StartupError(f"embedded PostgreSQL cannot listen on {exc.host}:{exc.port}: "
                           f"another process uses the port; set EMBEDDED_PG_PORT to a free "
                           f"port (0 picks one)") from None
    except EmbeddedPostgresError as exc:
        logger.debug("embedded PostgreSQL did not start: {}", exc)  # pg_ctl's output, the log
        raise StartupError(f"embedded PostgreSQL did not start: {exc.summary} (check "
                           f"EMBEDDED_PG_DIR, EMBEDDED_PG_PORT)") from None
    if embedded.inherited:
        logger.info("embedded PostgreSQL on {}:{} was left running by a broker that is gone; "
                    "this broker now owns it and stops it at exit", embedded.host, embedded.port)
    elif embedded.owned:
        logger.info("embedded PostgreSQL ready on {}:{}; this broker stops it at exit",
                    embedded.host, embedded.port)
    else:
        holder = f"broker pid {embedded.owner_pid}" if embedded.owner_pid else "another process"
        logger.info("embedded PostgreSQL in {} already runs on {}:{}, started by {}: using it; "
                    "it keeps running when this broker exits", settings.embedded_pg_dir,
                    embedded.host, embedded.port, holder)
    return embedded


def watch_embedded(embedded):
    """The embedded PostgreSQL this broker started (or inherited: it stops it at exit) is
    restarted when its postmaster dies; one another live broker started is that broker's to
    restart, and an external PG_HOST is never watched."""
    if not embedded.owned:
        return None
    from broker.store.embedded_pg import Watchdog
    watchdog = Watchdog(embedded)
    watchdog.start()
    return watchdog


def _is_retryable(exc: BaseException) -> bool:
    """Errors that can heal by waiting (down, starting, full); not a wrong password, not a
    TLS verification problem."""
    from broker.store.boot import is_tls_problem
    from broker.store.errors import UNAVAILABLE_ERRORS
    return not is_tls_problem(exc) and isinstance(exc, UNAVAILABLE_ERRORS)


async def wait_for_database(dsn: str, address: str, variables: str, *, wait_ms: int,
                            connect_timeout_ms: int, tls: ssl.SSLContext | None = None,
                            settings: Settings | None = None) -> None:
    """Connect once (retrying for up to ``wait_ms``) and bring the schema up to date, so that
    an unreachable database, or one whose schema is newer than this broker, is one line here
    rather than a traceback from the server's start-up hook."""
    from broker.store.boot import connect_for_schema, is_tls_problem
    deadline = time.monotonic() + wait_ms / 1000
    last_log = None
    while True:
        try:
            conn = await connect_for_schema(dsn, timeout_s=connect_timeout_ms / 1000, tls=tls)
        except Exception as exc:  # every failure becomes one line
            reason = " ".join(f"{exc.__class__.__name__}: {exc}".split())  # one line
            if not _is_retryable(exc):
                check = variables
                if is_tls_problem(exc):
                    check = ("PGSSLROOTCERT (the CA that signed the server's certificate) and "
                             "PG_SSL_REJECT_UNAUTHORIZED, and that PG_HOST names the host the "
                             "certificate is for")
                raise StartupError(f"PostgreSQL at {address} refused the connection ({reason}); "
                                   f"check {check}") from None
            if time.monotonic() >= deadline:
                waited = f" for {wait_ms} ms" if wait_ms else ""
                raise StartupError(f"cannot reach PostgreSQL at {address}{waited} ({reason}); "
                                   f"check {variables}, or set PG_CONNECT_WAIT_MS to wait "
                                   f"for it") from None
            now = time.monotonic()
            if last_log is None or now - last_log >= WAIT_LOG_EVERY_S:
                logger.info("PostgreSQL at {} not reachable yet ({}); waiting up to "
                            "PG_CONNECT_WAIT_MS={} ms", address, reason, wait_ms)
                last_log = now
            await asyncio.sleep(RETRY_EVERY_S)
            continue
        try:
            await migrate(conn)
            if settings is not None:
                await warn_if_shared(conn, settings)
        finally:
            await conn.close()
        return


async def warn_if_shared(conn: asyncpg.Connection, settings: Settings) -> None:
    """One WARNING when another broker already uses this database while this one has no mesh
    peers, or no settle time (FILE_BUFFER_SETTLE_MS) for after a database restart: say what
    to set. Brokers that start later see this one (each says it at its own boot)."""
    from broker.store.boot import other_brokers
    if settings.mesh_active and settings.settle_ms > 0:
        return
    try:
        others = await other_brokers(conn)
    except Exception as exc:  # a hint only: the boot goes on
        logger.debug("could not list the other brokers on the database: {}", exc)
        return
    if not others:
        return
    who = ", ".join(f"{r['name'].removeprefix('queen-broker:')} ({r['address']}, "
                    f"{r['connections']} connection(s))" for r in others)
    settle = settings.db_connection_timeout + 3 * settings.file_buffer_flush_ms
    advice = []
    if settings.settle_ms == 0:
        advice.append(f"set FILE_BUFFER_SETTLE_MS (e.g. {settle}, DB_CONNECTION_TIMEOUT + 3 x "
                      f"FILE_BUFFER_FLUSH_MS) on every broker of this database, or per-partition "
                      f"order may break after a database restart")
    if not settings.mesh_active:
        advice.append("set QUEEN_MESH_PEERS to the other brokers' mesh addresses (one "
                      "QUEEN_SYNC_SECRET for all) so that a push taken by one wakes the pops "
                      "parked on the others at once, not after POP_WAIT_MAX_INTERVAL_MS")
    missing = " and ".join(
        ([] if settings.mesh_active else ["no mesh peers"])
        + (["no settle time (FILE_BUFFER_SETTLE_MS=0)"] if settings.settle_ms == 0 else []))
    logger.warning("config: other brokers use this database ({}) and this one has {}: {}",
                   who, missing, "; ".join(advice))


async def migrate(conn: asyncpg.Connection) -> None:
    from broker.store.schema import MigrationFailed, SchemaTooNew, apply_schema
    try:
        state = await apply_schema(conn)
    except (SchemaTooNew, MigrationFailed) as exc:
        raise StartupError(" ".join(str(exc).split())) from None
    if state.applied_now:
        logger.info("schema: applied {}; now at version {}", ", ".join(state.applied_now),
                    state.version)
    else:
        logger.info("schema: at version {}, nothing to apply", state.version)


def main(argv: list[str] | None = None) -> int:
    parse_args(argv)  # --help / --version exit here, before anything starts
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"queen-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    for warning in suspicious_variables():
        logger.warning("config: {}", warning)
    for block, values in settings.log_blocks().items():
        logger.info("{}: {}", block, " ".join(f"{k}={v}" for k, v in values.items()))

    embedded = watchdog = None
    try:
        sock = bind_http(settings)
        spool_lock = hold_spool_directory(settings)  # noqa: F841 (held until the process ends)
        if settings.embedded_pg:
            embedded = start_embedded(settings)
            watchdog = watch_embedded(embedded)
            dsn = embedded.dsn
            address, variables = f"{embedded.host}:{embedded.port}", "EMBEDDED_PG_DIR"
        else:
            dsn = external_dsn(settings)
            address = ",".join(f"{host}:{port}" for host, port in settings.pg_servers)
            variables = "PG_HOST/PG_PORT (and PG_USER/PG_PASSWORD/PG_DB)"
        from broker.store.connect import unverified_tls
        asyncio.run(wait_for_database(
            dsn, address, variables, wait_ms=settings.pg_connect_wait_ms,
            connect_timeout_ms=settings.db_connection_timeout,
            tls=unverified_tls() if settings.pg_tls_unverified else None, settings=settings))
        from broker.http.app import create_app
        try:
            app = create_app(settings, dsn)
        except ConfigError as exc:  # e.g. unreadable JWT key material
            raise StartupError(f"configuration error: {exc}") from None
        route_sanic_logs()
        # One process, one event loop: the actors live beside the handlers.
        app.run(sock=sock, single_process=True, access_log=False, motd=False)
    except StartupError as exc:
        logger.error("queen-broker cannot start: {}", exc)
        return 1
    finally:
        if watchdog is not None:
            watchdog.stop()  # before the server stops: a restart must not undo that
        if embedded is not None and embedded.owned:
            logger.info("stopping embedded PostgreSQL")
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
