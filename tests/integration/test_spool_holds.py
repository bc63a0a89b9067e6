"""The operator's view of the cluster's spool holds, through HTTP and queenctl, against a real
broker on a database of this module's own (the figures are cluster-wide): the listing, the
release of one spool's holds (refused for a fresh heartbeat unless forced, and for (staged)),
the figures in /health and Prometheus, and bad input. Spools are fabricated through the
store's own registration under ids no broker has."""
from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import httpx
import pytest

from broker.store.db import Store, now_us
from queenctl import client
from queenctl.__main__ import main
from tests.conftest import Database, start_broker

SPOOLS = "/api/v1/system/spools"


def _run(database: Database, statement: str, *args):
    async def run():
        conn = await asyncpg.connect(database.dsn)
        try:
            return await conn.fetch(statement, *args)
        finally:
            await conn.close()
    return asyncio.run(run())


@pytest.fixture(scope="module")
def own_database(database):
    name = f"t_holds_{uuid.uuid4().hex[:8]}"
    _run(database, f'CREATE DATABASE "{name}"')
    yield Database(database.host, database.port, database.user, database.password, name)
    _run(database, f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def holds_broker(own_database, tmp_path_factory):
    broker = start_broker(own_database, tmp_path_factory.mktemp("holds"))
    yield broker
    broker.stop()


@pytest.fixture
def http(holds_broker):
    with httpx.Client(base_url=holds_broker.url, timeout=10) as c:
        yield c


@pytest.fixture(autouse=True)
def no_holds(own_database, holds_broker):
    """Each test starts with no spool holding anything."""
    _run(own_database, "DELETE FROM queen.spool_backlog WHERE server_id LIKE 'fab-%'")
    _run(own_database, "DELETE FROM queen.spool_servers WHERE server_id LIKE 'fab-%'")


def spool(database: Database, partitions: list[tuple[str, str]], silent_s: float = 0) -> str:
    """A spool holding ``partitions``, registered as a spool registers itself; its heartbeat
    ``silent_s`` seconds old."""
    name = f"fab-{uuid.uuid4().hex[:8]}"

    async def register():
        store = await Store.connect(database.dsn, pool_size=1, connect_timeout_ms=5000,
                                    statement_timeout_ms=30000, lock_timeout_ms=10000,
                                    idle_timeout_ms=30000)
        try:
            store.server_id = name
            await store.register_spool({pair: now_us() for pair in partitions})
        finally:
            await store.close()
    asyncio.run(register())
    if silent_s:
        _run(database, "UPDATE queen.spool_servers SET seen_at = now() - make_interval("
                       "secs => $2) WHERE server_id = $1", name, silent_s)
    return name


def rows_of(database: Database, name: str) -> tuple[int, int]:
    """(queen.spool_backlog rows, queen.spool_servers rows) of spool ``name``."""
    [r] = _run(database, "SELECT (SELECT count(*) FROM queen.spool_backlog WHERE server_id = $1)"
                         " AS b, (SELECT count(*) FROM queen.spool_servers WHERE server_id = $1)"
                         " AS s", name)
    return r["b"], r["s"]


def test_the_listing_health_and_prometheus_show_silent_spools_and_their_partitions(
        own_database, http):
    live = spool(own_database, [("hq", "a"), ("hq", "b")])
    dead = spool(own_database, [("hq", "b"), ("hq", "c"), ("hq2", "c")], silent_s=600)
    listing = http.get(SPOOLS)
    assert listing.status_code == 200, listing.text
    answer = listing.json()
    assert answer["boundMs"] == 30000 and answer["forgetMs"] == 3600000
    assert answer["silentSpools"] == 1 and answer["silentHeldPartitions"] == 3
    by_id = {s["spool"]: s for s in answer["spools"]}
    assert set(by_id) == {live, dead}  # the broker's own spool holds nothing: not listed
    assert by_id[live]["silent"] is False and by_id[live]["partitions"] == 2
    assert by_id[dead]["silent"] is True and by_id[dead]["partitions"] == 3
    assert by_id[dead]["silentSeconds"] >= 600
    health = http.get("/health").json()
    assert health["spoolHolds"]["silentHeldPartitions"] == 3
    assert {s["spool"] for s in health["spoolHolds"]["spools"]} == {live, dead}
    for field in ("status", "database", "server", "spool", "shared_state", "ephemeral"):
        assert field in health  # the existing fields stay
    prom = http.get("/metrics/prometheus").text
    assert "queen_spool_silent_held_partitions 3.0" in prom
    assert "queen_spool_silent_spools 1.0" in prom


def test_a_release_deletes_a_silent_spools_holds_and_refuses_a_fresh_one_unless_forced(
        own_database, http):
    before = http.get("/health").json()["spoolHolds"]["ended"]["released"]
    live = spool(own_database, [("rq", "a"), ("rq", "b")])
    dead = spool(own_database, [("rq", "a")], silent_s=600)

    refused = http.post(f"{SPOOLS}/{live}/release")
    assert refused.status_code == 409, refused.text
    assert "force" in refused.json()["error"] and live in refused.json()["error"]
    assert rows_of(own_database, live) == (2, 1)

    released = http.post(f"{SPOOLS}/{dead}/release")
    assert released.status_code == 200, released.text
    assert released.json() == {"spool": dead, "released": True, "partitions": 1,
                               "lastHeartbeat": released.json()["lastHeartbeat"],
                               "forced": False}
    assert rows_of(own_database, dead) == (0, 0)

    forced = http.post(f"{SPOOLS}/{live}/release", json={"force": True})
    assert forced.status_code == 200 and forced.json()["partitions"] == 2
    assert rows_of(own_database, live) == (0, 0)
    assert http.get(SPOOLS).json()["spools"] == []
    assert http.get("/health").json()["spoolHolds"]["ended"]["released"] == before + 3
    assert f'queen_spool_holds_ended_total{{reason="released"}} {before + 3}.0' in \
        http.get("/metrics/prometheus").text

    again = http.post(f"{SPOOLS}/{dead}/release")
    assert again.status_code == 404 and dead in again.json()["error"]


def test_the_staged_holder_and_bad_input_are_refused_with_a_4xx(http):
    staged = http.post(f"{SPOOLS}/%28staged%29/release", json={"force": True})
    assert staged.status_code == 409 and "not a spool" in staged.json()["error"]
    for body in ({"force": "yes"}, {"force": 1}, {"forced": True}, [True]):
        r = http.post(f"{SPOOLS}/fab-x/release", json=body)
        assert r.status_code == 400, (body, r.text)
    r = http.post(f"{SPOOLS}/fab-x/release", content=b"{not json")
    assert r.status_code == 400, r.text
    r = http.post(f"{SPOOLS}/{'x' * 300}/release")
    assert r.status_code == 400 and "not a spool id" in r.json()["error"]
    r = http.post(f"{SPOOLS}/fab-%01/release")
    assert r.status_code == 400, r.text


@pytest.fixture
def ctl(holds_broker, capsys):
    def run(*args: str):
        capsys.readouterr()
        code = main(["--url", holds_broker.url, *args])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_queenctl_lists_spools_and_releases_one(own_database, ctl):
    code, out, _ = ctl("spools")
    assert code == 0 and "(no spool holds partitions)" in out
    live = spool(own_database, [("cq", "a")])
    dead = spool(own_database, [("cq", "a"), ("cq", "b")], silent_s=120)
    code, out, _ = ctl("spools")
    assert code == 0 and live in out and dead in out and "silent" in out
    assert "2 partition(s) held by 1 silent spool(s)" in out
    code, out, _ = ctl("--json", "spools", "list")
    assert code == 0 and json.loads(out)["silentSpools"] == 1

    code, out, err = ctl("spools", "release", live, "--yes")
    assert code == client.FAILED and "HTTP 409" in err and "force" in err
    code, out, _ = ctl("spools", "release", live, "--force", "--yes")
    assert code == 0 and f"released {live}: 1 partition(s)" in out
    code, out, _ = ctl("spools", "release", dead, "--yes")
    assert code == 0 and f"released {dead}: 2 partition(s)" in out
    code, _, err = ctl("spools", "release", dead, "--yes")
    assert code == client.NOT_FOUND and err.count("\n") == 1
    code, out, _ = ctl("spools", "release", "--help")
    assert code == 0 and "order exception" in out and "nothing already in" in out
