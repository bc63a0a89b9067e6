"""The schema: numbered migrations, each applied once, in order.

A migration is a file ``broker/store/migrations/NNNN_short_name.sql``. At boot
the broker reads ``queen.schema_migrations`` and applies the ones the database
lacks, each in its own transaction together with the row that records it, under
a session advisory lock of its own (737000, distinct from the leader-job locks
737001 and 737002), so brokers starting together apply them one after the
other instead of racing on DDL.

Why numbered migrations rather than re-applying one idempotent file at every
boot: during a rolling upgrade the old brokers are still running. A boot that
ran ``CREATE OR REPLACE FUNCTION`` would change, under their feet, the SQL the
old brokers call. So (the rules, also in ARCHITECTURE.md):

- a released migration is never edited; a change is a new migration;
- a function's name is its contract: a data-path function whose signature or
  meaning changes gets a new name (``..._v2``), and the old one stays until a
  later migration drops it, once no broker that can still be running during a
  rolling upgrade calls it (we support rolling from the previous release);
- a broker refuses to start against a database that has a migration it does not
  know (a newer broker got there first): it would call functions whose meaning
  may have changed.

A boot with nothing to apply only reads, so it works on a read-only server too
(a standby reached by mistake is then refused by the first write, not here).
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import asyncpg

BOOT_LOCK_ID = 737000
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


class SchemaTooNew(Exception):
    """The database holds migrations this broker does not know."""


class MigrationFailed(Exception):
    """A migration could not be applied; nothing of it was (its transaction rolled back)."""


@dataclass(frozen=True)
class SchemaState:
    version: int            # newest migration applied, after this boot
    applied_now: list[str]  # labels of the migrations this boot applied


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this broker, in order; numbered 1..N without gaps."""
    folder = resources.files("broker.store").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    numbers = [m.version for m in found]
    if numbers != list(range(1, len(found) + 1)):
        raise RuntimeError(f"broker/store/migrations must be numbered 1..N without gaps: {numbers}")
    return tuple(found)


def schema_version() -> int:
    """The newest schema this broker understands."""
    return migrations()[-1].version


def schema_sql() -> str:
    """All migrations as one script (benchmarks and tools that build a database)."""
    return "\n".join(m.sql for m in migrations())


async def _applied(conn: asyncpg.Connection) -> dict[int, str]:
    if await conn.fetchval("SELECT to_regclass('queen.schema_migrations')") is None:
        return {}
    rows = await conn.fetch("SELECT version, name FROM queen.schema_migrations")
    return {row["version"]: row["name"] for row in rows}


def _check_known(applied: dict[int, str]) -> None:
    known = schema_version()
    unknown = sorted(v for v in applied if v > known)
    if unknown:
        newest = unknown[-1]
        raise SchemaTooNew(
            f"the database schema is at version {newest} ({newest:04d}_{applied[newest]}), "
            f"newer than this broker understands (up to {known}); upgrade this broker "
            f"(it would call SQL whose meaning may have changed)")


async def apply_schema(conn: asyncpg.Connection) -> SchemaState:
    """Bring the database to this broker's schema version; raise SchemaTooNew if it is ahead."""
    applied = await _applied(conn)
    _check_known(applied)
    if all(m.version in applied for m in migrations()):
        return SchemaState(schema_version(), [])
    await conn.execute("SELECT pg_advisory_lock($1)", BOOT_LOCK_ID)
    try:
        # Another broker may have applied some while this one waited for the lock.
        applied = await _applied(conn)
        _check_known(applied)
        done = []
        for migration in migrations():
            if migration.version in applied:
                continue
            try:
                await _apply_one(conn, migration)
            except asyncpg.exceptions.ReadOnlySQLTransactionError:
                raise MigrationFailed(
                    f"migration {migration.label} cannot be applied: the server is read-only "
                    f"(a standby?); point PG_HOST at the primary") from None
            except asyncpg.exceptions.PostgresError as exc:
                raise MigrationFailed(f"migration {migration.label} failed, nothing of it was "
                                      f"applied: {exc.__class__.__name__}: {exc}") from None
            done.append(migration.label)
        return SchemaState(schema_version(), done)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", BOOT_LOCK_ID)


# A migration that alters a table the data path uses waits for the brokers still serving
# (a rolling upgrade); should PostgreSQL still pick it as a deadlock's victim, it is rolled
# back whole and tried again, a few times, before the broker gives up.
MIGRATION_ATTEMPTS = 5


async def _apply_one(conn: asyncpg.Connection, migration: Migration) -> None:
    for attempt in range(1, MIGRATION_ATTEMPTS + 1):
        try:
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(_CREATE_RECORD_TABLE)
                await conn.execute(_RECORD, migration.version, migration.name)
            return
        except asyncpg.exceptions.DeadlockDetectedError:
            if attempt == MIGRATION_ATTEMPTS:
                raise
            await asyncio.sleep(0.2 * attempt)


# The table is created by the same transaction as the first migration it records.
_CREATE_RECORD_TABLE = """
CREATE TABLE IF NOT EXISTS queen.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
_RECORD = "INSERT INTO queen.schema_migrations (version, name) VALUES ($1, $2)"
