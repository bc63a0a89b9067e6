"""The broker's first connection at start-up (broker/__main__.py ``wait_for_database``):
one connection outside the pool, to check that PostgreSQL is reachable and to bring the
schema up to date (schema.apply_schema) before the app and its pool start.

Its errors are asyncpg's and the operating system's as they are, not mapped to the
store's: start-up tells a wrong password or a TLS verification failure (one line, no
retry) from a server that is still starting (retried for PG_CONNECT_WAIT_MS), by the
exception's type (errors.UNAVAILABLE_ERRORS, :func:`is_tls_problem`).

The same connection tells which other brokers use the database (:func:`other_brokers`):
every broker's pool names itself ``queen-broker:<QUEEN_SERVER_ID>`` (its application_name),
and this broker's own pool does not exist yet.
"""
from __future__ import annotations

import ssl

import asyncpg


async def connect_for_schema(dsn: str, *, timeout_s: float,
                             tls: ssl.SSLContext | None = None) -> asyncpg.Connection:
    """One connection to ``dsn`` (``tls``, when given, is its TLS context); the caller
    closes it."""
    return await asyncpg.connect(dsn, timeout=timeout_s,
                                 **({"ssl": tls} if tls is not None else {}))


def is_tls_problem(exc: BaseException) -> bool:
    """The server's certificate failed verification, or there is no CA file to verify it."""
    return isinstance(exc, (ssl.SSLCertVerificationError,
                            asyncpg.exceptions.ClientConfigurationError))


OTHER_BROKERS = """
SELECT application_name AS name, coalesce(host(client_addr), 'local socket') AS address,
       count(*) AS connections
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'queen-broker:%'
GROUP BY 1, 2 ORDER BY 1, 2
"""
"""The brokers connected to this database now, by application_name and client address.
pg_stat_activity shows every role's application_name (a role without pg_read_all_stats
sees other roles' client_addr as NULL: 'local socket' then)."""


async def other_brokers(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """The brokers connected to ``conn``'s database other than this connection's (at boot,
    before this broker's pool opens: every other broker)."""
    return await conn.fetch(OTHER_BROKERS)
