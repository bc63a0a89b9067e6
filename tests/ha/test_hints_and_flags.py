"""Hints between real brokers, and what never depends on them.

- a received wake is never re-broadcast (invariant 17);
- peer liveness never affects serving (20);
- parked pops hold no database connection (22);
- a maintenance flip on A reaches B through the mesh, and through the reconcile
  loop when the mesh is down (47);
- a broker booting while push maintenance is on diverts pushes at once (49).
"""
from __future__ import annotations

import asyncio
import time

import asyncpg
import httpx

from tests.conftest import free_port, free_ports, start_broker
from tests.ha.test_mesh_brokers import all_connected, mesh_env, start_cluster, transport
from tests.waiting import wait_until, wait_until_async


def test_a_received_wake_is_not_rebroadcast(broker_factory, queue_name):
    """A pushes: B and C each receive A's hint; neither forwards it, so C gets
    exactly one MESSAGE_AVAILABLE_BATCH (from A), not a second one via B."""
    a, b, c = start_cluster(broker_factory, 3)
    for x in (a, b, c):
        wait_until(lambda x=x: all_connected(x.url, 2), what="full mesh")
    before = {x.url: transport(x.url)["messages_received"] for x in (b, c)}
    sent_b = transport(b.url)["messages_sent"]
    httpx.post(a.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]})
    wait_until(lambda: all(transport(x.url)["messages_received"] > before[x.url] for x in (b, c)),
               5, "hint received on B and C")
    time.sleep(0.5)  # room for a (wrong) forward to arrive
    # A sends one wake batch plus at most one coalesced hot-list hint per peer.
    for x in (b, c):
        assert transport(x.url)["messages_received"] - before[x.url] <= 2
    assert transport(b.url)["messages_sent"] == sent_b, "B forwarded a hint it received"


def test_a_broker_whose_peers_are_all_dead_serves_normally(broker_factory, queue_name):
    # Distinct ports: had its own mesh port been one of the "dead" ones, it would be alive.
    own, *dead_peers = free_ports(3)
    b = broker_factory(**mesh_env("queen-lonely", own, dead_peers,
                                  QUEEN_SYNC_DEAD_THRESHOLD_MS="300"))
    t = transport(b.url)
    assert t["servers_alive"] == 0 and not any(p["connected"] for p in t["peers"])
    r = httpx.post(b.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 9}]})
    assert r.json()[0]["status"] == "queued"
    m = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}").json()["messages"][0]
    ack = httpx.post(b.url + "/api/v1/ack", json={"transactionId": m["transactionId"],
                                                  "partitionId": m["partitionId"],
                                                  "leaseId": m["leaseId"]}).json()
    assert ack[0]["success"] is True


async def test_parked_pops_hold_no_database_connection(broker_factory, database, queue_name):
    # A slow backoff timer: parked pops do not re-check while we look.
    b = broker_factory(QUEEN_SERVER_ID="queen-parking", POP_WAIT_INITIAL_INTERVAL_MS="8000",
                       POP_WAIT_MAX_INTERVAL_MS="8000")

    async def broker_connections() -> int:
        """Connections of that broker doing something (not idle in its pool)."""
        conn = await asyncpg.connect(database.dsn)
        try:
            return await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                "AND state <> 'idle'", "queen-broker:queen-parking")
        finally:
            await conn.close()

    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        pops = [asyncio.create_task(client.get(f"/api/v1/pop/queue/{queue_name}-{i}",
                                               params={"wait": "true", "timeout": "4000"}))
                for i in range(30)]
        async def all_parked() -> bool:
            return (await client.get("/health")).json()["shared_state"]["parkedPops"] == 30
        await wait_until_async(all_parked, 5, "30 pops parked", interval=0.05)
        await asyncio.sleep(0.3)  # any attempt still in flight finishes
        during = await broker_connections()
        for p in pops:
            p.cancel()
        await asyncio.gather(*pops, return_exceptions=True)
    # 30 parked pops and not one connection busy on their behalf.
    assert during == 0, during


def _maintenance(url: str) -> bool:
    return httpx.get(url + "/health", timeout=5).json()["shared_state"]["maintenance_mode"]


async def test_maintenance_flip_on_a_reaches_b_through_the_mesh(broker_factory, fresh_database,
                                                                tmp_path):
    ports = [free_port(), free_port()]
    a = start_broker(fresh_database, tmp_path, **mesh_env("queen-fa", ports[0], [ports[1]]))
    b = start_broker(fresh_database, tmp_path, **mesh_env("queen-fb", ports[1], [ports[0]]))
    try:
        for x in (a, b):
            wait_until(lambda x=x: all_connected(x.url, 1), what="mesh up")
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": True})
        wait_until(lambda: _maintenance(b.url), 3, "flag on B via the mesh")
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": False})
        wait_until(lambda: not _maintenance(b.url), 3, "flag off on B via the mesh")
    finally:
        a.stop()
        b.stop()


async def test_maintenance_flip_reaches_an_unmeshed_broker_through_the_reconcile_loop(
        fresh_database, tmp_path, queue_name):
    a = start_broker(fresh_database, tmp_path)
    b = start_broker(fresh_database, tmp_path, QUEEN_CACHE_REFRESH_INTERVAL_MS="300")
    try:
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": True})
        wait_until(lambda: _maintenance(b.url), 15, "flag on B via reconcile (5 s first delay)")
        r = httpx.post(b.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 1}]})
        assert r.status_code == 201 and r.json()[0]["status"] == "buffered"
        httpx.post(a.url + "/api/v1/system/maintenance", json={"enabled": False})
        wait_until(lambda: not _maintenance(b.url), 5, "flag off on B")
        # B's spool drains once the flag is off there.
        wait_until(lambda: httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}").json()["messages"],
                   10, "spooled push drained on B")
    finally:
        a.stop()
        b.stop()


async def test_broker_booting_in_maintenance_diverts_pushes_at_once(fresh_database, tmp_path,
                                                                   queue_name):
    first = start_broker(fresh_database, tmp_path)
    first.stop()
    conn = await asyncpg.connect(fresh_database.dsn)
    await conn.execute("UPDATE queen.system_state SET value = '{\"enabled\": true}' "
                       "WHERE key = 'maintenance_mode'")
    await conn.close()
    b = start_broker(fresh_database, tmp_path)
    try:
        r = httpx.post(b.url + "/api/v1/push", json={"items": [{"queue": queue_name, "payload": 2}]})
        assert r.status_code == 201 and r.json()[0]["status"] == "buffered"
        state = httpx.get(b.url + "/api/v1/system/maintenance").json()
        assert state["maintenanceMode"] is True and state["bufferedMessages"] == 1
    finally:
        b.stop()
