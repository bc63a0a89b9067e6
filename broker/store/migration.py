"""Store side of the schema copy (broker/service/migration.py; SQL in migration_sql.py):
connections of their own, outside the pool, to the broker's database by its DSN (the
source) and to the database an operator names (the target), with the few statements
the copy runs on them. The copy itself is pg_dump | pg_restore (the service's).

Errors come out in the store's terms: :class:`~broker.store.errors.StoreUnavailable` when the
database cannot be reached, :class:`~broker.store.errors.StoreError` when it refused; the
original exception is the ``__cause__`` (its text is what the migration routes answer).
A failure of the source counts among this broker's database errors (it is its own
database); a failure of the target does not (it is the caller's database).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg

from broker.store import migration_sql as sql
from broker.store.errors import UNAVAILABLE_ERRORS, StoreError, StoreUnavailable, mapped_errors


@contextlib.contextmanager
def _target_errors() -> Iterator[None]:
    """The target's failures mapped like the store's, without counting them as this
    broker's database errors (telemetry ``db_errors``)."""
    try:
        yield
    except UNAVAILABLE_ERRORS as exc:
        raise StoreUnavailable(f"target database unavailable: {exc.__class__.__name__}: "
                               f"{exc}") from exc
    except asyncpg.exceptions.PostgresError as exc:
        raise StoreError(f"target database error (SQLSTATE {exc.sqlstate})") from exc


class OtherDatabase:
    """One connection outside the pool (the migration's source or target)."""

    def __init__(self, conn: asyncpg.Connection, *, is_target: bool) -> None:
        self._conn = conn
        self._errors = _target_errors if is_target else mapped_errors

    async def version(self) -> str:
        """The server's ``version()``."""
        with self._errors():
            return str(await self._conn.fetchval(sql.SERVER_VERSION))

    async def recreate_schema(self, schema: str) -> None:
        """Drop ``schema`` with everything in it, and create it empty."""
        with self._errors():
            await self._conn.execute(sql.recreate_schema(schema))

    async def table_names(self, schema: str) -> list[str]:
        """The tables of ``schema``, by name."""
        with self._errors():
            return [r["tablename"] for r in await self._conn.fetch(sql.SCHEMA_TABLES, schema)]

    async def row_count(self, schema: str, table: str) -> int:
        """Exact row count of ``schema.table``."""
        with self._errors():
            return int(await self._conn.fetchval(sql.row_count(schema, table)))

    async def close(self, timeout_s: float) -> None:
        """Close politely within ``timeout_s``, else at once; never raises."""
        try:
            await self._conn.close(timeout=timeout_s)
        except Exception:
            self._conn.terminate()


async def connect_target(*, host: str, port: int, user: str, password: str | None,
                         database: str, ssl: bool, timeout_s: float) -> OtherDatabase:
    """A connection to the database an operator named (``ssl``: TLS required, unverified)."""
    with _target_errors():
        conn = await asyncpg.connect(host=host, port=port, user=user, password=password,
                                     database=database, ssl="require" if ssl else False,
                                     timeout=timeout_s)
    return OtherDatabase(conn, is_target=True)


async def connect_source(dsn: str, *, timeout_s: float) -> OtherDatabase:
    """A connection of its own to the broker's database, by its DSN."""
    with mapped_errors():
        conn = await asyncpg.connect(dsn, timeout=timeout_s)
    return OtherDatabase(conn, is_target=False)
