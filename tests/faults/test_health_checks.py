"""The machines' health checks through real broker processes and a PostgreSQL of our own
that these tests stop: /health/ready follows what the broker can take (PostgreSQL, or the
spool with room left; not while stopping), /health/live only its event loop, and /health
stays the operators' view (503 while PostgreSQL is away)."""
from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import pytest

from tests.conftest import Database, start_broker
from tests.waiting import wait_until


@pytest.fixture
def db(stoppable_db: Database) -> Database:
    return stoppable_db


@pytest.fixture
def brokers(tmp_path):
    started = []

    def make(database: Database, **env: str):
        b = start_broker(database, tmp_path, **env)
        started.append(b)
        return b

    yield make
    for b in started:
        if b.proc.poll() is None:
            os.kill(b.proc.pid, signal.SIGCONT)  # a test that froze it and failed midway
        b.stop()


def push(url: str, queue: str, txid: str, payload: object = None) -> httpx.Response:
    return httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": "p", "transactionId": txid,
         "payload": {"t": txid} if payload is None else payload}]})


def get(url: str, path: str) -> httpx.Response:
    return httpx.get(url + path, timeout=10)


def test_ready_and_live_while_postgres_is_down_and_the_spool_takes_pushes(db, brokers,
                                                                          queue_name):
    b = brokers(db, DB_CONNECTION_TIMEOUT="500")
    r = get(b.url, "/health/ready")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ready" and r.json()["database"] == "up"
    db.embedded.stop(mode="immediate")
    try:
        r = push(b.url, queue_name, "down-1")
        assert r.status_code == 201 and r.json()[0]["status"] == "buffered", r.text
        # The operators' view says the database is away, as it always has...
        assert get(b.url, "/health").status_code == 503
        # ...while the broker can take traffic, and its loop is fine.
        r = get(b.url, "/health/ready")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ready" and body["database"] == "down"
        assert body["spool"]["healthy"] is True and body["spool"]["full"] is False
        assert body["spool"]["pendingBytes"] > 0
        r = get(b.url, "/health/live")
        assert r.status_code == 200 and r.json()["status"] == "live", r.text
    finally:
        db.embedded.start()


def test_unready_when_the_spool_is_full_while_postgres_is_down(db, brokers, queue_name):
    b = brokers(db, DB_CONNECTION_TIMEOUT="500", FILE_BUFFER_MAX_BYTES="32768")
    db.embedded.stop(mode="immediate")
    try:
        filler = {"pad": "x" * 1024}
        answers = []
        for i in range(100):  # ~1 KiB each: the 32 KiB cap refuses one within ~32 pushes
            r = push(b.url, queue_name, f"fill-{i}", filler)
            answers.append(r.status_code)
            if r.status_code == 503:
                break
        assert answers[-1] == 503 and set(answers[:-1]) == {201}, answers
        r = get(b.url, "/health/ready")
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        body = r.json()
        assert body == {**body, "status": "unready", "reason": "spool_full", "database": "down"}
        assert body["spool"]["full"] is True
        assert get(b.url, "/health/live").status_code == 200
    finally:
        db.embedded.start()
    # PostgreSQL back: the broker is ready again (the spool drains in the background).
    wait_until(lambda: get(b.url, "/health/ready").status_code == 200, 30,
               "/health/ready 200 once PostgreSQL is back")


def test_unready_when_the_spool_cannot_write_while_postgres_is_down(db, brokers, tmp_path,
                                                                    queue_name):
    spool_dir = tmp_path / "spool-broken"
    b = brokers(db, DB_CONNECTION_TIMEOUT="500", FILE_BUFFER_DIR=str(spool_dir))
    db.embedded.stop(mode="immediate")
    try:
        shutil.rmtree(spool_dir)
        spool_dir.write_text("not a directory")  # every file operation now fails
        r = push(b.url, queue_name, "x1")
        assert r.status_code == 503 and r.json()[0]["status"] == "failed", r.text
        r = get(b.url, "/health/ready")
        assert r.status_code == 503, r.text
        assert r.json()["reason"] == "spool_failing" and r.json()["spool"]["healthy"] is False
    finally:
        spool_dir.unlink()
        spool_dir.mkdir()
        db.embedded.start()


def test_unready_from_sigterm_while_it_still_serves(db, brokers, queue_name):
    b = brokers(db, STOP_UNREADY_MS="20000")
    assert get(b.url, "/health/ready").status_code == 200
    b.proc.send_signal(signal.SIGTERM)
    r = wait_until(lambda: (lambda r: r if r.status_code == 503 else None)(
        get(b.url, "/health/ready")), 10, "/health/ready 503 after SIGTERM")
    assert r.json() == {"status": "unready", "reason": "stopping", "database": "unknown"}
    assert r.headers["retry-after"]
    # Still serving meanwhile: pushes are taken, the loop is live.
    assert push(b.url, queue_name, "while-stopping").status_code == 200
    assert get(b.url, "/health/live").status_code == 200
    assert b.proc.poll() is None
    b.proc.kill()  # not left to serve out its 20 s unready window at teardown
    b.proc.wait(10)


def test_live_turns_503_after_the_event_loop_was_held(db, brokers):
    """A process frozen (SIGSTOP) for longer than HEALTH_LIVE_MAX_LAG_MS holds its loop just
    as a blocking call would; the first /health/live it answers afterwards says so."""
    b = brokers(db, HEALTH_LIVE_MAX_LAG_MS="1000")
    assert get(b.url, "/health/live").status_code == 200
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        frozen_at = time.monotonic()
        # The stimulus is the time the loop is held, not a wait for a condition.
        wait_until(lambda: time.monotonic() - frozen_at > 2.0, 5, "the loop held 2 s",
                   interval=0.1)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    r = get(b.url, "/health/live")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "stuck" and body["loopLagMs"] > 1000 and body["maxLoopLagMs"] == 1000
    assert r.headers["retry-after"]
