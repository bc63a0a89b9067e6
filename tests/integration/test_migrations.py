"""Numbered migrations (broker/store/schema.py): each applied once, in order, recorded in
queen.schema_migrations; a boot with nothing to apply changes nothing (in particular it
replaces no function a running broker calls); a broker refuses, in one line, a database
whose schema is newer than it understands. Real broker processes on a fresh database."""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import asyncpg

from broker.store.schema import migrations, schema_sql, schema_version
from tests.conftest import ROOT, db_fetch, db_val, free_port, start_broker


def run_broker_to_exit(database, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, **database.env(), "HOST": "127.0.0.1", "PORT": str(free_port()),
           "LOG_LEVEL": "INFO", "QUEEN_MESH_PEERS": "", "DB_POOL_SIZE": "4",
           "FILE_BUFFER_DIR": str(tmp_path / "buffers-exit")}
    return subprocess.run([sys.executable, "-m", "broker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_migrations_are_numbered_one_to_n_and_the_script_is_all_of_them():
    numbers = [m.version for m in migrations()]
    assert numbers == list(range(1, len(numbers) + 1)) and schema_version() == numbers[-1]
    assert all(m.sql in schema_sql() for m in migrations())


def test_no_migration_redefines_a_function_an_earlier_one_created():
    """A function's name is its contract: a later migration that CREATE OR REPLACEs one would
    change, during a rolling upgrade, the SQL the previous release's brokers call. A changed
    function is a new name (..._v2)."""
    defined: dict[str, str] = {}
    pattern = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+queen\.(\w+)", re.I)
    for migration in migrations():
        for name in set(pattern.findall(migration.sql)):
            assert name not in defined, (f"{migration.label} redefines queen.{name}, "
                                         f"created by {defined[name]}")
            defined[name] = migration.label
    assert "push_ordered" in defined and "pop_messages" in defined


def test_a_fresh_database_gets_every_migration_once(fresh_database, tmp_path):
    broker = start_broker(fresh_database, tmp_path)
    try:
        rows = db_fetch(fresh_database, "SELECT version, name FROM queen.schema_migrations "
                                        "ORDER BY version")
        assert [(r["version"], r["name"]) for r in rows] == \
            [(m.version, m.name) for m in migrations()]
        assert "schema: applied 0001_base" in broker.log()
        # 0002 dropped the pre-spool-order push function; the current one is there.
        assert db_val(fresh_database, "SELECT to_regproc('queen.push_messages')") is None
        assert db_val(fresh_database, "SELECT to_regproc('queen.push_ordered')") is not None
    finally:
        broker.stop()


def test_a_boot_with_nothing_to_apply_replaces_no_function(fresh_database, tmp_path):
    """The rolling-upgrade rule: a booting broker must not change the SQL running brokers
    call. A marker put into a data-path function survives the next boot untouched."""
    first = start_broker(fresh_database, tmp_path)
    first.stop()
    applied_at = db_fetch(fresh_database, "SELECT version, applied_at FROM queen.schema_migrations")
    definition = db_val(fresh_database, "SELECT pg_get_functiondef("
                                        "'queen.spool_beat(text, integer)'::regprocedure)")
    db_val(fresh_database,
           definition.replace("AS $function$", "AS $function$\n-- marker: set by the test", 1))
    second = start_broker(fresh_database, tmp_path)
    try:
        assert "schema: at version" in second.log() and "nothing to apply" in second.log()
        assert "-- marker: set by the test" in db_val(
            fresh_database, "SELECT prosrc FROM pg_proc WHERE oid = "
                            "'queen.spool_beat(text, integer)'::regprocedure")
        assert db_fetch(fresh_database,
                        "SELECT version, applied_at FROM queen.schema_migrations") == applied_at
    finally:
        second.stop()


def test_a_database_newer_than_the_broker_is_refused_in_one_line(fresh_database, tmp_path):
    start_broker(fresh_database, tmp_path).stop()
    newer = schema_version() + 1
    db_val(fresh_database, "INSERT INTO queen.schema_migrations (version, name) "
                           f"VALUES ({newer}, 'from_the_future')")
    result = run_broker_to_exit(fresh_database, tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, output
    assert f"schema is at version {newer} ({newer:04d}_from_the_future)" in errors[0]
    assert f"up to {schema_version()}" in errors[0] and "upgrade this broker" in errors[0]


def test_a_database_made_before_migrations_were_numbered_is_taken_over(fresh_database, tmp_path):
    """Brokers older than queen.schema_migrations applied the base schema at each boot and
    left no record: 0001 (idempotent) runs on it once, keeps its data, and is recorded."""
    async def legacy_schema_with_a_message():
        conn = await asyncpg.connect(fresh_database.dsn)
        try:
            await conn.execute(migrations()[0].sql)  # what an old broker's boot ran
            await conn.execute("INSERT INTO queen.queues (name) VALUES ('legacy-q')")
        finally:
            await conn.close()

    asyncio.run(legacy_schema_with_a_message())
    broker = start_broker(fresh_database, tmp_path)
    try:
        versions = db_fetch(fresh_database, "SELECT version FROM queen.schema_migrations")
        assert sorted(r["version"] for r in versions) == [m.version for m in migrations()]
        assert db_val(fresh_database,
                      "SELECT count(*) FROM queen.queues WHERE name = 'legacy-q'") == 1
    finally:
        broker.stop()


def test_a_migration_that_fails_is_one_line_and_leaves_nothing_half_applied(fresh_database,
                                                                             tmp_path):
    """A migration runs in one transaction with its record: when it fails (here: 0002 cannot
    drop a function a view depends on), nothing of it stays and the broker says which."""
    async def block_0002():
        conn = await asyncpg.connect(fresh_database.dsn)
        try:
            await conn.execute(migrations()[0].sql)
            # A view that calls it: DROP FUNCTION (without CASCADE) refuses while it exists.
            await conn.execute(
                "CREATE VIEW public.uses_push_messages AS SELECT * FROM queen.push_messages("
                "NULL::integer[], NULL::text[], NULL::text[], NULL::uuid[], NULL::text[], "
                "NULL::uuid[], NULL::text[], NULL::boolean[], NULL::text[])")
        finally:
            await conn.close()

    asyncio.run(block_0002())
    result = run_broker_to_exit(fresh_database, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "migration 0002_drop_push_messages failed" in errors[0], output
    assert db_val(fresh_database, "SELECT to_regproc('queen.push_messages')") is not None
    versions = db_fetch(fresh_database, "SELECT version FROM queen.schema_migrations")
    assert [r["version"] for r in versions] == [1]
