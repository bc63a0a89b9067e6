"""broker/store/schema_current.sql is what the migrations make of an empty database: every
migration applied to a fresh database on the test PostgreSQL, dumped the way
``python3 dev.py schema`` dumps it, is the checked-in file, line for line. A migration added
or changed without regenerating the file fails here, with the lines that differ."""
from __future__ import annotations

import asyncio
import difflib
import re

import asyncpg
import pytest

from broker.store.schema_dump import CURRENT, dump_schema, migrate_and_dump


def file_major() -> int:
    """The PostgreSQL major version the checked-in file was generated on (its header)."""
    match = re.search(r"on PostgreSQL (\d+)\.", CURRENT.read_text())
    assert match, f"{CURRENT} has no header naming its PostgreSQL version"
    return int(match[1])


async def server_major(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SHOW server_version_num")) // 10000
    finally:
        await conn.close()


def differences(expected: str, actual: str, limit: int = 80) -> str:
    lines = list(difflib.unified_diff(expected.splitlines(), actual.splitlines(),
                                      "schema_current.sql (checked in)",
                                      "what the migrations make", lineterm="", n=1))
    more = f"\n... {len(lines) - limit} more lines" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


async def migrated(dsn: str) -> str:
    major = await server_major(dsn)
    if major != file_major():
        pytest.skip(f"the test PostgreSQL is {major}, the file was generated on {file_major()}: "
                    "pg_dump writes some DDL differently across major versions")
    return await migrate_and_dump(dsn)


async def test_the_current_schema_file_is_what_the_migrations_make(fresh_database):
    made = await migrated(fresh_database.dsn)
    assert made == CURRENT.read_text(), (
        f"{CURRENT} is not what the migrations make: run `python3 dev.py schema` and commit "
        f"the file\n{differences(CURRENT.read_text(), made)}")


async def test_the_comparison_sees_a_function_left_out(fresh_database):
    """The check can fail: with the data path's pop function gone from the database, the
    dump differs from the file, and the difference names the function."""
    await migrated(fresh_database.dsn)
    conn = await asyncpg.connect(fresh_database.dsn)
    try:
        signature = await conn.fetchval(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n "
            "ON n.oid = p.pronamespace WHERE n.nspname = 'queen' AND p.proname = 'pop_messages_v3'")
        await conn.execute(f"DROP FUNCTION {signature}")
        major = int(await conn.fetchval("SHOW server_version_num")) // 10000
    finally:
        await conn.close()
    without = await asyncio.to_thread(dump_schema, fresh_database.dsn, major)
    assert without != CURRENT.read_text()
    removed = [line for line in differences(CURRENT.read_text(), without, limit=10**6).splitlines()
               if line.startswith("-") and not line.startswith("---")]
    assert any("CREATE FUNCTION queen.pop_messages_v3(" in line for line in removed)
