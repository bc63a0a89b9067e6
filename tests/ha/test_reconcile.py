"""The reconcile loop: the database is the truth for the maintenance flags,
on a single broker with no peers too (a lost or never-sent flip heals)."""
from __future__ import annotations

import asyncpg
import httpx

from tests.conftest import start_broker
from tests.waiting import wait_until


def _state(url: str) -> dict:
    return httpx.get(url + "/health", timeout=5).json()["shared_state"]


async def test_flag_written_in_sql_reaches_a_lone_broker_through_the_reconcile_loop(
        fresh_database, tmp_path, queue_name):
    b = start_broker(fresh_database, tmp_path, QUEEN_CACHE_REFRESH_INTERVAL_MS="300")
    try:
        assert _state(b.url)["pop_maintenance_mode"] is False
        conn = await asyncpg.connect(fresh_database.dsn)
        try:
            await conn.execute("UPDATE queen.system_state SET value = '{\"enabled\": true}' "
                               "WHERE key = 'pop_maintenance_mode'")
            # the reconciler's first cycle runs 5 s after the start, then every 300 ms
            wait_until(lambda: _state(b.url)["pop_maintenance_mode"] is True, 15,
                       "the flag set in PostgreSQL reaches the broker")
            paused = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}").json()
            assert paused == {"messages": [], "paused": True}

            await conn.execute("UPDATE queen.system_state SET value = '{\"enabled\": false}' "
                               "WHERE key = 'pop_maintenance_mode'")
            wait_until(lambda: _state(b.url)["pop_maintenance_mode"] is False, 5,
                       "the flag cleared in PostgreSQL reaches the broker")
        finally:
            await conn.close()
    finally:
        b.stop()


async def test_broker_booting_with_pop_maintenance_on_answers_paused(fresh_database, tmp_path,
                                                                    queue_name):
    first = start_broker(fresh_database, tmp_path)  # creates the schema
    first.stop()
    conn = await asyncpg.connect(fresh_database.dsn)
    await conn.execute("UPDATE queen.system_state SET value = '{\"enabled\": true}' "
                       "WHERE key = 'pop_maintenance_mode'")
    await conn.close()
    b = start_broker(fresh_database, tmp_path)
    try:
        assert _state(b.url)["pop_maintenance_mode"] is True
        r = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}", params={"wait": "true",
                                                                        "timeout": "300"})
        assert r.json() == {"messages": [], "paused": True}
    finally:
        b.stop()
