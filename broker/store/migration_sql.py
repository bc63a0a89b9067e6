"""SQL of the schema copy (broker/service/migration.py, /api/v1/migration/*): run on
connections of their own, outside the pool, to the broker's database (the source) and to
the database an operator names (the target)."""
from __future__ import annotations

SERVER_VERSION = "SELECT version()"
"""The server's version string (the test-connection answer)."""

SCHEMA_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename"
"""The tables of schema $1, by name."""


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (a double quote inside is doubled)."""
    return '"' + name.replace('"', '""') + '"'


def recreate_schema(schema: str) -> str:
    """Drop schema ``schema`` with everything in it, then create it empty (two statements,
    sent as one simple query: no parameters)."""
    name = quote_ident(schema)
    return f"DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"


def row_count(schema: str, table: str) -> str:
    """Exact row count of ``schema.table``."""
    return f"SELECT count(*) FROM {quote_ident(schema)}.{quote_ident(table)}"
