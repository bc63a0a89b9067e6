"""Starting the broker (real processes): the embedded PostgreSQL is owned, never taken over, and
every failure to start is one line naming what to change, with the database left as it was.

The brokers here run their own embedded PostgreSQL in a temporary EMBEDDED_PG_DIR (or, for the
unreachable-database cases, point PG_HOST at a port nobody listens on).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from broker.store.embedded_pg import EmbeddedPostgres
from tests.conftest import ROOT, BrokerProcess, free_port, wait_healthy
from tests.waiting import wait_until

# Variables of the surrounding environment that would point a broker elsewhere.
_FOREIGN = ("PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB", "EMBEDDED_PG_DIR",
            "EMBEDDED_PG_PORT", "PORT", "HOST")


def broker_env(tmp: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update({"HOST": "127.0.0.1", "PORT": str(free_port()), "LOG_LEVEL": "INFO",
                "EMBEDDED_PG_PORT": "0", "QUEEN_MESH_PEERS": "", "DB_POOL_SIZE": "4",
                "FILE_BUFFER_DIR": str(tmp / f"buffers-{time.monotonic_ns()}")})
    env.update(overrides)
    return env


def launch(tmp: Path, **env: str) -> BrokerProcess:
    """A broker process, returned once /health answers 200."""
    env = broker_env(tmp, **env)
    log_path = tmp / f"broker-{env['PORT']}.log"
    proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=ROOT, env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{env['PORT']}"
    broker = BrokerProcess(url, int(env["PORT"]), env, proc, log_path)
    return wait_healthy(broker, 60)


def run_to_exit(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT,
                          env=broker_env(tmp, **env), capture_output=True, text=True, timeout=120)


def assert_one_error_line(output: str, *words: str) -> str:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, output
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def database_connected(broker: BrokerProcess) -> bool:
    r = httpx.get(broker.url + "/health", timeout=10)
    return r.status_code == 200 and r.json()["database"] == "connected"


@pytest.fixture(scope="module")
def tmp() -> Path:
    # Short, under /tmp: the embedded server's unix socket lives in its data dir.
    path = Path(tempfile.mkdtemp(prefix="qst", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def data_dir(tmp) -> Path:
    path = tmp / "pg"
    yield path
    EmbeddedPostgres(path).stop(mode="immediate")  # whatever a test left running


@pytest.fixture(scope="module")
def first(tmp, data_dir) -> BrokerProcess:
    """The broker that started the embedded PostgreSQL of ``data_dir``."""
    broker = launch(tmp, EMBEDDED_PG_DIR=str(data_dir))
    yield broker
    broker.stop()


# -- a second broker in the same data directory ---------------------------------------------

def test_a_second_broker_uses_the_running_database_and_leaves_it_running(tmp, data_dir, first):
    assert "this broker stops it at exit" in first.log()
    second = launch(tmp, EMBEDDED_PG_DIR=str(data_dir))
    try:
        assert f"started by broker pid {first.proc.pid}: using it" in second.log()
        queue = f"test-{time.monotonic_ns()}"
        r = httpx.post(second.url + "/api/v1/push", json={"items": [{"queue": queue, "payload": 1}]})
        assert r.status_code == 200, r.text
    finally:
        second.stop()
    assert second.proc.returncode == 0, second.log()
    assert "stopping embedded PostgreSQL" not in second.log()
    assert EmbeddedPostgres(data_dir).is_running()
    assert database_connected(first)
    r = httpx.get(first.url + f"/api/v1/pop/queue/{queue}", timeout=10)
    assert r.status_code == 200 and len(r.json()["messages"]) == 1, r.text


def test_port_in_use_is_one_line_and_leaves_the_running_database_alone(tmp, data_dir, first):
    result = run_to_exit(tmp, EMBEDDED_PG_DIR=str(data_dir), PORT=str(first.port))
    assert result.returncode != 0
    assert_one_error_line(result.stderr, f"127.0.0.1:{first.port}", "PORT", "HOST")
    assert "starting embedded PostgreSQL" not in result.stderr  # checked before the database
    assert database_connected(first)


def test_port_in_use_starts_no_database(tmp):
    fresh = tmp / "never"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_to_exit(tmp, EMBEDDED_PG_DIR=str(fresh), PORT=str(port))
    assert result.returncode != 0
    assert_one_error_line(result.stderr, f"127.0.0.1:{port}", "PORT")
    assert not fresh.exists()


def test_a_spool_directory_another_live_broker_holds_is_one_line(tmp, data_dir, first):
    """One spool directory, one broker: a second broker on the first's FILE_BUFFER_DIR stops
    before the database, naming the directory and the holder's pid; the first keeps its
    directory and its database."""
    spool = first.env["FILE_BUFFER_DIR"]
    result = run_to_exit(tmp, EMBEDDED_PG_DIR=str(data_dir), FILE_BUFFER_DIR=spool)
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr, spool, f"pid {first.proc.pid}", "FILE_BUFFER_DIR")
    assert "is in use by another broker" in line
    assert "embedded PostgreSQL" not in result.stderr  # refused before the database
    assert database_connected(first)


def test_a_spool_directory_whose_broker_was_killed_is_taken_over(tmp, data_dir, first):
    """The lock dies with its process (kill -9 included): a broker restarted on the directory
    starts, and then holds it against a third."""
    spool = str(tmp / f"spool-{time.monotonic_ns()}")
    killed = launch(tmp, EMBEDDED_PG_DIR=str(data_dir), FILE_BUFFER_DIR=spool)
    os.kill(killed.proc.pid, signal.SIGKILL)
    killed.proc.wait(10)
    successor = launch(tmp, EMBEDDED_PG_DIR=str(data_dir), FILE_BUFFER_DIR=spool)
    try:
        assert (Path(spool) / "lock").read_text().strip() == str(successor.proc.pid)
        result = run_to_exit(tmp, EMBEDDED_PG_DIR=str(data_dir), FILE_BUFFER_DIR=spool)
        assert result.returncode == 1
        assert_one_error_line(result.stderr, spool, f"pid {successor.proc.pid}")
    finally:
        successor.stop()


def test_a_503_says_when_to_retry(tmp, data_dir, first):
    pg = EmbeddedPostgres(data_dir, port=0)
    pg.start()  # running: this only learns its port, to restart it there
    pg.stop()  # from outside: the broker did not see it coming
    try:
        r = httpx.get(first.url + "/api/v1/resources/queues", timeout=30)
        assert r.status_code == 503 and r.headers.get("retry-after") == "1", (r, r.headers)
        assert "error" in r.json()
    finally:
        pg.start()
    wait_until(lambda: database_connected(first), 60, "the first broker to reconnect")


def test_a_broker_inherits_the_database_whose_owner_was_killed(tmp, data_dir, first):
    first.stop()
    EmbeddedPostgres(data_dir).stop()
    owner = launch(tmp, EMBEDDED_PG_DIR=str(data_dir))
    assert "this broker stops it at exit" in owner.log()
    owner.proc.send_signal(signal.SIGKILL)  # the server stays up, its owner is gone
    owner.proc.wait(10)
    assert EmbeddedPostgres(data_dir).is_running()
    heir = launch(tmp, EMBEDDED_PG_DIR=str(data_dir))
    assert "this broker now owns it" in heir.log(), heir.log()
    heir.stop()
    assert heir.proc.returncode == 0 and "stopping embedded PostgreSQL" in heir.log()
    assert not EmbeddedPostgres(data_dir).is_running()


# -- --help, --version ----------------------------------------------------------------------

def test_help_prints_usage_and_starts_nothing(tmp):
    fresh = tmp / "help"
    result = run_to_exit(tmp, "--help", EMBEDDED_PG_DIR=str(fresh))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: queen-broker")
    for word in ("PORT", "PG_HOST", "PG_CONNECT_WAIT_MS", "EMBEDDED_PG_DIR",
                 "docs/operations/configuration.md"):
        assert word in result.stdout
    assert not fresh.exists() and result.stderr == ""


def test_version_prints_the_version(tmp):
    from broker import __version__
    result = run_to_exit(tmp, "--version")
    assert result.returncode == 0 and result.stdout.strip() == f"queen-broker {__version__}"


# -- an unreachable database ----------------------------------------------------------------

def test_an_unreachable_database_is_one_line(tmp):
    port = free_port()
    result = run_to_exit(tmp, PG_HOST="127.0.0.1", PG_PORT=str(port))
    assert result.returncode != 0
    assert_one_error_line(result.stderr, f"127.0.0.1:{port}", "PG_HOST", "PG_PORT",
                          "PG_CONNECT_WAIT_MS")


def test_an_unreachable_database_is_waited_for_with_pg_connect_wait_ms(tmp):
    port = free_port()
    result = run_to_exit(tmp, PG_HOST="127.0.0.1", PG_PORT=str(port), PG_CONNECT_WAIT_MS="1500")
    assert result.returncode != 0
    assert "not reachable yet" in result.stderr
    assert_one_error_line(result.stderr, f"127.0.0.1:{port}", "for 1500 ms")


def test_a_broker_waiting_for_the_database_starts_when_it_comes(tmp):
    pg = EmbeddedPostgres(tmp / "late", port=free_port())
    env = broker_env(tmp, PG_HOST=pg.host, PG_PORT=str(pg.port), PG_CONNECT_WAIT_MS="120000")
    log_path = tmp / "late-broker.log"
    proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=ROOT, env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    broker = BrokerProcess(f"http://127.0.0.1:{env['PORT']}", int(env["PORT"]), env, proc,
                           log_path)
    try:
        wait_until(lambda: "not reachable yet" in broker.log(), 60, "the broker to wait")
        pg.start()
        wait_until(lambda: "serving on" in broker.log() or proc.poll() is not None,
                   120, "the broker to serve")
        assert proc.poll() is None, broker.log()
        assert database_connected(broker)
    finally:
        broker.stop()
        pg.stop(mode="immediate")
