"""Boot: configuration errors stop the broker; schema application is race-free."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import asyncpg

from tests.conftest import ROOT, start_broker

# The broker's line format (broker/__main__.py setup_logging): time, level padded to 7, message.
LINE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO    "


def test_bad_configuration_stops_the_broker_with_a_message_naming_the_variable(database):
    env = {**os.environ, **database.env(), "PORT": "not-a-port"}
    proc = subprocess.run([sys.executable, "-m", "broker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "PORT" in proc.stderr and "not-a-port" in proc.stderr


def test_sanic_and_broker_lines_share_one_format(broker):
    """Sanic's own lines come out through loguru, formatted like the broker's."""
    log = broker.log()
    for message in ("config: http: ", "Starting worker ", "broker .* serving on ",
                    "Worker ready "):
        assert re.search(f"^{LINE}{message}", log, re.MULTILINE), (message, log)


async def test_brokers_booting_together_on_an_empty_database_agree_on_the_schema(
        fresh_database, tmp_path):
    """Invariant 64: the boot advisory lock serialises DDL, so no replica fails."""
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(start_broker, fresh_database, tmp_path) for _ in range(3)]
        brokers = [f.result() for f in futures]
    try:
        for b in brokers:
            assert b.proc.poll() is None, b.log()
        conn = await asyncpg.connect(fresh_database.dsn)
        try:
            tables = {r["tablename"] for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'queen'")}
            assert {"queues", "partitions", "messages", "log_consumers",
                    "dead_letter_queue", "system_state"} <= tables
            flags = await conn.fetch("SELECT key FROM queen.system_state ORDER BY key")
            assert [r["key"] for r in flags] == ["maintenance_mode", "pop_maintenance_mode"]
        finally:
            await conn.close()
    finally:
        for b in brokers:
            b.stop()
