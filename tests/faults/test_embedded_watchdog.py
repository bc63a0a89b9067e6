"""The embedded PostgreSQL after its start: the broker that started it says so
when its postmaster dies and restarts it (the pushes it acknowledged meanwhile, spooled,
reach PostgreSQL); a server stopped on purpose, or one another process started, is left
alone; a taken EMBEDDED_PG_PORT is one line. Real broker processes, each on an embedded
server of its own in a temporary EMBEDDED_PG_DIR.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest

from broker.store.embedded_pg import EmbeddedPostgres
from tests.conftest import BrokerProcess, free_port
from tests.faults.test_startup import assert_one_error_line, launch, run_to_exit
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(240)

DIED = "died (postmaster pid"
BACK = "embedded PostgreSQL is back on"


@pytest.fixture
def tmp() -> Path:
    # Short, under /tmp: the embedded server's unix socket lives in its data dir.
    path = Path(tempfile.mkdtemp(prefix="qwd", dir="/tmp"))
    yield path
    EmbeddedPostgres(path / "pg").stop(mode="immediate")  # whatever a test left running
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def brokers():
    started: list[BrokerProcess] = []
    yield started
    for b in started:
        b.stop()


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def push(url: str, queue: str, partition: str, txid: str) -> str:
    """One push; its item's status (queued, buffered), or the HTTP status when refused."""
    r = httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": partition, "transactionId": txid, "payload": txid}]})
    return r.json()[0]["status"] if r.status_code in (200, 201) else str(r.status_code)


async def stored(dsn: str, queue: str) -> list[str]:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT m.transaction_id FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY m.seq", queue)
        return [r["transaction_id"] for r in rows]
    finally:
        await conn.close()


async def test_a_killed_postmaster_is_restarted_and_the_gap_s_pushes_arrive(tmp, brokers):
    data_dir = tmp / "pg"
    b = launch(tmp, EMBEDDED_PG_DIR=str(data_dir), DB_CONNECTION_TIMEOUT="500")
    brokers.append(b)
    assert "this broker stops it at exit" in b.log()
    queue = f"wd-{uuid.uuid4().hex[:8]}"
    acknowledged = []

    def send(txid: str) -> str:
        status = push(b.url, queue, "p", txid)
        if status in ("queued", "buffered"):
            acknowledged.append(txid)
        return status

    assert send("before") == "queued"
    port = int(data_dir.joinpath("postmaster.pid").read_text().splitlines()[3])
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    os.kill(postmaster_pid(data_dir), signal.SIGKILL)

    # The gap: pushes are acknowledged from the spool until the server is back.
    statuses = [send(f"gap-{i}") for i in range(5)]
    assert "buffered" in statuses, statuses
    wait_until(lambda: BACK in b.log(), 60, "the broker's line that its database is back")
    n = 0

    def queued_again() -> bool:
        nonlocal n
        n += 1
        return send(f"after-{n}") == "queued"
    wait_until(queued_again, 60, "a push answered queued again", interval=0.2)

    async def all_stored() -> list[str]:
        got = await stored(dsn, queue)
        return got if len(got) >= len(acknowledged) else []
    got = await wait_until_async(all_stored, 60, "every acknowledged push in PostgreSQL")
    assert got == acknowledged  # each once, in the order they were acknowledged

    log = b.log()
    assert "Traceback" not in log, log
    died = [line for line in log.splitlines() if DIED in line]
    assert len(died) == 1 and " WARNING " in died[0] and "restarts it" in died[0], log
    back = [line for line in log.splitlines() if BACK in line]
    assert len(back) == 1 and " INFO " in back[0], log
    # The attempt it names follows the failed ones the log told of: the first line about a
    # restart is attempt 1 (the first attempt waits for the dead postmaster to be reaped,
    # which PostgreSQL otherwise takes for a live one).
    failed = [line for line in log.splitlines() if "restart attempt" in line and "failed" in line]
    assert f"(restart attempt {len(failed) + 1})" in back[0], log
    assert failed == [], log
    assert EmbeddedPostgres(data_dir).is_running()
    b.stop()
    assert "stopping embedded PostgreSQL" in b.log()
    assert not EmbeddedPostgres(data_dir).is_running()


def test_a_server_stopped_on_purpose_stays_stopped(tmp, brokers):
    """``pg_ctl stop`` (any mode) is an operator's decision, not a crash."""
    data_dir = tmp / "pg"
    b = launch(tmp, EMBEDDED_PG_DIR=str(data_dir), DB_CONNECTION_TIMEOUT="500")
    brokers.append(b)
    EmbeddedPostgres(data_dir).stop(mode="immediate")
    wait_until(lambda: "database: unreachable" in b.log() or
               httpx.get(b.url + "/health", timeout=10).status_code == 503, 15,
               "the broker seeing its database gone")
    time.sleep(3)  # three looks of the watchdog
    assert not EmbeddedPostgres(data_dir).is_running()
    assert DIED not in b.log() and BACK not in b.log()


def test_a_server_another_process_started_is_not_restarted(tmp, brokers):
    data_dir = tmp / "pg"
    pg = EmbeddedPostgres(data_dir, port=free_port())
    pg.start()  # this test process owns it, and stays alive
    b = launch(tmp, EMBEDDED_PG_DIR=str(data_dir), DB_CONNECTION_TIMEOUT="500")
    brokers.append(b)
    assert "keeps running when this broker exits" in b.log()
    os.kill(postmaster_pid(data_dir), signal.SIGKILL)
    wait_until(lambda: httpx.get(b.url + "/health", timeout=10).status_code == 503, 15,
               "the broker seeing its database gone")
    time.sleep(3)
    assert not pg.is_running()
    assert DIED not in b.log() and BACK not in b.log()


def test_embedded_pg_port_in_use_is_one_line(tmp):
    fresh = tmp / "pg"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_to_exit(tmp, EMBEDDED_PG_DIR=str(fresh), EMBEDDED_PG_PORT=str(port))
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr, f"127.0.0.1:{port}", "EMBEDDED_PG_PORT")
    assert "\n" not in line and len(line) < 300, line
    # Nothing of pg_ctl's output or the server log's tail: the one line says it all.
    assert "pg_ctl" not in result.stderr and "---" not in result.stderr, result.stderr
    assert not EmbeddedPostgres(fresh).is_running()
    assert not (fresh / "PG_VERSION").exists()  # refused before initdb: nothing was made
