import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg
import pytest

# The project is not installed into the venv; make `broker` importable from the repo root.
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from broker.store.embedded_pg import EmbeddedPostgres, EmbeddedPostgresError  # noqa: E402


@pytest.fixture
def base_dir():
    # Short path under /tmp: the unix socket lives in the data dir when the path allows.
    path = Path(tempfile.mkdtemp(prefix="qpg", dir="/tmp"))
    servers = []
    yield path, servers
    for server in servers:
        server.stop(mode="immediate")
    shutil.rmtree(path, ignore_errors=True)


def make(base_dir, name="data", port=0) -> EmbeddedPostgres:
    path, servers = base_dir
    server = EmbeddedPostgres(path / name, port=port)
    servers.append(server)
    return server


async def fetchval(server, query):
    conn = await asyncpg.connect(server.dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


async def test_start_stop_restart_keeps_data(base_dir):
    pg = make(base_dir)
    await pg.astart()
    assert pg.is_running() and pg.port != 0
    assert pg.dsn == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    assert await fetchval(pg, "select 1") == 1
    assert await fetchval(pg, "show max_connections") == "200"
    await fetchval(pg, "create table kept as select 42 as answer")

    await pg.astop()
    assert not pg.is_running()
    await pg.astop()  # idempotent
    pg.stop()

    port = pg.port
    await pg.astart()
    assert pg.port == port  # a picked port is kept across restarts
    assert await fetchval(pg, "select answer from kept") == 42
    pg.start()  # idempotent while running
    assert pg.is_running()


async def test_second_instance_adopts_the_running_server(base_dir):
    first = make(base_dir)
    first.start()
    second = EmbeddedPostgres(first.data_dir, port=0)
    second.start()
    assert second.port == first.port and second.is_running()
    assert await fetchval(second, "select 2") == 2


async def test_kill_then_start_recovers(base_dir):
    pg = make(base_dir)
    pg.start()
    await fetchval(pg, "create table survived as select 7 as n")
    pg.kill()
    assert not pg.is_running()
    pg.start()  # crash recovery from the WAL
    assert await fetchval(pg, "select n from survived") == 7


def test_concurrent_processes_share_one_initdb(base_dir):
    path, servers = base_dir
    data_dir = path / "race"
    script = (
        f"import json, sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from broker.store.embedded_pg import EmbeddedPostgres\n"
        f"pg = EmbeddedPostgres({str(data_dir)!r}, port=0); pg.start()\n"
        "print(json.dumps(pg.port))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    servers.append(EmbeddedPostgres(data_dir))  # so the fixture stops it
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    ports = {json.loads(out) for out, _ in results}
    assert len(ports) == 1  # one server, started once, adopted by the other process


def test_start_failure_reports_the_server_log(base_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        pg = make(base_dir, port=busy.getsockname()[1])
        with pytest.raises(EmbeddedPostgresError) as err:
            pg.start()
    assert "could not bind" in str(err.value) or "could not create" in str(err.value)
    assert not pg.is_running()


async def test_long_data_dir_uses_a_short_socket_dir(base_dir):
    pg = make(base_dir, name="d" * 110)
    pg.start()
    assert await fetchval(pg, "select 3") == 3
    socket_dir = Path(await fetchval(pg, "show unix_socket_directories"))
    assert socket_dir != pg.data_dir and len(str(socket_dir)) < 40
    pg.stop()
    shutil.rmtree(socket_dir, ignore_errors=True)
