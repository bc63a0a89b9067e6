"""The pool's connection setup, apart from the data path (as asyncpg keeps its own in
connect_utils): the session settings of every connection, TLS, the json codecs, the
pool's reset, and which PostgreSQL server the connections landed on.

The pool's DSN lists every PG_HOST server (target_session_attrs picks the writable one);
each new connection records where it landed (:class:`ServerInUse`, logged when it
moves). The start-up connection that checks reachability and TLS is boot.py's.
"""
from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
from loguru import logger

from broker.store.codecs import json_codecs
from broker.store.schema import apply_schema


async def keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing. asyncpg's default resets every session on release
    (RESET ALL, UNLISTEN, advisory unlock), which costs a full round trip per
    request. The broker never changes session state on a pooled connection; an
    open transaction is still rolled back by asyncpg itself, and the retention
    job releases its advisory lock explicitly (or terminates the connection)."""


WHICH_SERVER = """
SELECT coalesce(host(inet_server_addr()), 'local socket') AS host,
       coalesce(inet_server_port(), 0) AS port,
       pg_is_in_recovery() AS in_recovery
"""
"""The server a connection landed on (PG_HOST may list several) and whether it is a standby."""


@dataclass
class ServerInUse:
    """The PostgreSQL server the pool's connections go to, as its newest connection found it.
    With several PG_HOST entries this moves after a failover; each move is logged once."""
    host: str | None = None
    port: int | None = None
    read_only: bool | None = None

    @property
    def address(self) -> str | None:
        return None if self.host is None else f"{self.host}:{self.port}"

    def saw(self, host: str, port: int, read_only: bool) -> None:
        before = self.address
        self.host, self.port, self.read_only = host, port, read_only
        if self.address != before:
            role = "read-only: a standby, nothing will be written" if read_only else "writable"
            if before is None:
                logger.info("database: connected to {} ({})", self.address, role)
            else:
                logger.warning("database: now on {} ({}); was {}", self.address, role, before)


def unverified_tls() -> ssl.SSLContext:
    """Encrypt without verifying the server (PG_SSL_REJECT_UNAUTHORIZED=false). Given to
    asyncpg as a context because its sslmode=require still verifies whenever a CA file is
    found (PGSSLROOTCERT, ~/.postgresql/root.crt), which would make "false" mean "maybe"."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def connection_setup(server: ServerInUse) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """The pool's ``init``: codecs, then note the server the connection landed on."""
    async def init(conn: asyncpg.Connection) -> None:
        await json_codecs(conn)
        row = await conn.fetchrow(WHICH_SERVER)
        server.saw(row["host"], row["port"], row["in_recovery"])
    return init



async def open_pool(dsn: str, *, pool_size: int, connect_timeout_ms: int,
                    statement_timeout_ms: int, lock_timeout_ms: int, idle_timeout_ms: int,
                    application_name: str = "queen-broker", apply: bool = True,
                    tls: ssl.SSLContext | None = None) -> tuple[asyncpg.Pool, ServerInUse]:
    """A pool on ``dsn`` and the server its connections reach; ``tls``, when given, is the
    TLS context of every connection (else the DSN's sslmode decides). With ``apply`` the
    schema is brought up to date first, on a connection of its own."""
    server_settings = {
        "timezone": "UTC",  # timestamps go out with a literal Z
        "statement_timeout": str(statement_timeout_ms),
        "lock_timeout": str(lock_timeout_ms),
        "idle_in_transaction_session_timeout": str(idle_timeout_ms),
        "application_name": application_name,
    }
    timeout = connect_timeout_ms / 1000
    tls_arg = {} if tls is None else {"ssl": tls}
    if apply:
        conn = await asyncpg.connect(dsn, timeout=timeout, server_settings=server_settings,
                                     **tls_arg)
        try:
            await apply_schema(conn)
        finally:
            await conn.close()
    server = ServerInUse()
    pool = await asyncpg.create_pool(
        dsn, min_size=min(2, pool_size), max_size=pool_size, timeout=timeout,
        server_settings=server_settings, init=connection_setup(server),
        reset=keep_session, max_inactive_connection_lifetime=60, **tls_arg,
    )
    return pool, server
