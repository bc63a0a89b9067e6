"""Shared fixtures: a real PostgreSQL and real broker processes.

PostgreSQL: the server named by PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB when
PG_HOST is set, otherwise an embedded PostgreSQL started for the session in a
temporary directory. Brokers are real ``python -m broker`` processes on
loopback, pointed at that database.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port, free_ports  # noqa: F401 (the tests import them from here)

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Database:
    host: str
    port: int
    user: str
    password: str
    db: str
    embedded: object | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.db}"

    def env(self) -> dict[str, str]:
        return {"PG_HOST": self.host, "PG_PORT": str(self.port), "PG_USER": self.user,
                "PG_PASSWORD": self.password, "PG_DB": self.db}


@pytest.fixture(scope="session")
def database():
    if os.environ.get("PG_HOST"):
        yield Database(os.environ["PG_HOST"], int(os.environ.get("PG_PORT", "5432")),
                       os.environ.get("PG_USER", "postgres"),
                       os.environ.get("PG_PASSWORD", "postgres"),
                       os.environ.get("PG_DB", "postgres"))
        return
    from broker.store.embedded_pg import EmbeddedPostgres
    data_dir = Path(tempfile.mkdtemp(prefix="qpg", dir="/tmp")) / "data"
    pg = EmbeddedPostgres(data_dir, port=free_port())
    pg.start()
    try:
        yield Database(pg.host, pg.port, "postgres", "postgres", "postgres", embedded=pg)
    finally:
        pg.stop(mode="immediate")
        shutil.rmtree(data_dir.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def own_pg():
    """A PostgreSQL of the module's own, for tests that stop it (nobody else may see that)."""
    from broker.store.embedded_pg import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="qownpg", dir="/tmp"))
    pg = EmbeddedPostgres(root / "data", port=free_port())
    pg.start()
    yield pg
    pg.stop(mode="immediate")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stoppable_db(own_pg) -> Database:
    """The module's own PostgreSQL, running again if a test left it stopped."""
    if not own_pg.is_running():
        own_pg.start()
    return Database(own_pg.host, own_pg.port, "postgres", "postgres", "postgres",
                    embedded=own_pg)


@dataclass
class BrokerProcess:
    url: str
    port: int
    env: dict[str, str]
    proc: subprocess.Popen
    log_path: Path
    extra: dict = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wait_healthy(broker: BrokerProcess, timeout: float) -> BrokerProcess:
    """The broker once its /health answers 200; stopped and raised if it exits
    or stays unhealthy for ``timeout`` seconds (its log in the message)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            raise RuntimeError(f"broker exited with {broker.proc.returncode}:\n{broker.log()}")
        try:
            if httpx.get(broker.url + "/health", timeout=1).status_code == 200:
                return broker
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    broker.stop()
    raise RuntimeError(f"broker did not become healthy:\n{broker.log()}")


def start_broker(database: Database, tmp: Path, **env_overrides: str) -> BrokerProcess:
    """A broker process on ``database``, returned once its /health answers 200."""
    return wait_healthy(launch_broker(database, tmp, **env_overrides), 30)


def launch_broker(database: Database, tmp: Path, *, cwd: str | Path = ROOT,
                  **env_overrides: str) -> BrokerProcess:
    """A broker process on ``database``, returned at once (not waited for). ``cwd`` is where
    ``python -m broker`` imports the broker from (another checkout: another version)."""
    port = free_port()
    env = {**os.environ, **database.env(), "HOST": "127.0.0.1", "PORT": str(port),
           "LOG_LEVEL": "INFO", "FILE_BUFFER_DIR": str(tmp / f"buffers-{port}"),
           "QUEEN_MESH_PEERS": "", "DB_POOL_SIZE": "10", **env_overrides}
    log_path = tmp / f"broker-{port}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    return BrokerProcess(f"http://127.0.0.1:{port}", port, env, proc, log_path)


def stop_brokers(brokers: list[BrokerProcess]) -> None:
    """Stop ``brokers`` together: every one is told first, then each is waited for."""
    for b in brokers:
        if b.proc.poll() is None:
            b.proc.terminate()
    for b in brokers:
        b.stop()


@contextlib.contextmanager
def _brokers_until_exit(database: Database, tmp: Path):
    started: list[BrokerProcess] = []

    def make(**env: str) -> BrokerProcess:
        b = start_broker(database, tmp, **env)
        started.append(b)
        return b

    try:
        yield make
    finally:
        stop_brokers(started)


# Three factories, one per lifetime: a broker lives as long as the fixture that started it.
# An idle broker still runs its loops (timer sweeps, reconcile, heartbeats, jobs) and holds
# connections, so brokers kept to the session's end once piled up by the dozen and slowed
# every later test on a 2-core machine.
@pytest.fixture
def broker_factory(database, tmp_path_factory):
    """Start brokers with their own environment for one test; stopped when it ends."""
    with _brokers_until_exit(database, tmp_path_factory.mktemp("brokers")) as make:
        yield make


@pytest.fixture(scope="module")
def module_broker_factory(database, tmp_path_factory):
    """Start brokers shared by one module's tests; stopped when the module is done."""
    with _brokers_until_exit(database, tmp_path_factory.mktemp("brokers")) as make:
        yield make


@pytest.fixture(scope="session")
def session_broker_factory(database, tmp_path_factory):
    """The brokers shared by the whole session (``broker``, ``slow_timer_broker``)."""
    with _brokers_until_exit(database, tmp_path_factory.mktemp("brokers")) as make:
        yield make


@pytest.fixture(scope="session")
def broker(session_broker_factory) -> BrokerProcess:
    """The shared broker most tests use (encryption key set, defaults otherwise)."""
    return session_broker_factory(QUEEN_ENCRYPTION_KEY="11" * 32)


# The re-check timer of slow_timer_broker's parked pops: 8 s. A parked pop it answers much
# sooner (see WAKE_BOUND_S) was answered by a wake, not by the timer.
SLOW_TIMER_MS = 8000
# How soon a woken pop must answer: a wake takes milliseconds, so 3 s leaves a loaded machine
# a wide margin and stays far below the 8 s timer (a bound about correctness, not speed).
WAKE_BOUND_S = 3.0


@pytest.fixture(scope="session")
def slow_timer_broker(session_broker_factory) -> BrokerProcess:
    """A broker whose backoff timer alone would take SLOW_TIMER_MS to re-check a parked pop."""
    return session_broker_factory(POP_WAIT_INITIAL_INTERVAL_MS=str(SLOW_TIMER_MS),
                          POP_WAIT_MAX_INTERVAL_MS=str(SLOW_TIMER_MS))


@pytest.fixture
def lossyfs(tmp_path):
    """A LossyFS (tests/lossyfs.py) mounted at ``tmp_path/"lossyfs"`` for one test, in its own
    process; unmounted when the test ends, however it ends. Skipped where /dev/fuse is absent."""
    from tests.lossyfs import fuse_available, mounted
    if reason := fuse_available():
        pytest.skip(reason)
    with mounted(tmp_path / "lossyfs") as fs:
        yield fs


def parked_pops(url: str) -> int:
    """Long polls parked on the broker at ``url`` right now (its /health says)."""
    return httpx.get(url + "/health", timeout=5).json()["shared_state"]["parkedPops"]


@pytest.fixture(scope="session")
def base_url(broker) -> str:
    return broker.url


@pytest.fixture
def queue_name() -> str:
    """A fresh queue name per test (``test-`` prefix, like Queen's own cleanup)."""
    return f"test-{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def official_client(url: str, **options):
    """The official Python client (queen-mq) on ``url``, closed after; its close prints a
    line, kept out of the test output."""
    from queen import Queen
    q = Queen(url, **options)
    try:
        yield q
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()


@pytest.fixture
async def client(base_url):
    """The official client on the shared broker."""
    async with official_client(base_url) as q:
        yield q


@pytest.fixture
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=30) as client:
        yield client


@pytest.fixture
async def store(database):
    """A Store (a small pool) on the test PostgreSQL, for tests of the store and the services
    without HTTP."""
    from broker.store.db import Store
    s = await Store.connect(database.dsn, pool_size=2, connect_timeout_ms=5000,
                            statement_timeout_ms=30000, lock_timeout_ms=10000,
                            idle_timeout_ms=30000)
    yield s
    await s.close()


@pytest.fixture
async def fresh_database(database):
    """An empty database on the same server, dropped afterwards: for tests that
    flip cluster-wide state (maintenance flags) or need a schema-less start."""
    import asyncpg
    name = f"t_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(database.dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield Database(database.host, database.port, database.user, database.password, name)
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


def db_fetch(database: Database, sql: str, *params):
    """Run one query on the test database from a synchronous test (own event loop)."""
    import asyncio

    import asyncpg

    async def run():
        conn = await asyncpg.connect(database.dsn)
        try:
            return await conn.fetch(sql, *params)
        finally:
            await conn.close()

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def db_val(database: Database, sql: str, *params):
    rows = db_fetch(database, sql, *params)
    return rows[0][0] if rows else None
