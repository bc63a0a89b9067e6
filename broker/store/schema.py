"""Applying the schema at boot.

The DDL is idempotent and runs under a session advisory lock of its own, so
brokers starting together apply it one after the other instead of racing on
CREATE statements. The lock id is distinct from the leader-job locks 737001
(retention) and 737002 (stats).
"""
from __future__ import annotations

from importlib import resources

import asyncpg

BOOT_LOCK_ID = 737000
SCHEMA_FILES = ("schema.sql", "schema_ops.sql", "functions.sql")


def schema_sql() -> str:
    here = resources.files("broker.store")
    return "\n".join(here.joinpath(name).read_text() for name in SCHEMA_FILES)


async def apply_schema(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT pg_advisory_lock($1)", BOOT_LOCK_ID)
    try:
        await conn.execute(schema_sql())
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", BOOT_LOCK_ID)
