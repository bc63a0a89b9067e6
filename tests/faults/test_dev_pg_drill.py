"""The outage drill ``python3 dev.py pg stop`` / ``pg start`` / ``pg status``, run as
written in a scratch copy of the checkout (dev.py, and .venv linked) under a real broker
started as ``python3 dev.py run`` starts it (embedded PostgreSQL in ./.queen/pgdata).

While the server is stopped the broker answers pushes ``buffered`` and its log says what it
does and what brings the database back (the watchdog leaves a server stopped on purpose
stopped); ``pg start`` starts it on the same port, the broker reconnects by itself and its
spool drains into PostgreSQL, each acknowledged push once, in order.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest

from broker.store.embedded_pg import EmbeddedPostgres
from tests.conftest import ROOT, BrokerProcess, free_port
from tests.faults.test_embedded_watchdog import push, stored
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(240)

_FOREIGN = ("PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB", "EMBEDDED_PG_DIR",
            "EMBEDDED_PG_PORT", "FILE_BUFFER_DIR", "PORT", "HOST", "VIRTUAL_ENV")


@pytest.fixture
def checkout():
    path = Path(tempfile.mkdtemp(prefix="qpg", dir="/tmp"))  # short: the PG socket is in it
    shutil.copy(ROOT / "dev.py", path / "dev.py")
    (path / ".venv").symlink_to(ROOT / ".venv")
    yield path
    pgdata = path / ".queen" / "pgdata"
    if pgdata.exists():
        EmbeddedPostgres(pgdata).stop(mode="immediate")
    shutil.rmtree(path, ignore_errors=True)


def dev_run(checkout: Path) -> BrokerProcess:
    """What ``python3 dev.py run`` starts in ``checkout`` (the defaults, relative to it)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(PORT=str(port), EMBEDDED_PG_PORT="0", QUEEN_MESH_PEERS="", DB_POOL_SIZE="4",
               DB_CONNECTION_TIMEOUT="500")
    log_path = checkout / f"broker-{port}.log"
    proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=checkout, env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    broker = BrokerProcess(f"http://127.0.0.1:{port}", port, env, proc, log_path)

    def healthy() -> bool:
        assert proc.poll() is None, f"broker exited:\n{broker.log()}"
        try:
            return httpx.get(broker.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
    wait_until(healthy, 90, "the broker to answer /health")
    return broker


def dev_pg(checkout: Path, action: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    return subprocess.run([sys.executable, "dev.py", "pg", action], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=120)


async def test_pg_stop_and_start_under_a_running_broker(checkout):
    broker = dev_run(checkout)
    pgdata = checkout / ".queen" / "pgdata"
    try:
        status = dev_pg(checkout, "status")
        port = int(pgdata.joinpath("postmaster.pid").read_text().splitlines()[3])
        assert status.returncode == 0, status
        assert f"runs on 127.0.0.1:{port}; its broker is pid {broker.proc.pid}" in status.stdout

        queue = f"drill-{uuid.uuid4().hex[:8]}"
        acknowledged: list[str] = []

        def send(txid: str) -> str:
            answer = push(broker.url, queue, "p", txid)
            if answer in ("queued", "buffered"):
                acknowledged.append(txid)
            return answer

        assert send("before") == "queued"
        stop = dev_pg(checkout, "stop")
        assert stop.returncode == 0, stop
        assert f"stopped the embedded PostgreSQL of {pgdata} (127.0.0.1:{port}); its broker " \
            f"is pid {broker.proc.pid}" in stop.stdout, stop.stdout
        assert not EmbeddedPostgres(pgdata).is_running()

        statuses = [send(f"gap-{i}") for i in range(5)]
        assert statuses[-1] == "buffered", statuses
        stopped_line = "was shut down, not by this broker: it stays stopped until it is " \
            "started again (python3 dev.py pg start, or restart this broker)"
        wait_until(lambda: stopped_line in broker.log(), 30, "the watchdog's line on the stop")
        log = broker.log()
        unreachable = [line for line in log.splitlines() if "database: unreachable" in line]
        assert len(unreachable) == 1, log
        assert "pushes are answered buffered" in unreachable[0], unreachable
        assert "reconnects by itself once PostgreSQL is back" in unreachable[0], unreachable
        assert not EmbeddedPostgres(pgdata).is_running()  # the watchdog saw it, left it stopped
        assert dev_pg(checkout, "status").returncode == 3

        start = dev_pg(checkout, "start")
        assert start.returncode == 0, start
        assert f"started the embedded PostgreSQL of {pgdata} on 127.0.0.1:{port}; its broker " \
            f"is pid {broker.proc.pid}" in start.stdout, start.stdout
        wait_until(lambda: "database: reachable again" in broker.log(), 60,
                   "the broker's line that its database is back")
        n = 0

        def queued_again() -> bool:
            nonlocal n
            n += 1
            return send(f"after-{n}") == "queued"
        wait_until(queued_again, 60, "a push answered queued again", interval=0.2)
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

        async def all_stored() -> list[str]:
            got = await stored(dsn, queue)
            return got if len(got) >= len(acknowledged) else []
        got = await wait_until_async(all_stored, 60, "every acknowledged push in PostgreSQL")
        assert got == acknowledged  # each once, in the order they were acknowledged
        wait_until(lambda: "runs again," in broker.log(), 10, "the watchdog's line on the start")
        assert "Traceback" not in broker.log()
        # Still the broker's: it stops it at exit.
        assert f"its broker is pid {broker.proc.pid}" in dev_pg(checkout, "status").stdout
        broker.proc.send_signal(signal.SIGINT)
        assert broker.proc.wait(60) == 0, broker.log()
        assert not EmbeddedPostgres(pgdata).is_running(), broker.log()
    finally:
        if broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait(10)


def test_pg_without_a_server_says_so(checkout):
    result = dev_pg(checkout, "stop")
    assert result.returncode == 1
    assert result.stderr.strip() == (f"dev.py: there is no embedded PostgreSQL in "
                                      f"{checkout / '.queen' / 'pgdata'} (`python3 dev.py run` "
                                      f"makes it)")
    assert dev_pg(checkout, "restart").returncode == 2
