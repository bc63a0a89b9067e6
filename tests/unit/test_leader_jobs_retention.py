"""The retention job's connection and lock discipline (docs/behaviour.md §7.1, §14 invariants
50-51), against a fake pool under the real Store (broker/store/jobs.py): every exit path
unlocks 737001 on the connection that holds it, before that connection is released; a
connection whose unlock failed is terminated, never released to the pool; a connection
closed under the cycle is neither unlocked nor released; database errors come out as the
store's errors."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest
from loguru import logger

from actors.leader_jobs import RetentionJob
from broker.store import jobs_sql as sql
from broker.store.db import Store


class FakeConn:
    """A pooled connection as the retention job sees it. ``lose_on_step``: the first step
    fails as asyncpg fails when the server ends the session, and asyncpg's pool then
    detaches the connection (every later call raises InterfaceError, as on a connection
    already given back to the pool)."""

    def __init__(self, *, lock=True, unlock=True, fail_step=None, block=None,
                 lose_on_step=False):
        self.lock, self.unlock, self.fail_step, self.block = lock, unlock, fail_step, block
        self.lose_on_step = lose_on_step
        self.log: list[str] = []
        self.terminated = False
        self.detached = False

    def _check(self, name):
        if self.detached:
            self.log.append(f"{name} on a released connection")
            raise asyncpg.exceptions.InterfaceError(
                f"cannot call Connection.{name}(): connection has been released back to the pool")

    def is_closed(self):
        self._check("is_closed")
        return self.terminated

    async def fetchval(self, query, *args):
        self._check("fetchval")
        if query == sql.TRY_SESSION_LOCK:
            self.log.append("lock")
            if isinstance(self.lock, BaseException):
                raise self.lock
            return self.lock
        if query == sql.SESSION_UNLOCK:
            self.log.append("unlock")
            if isinstance(self.unlock, BaseException):
                raise self.unlock
            return self.unlock
        self.log.append("step")
        return 0

    async def fetch(self, query, *args):
        self._check("fetch")
        self.log.append("step")
        if self.block is not None:
            await self.block.wait()
        if self.lose_on_step:
            self.detached = True  # asyncpg: connection lost -> holder released, proxy detached
            raise asyncpg.exceptions.ConnectionDoesNotExistError(
                "connection was closed in the middle of operation")
        if self.fail_step is not None:
            raise self.fail_step
        return []

    async def execute(self, query, *args):
        self._check("execute")
        self.log.append("step")
        return "DELETE 0"

    def terminate(self):
        self._check("terminate")
        self.log.append("terminate")
        self.terminated = True


class FakePool:
    def __init__(self, conn, acquire_error=None):
        self.conn = conn
        self.acquire_error = acquire_error

    async def acquire(self, timeout=None):
        self.conn.log.append("acquire")
        if self.acquire_error is not None:
            raise self.acquire_error
        return self.conn

    async def release(self, conn, timeout=None):
        conn.log.append("release")


def FakeStore(conn, **pool) -> Store:
    """The real Store (its error mapping and health) on a fake pool."""
    return Store(FakePool(conn, **pool), acquire_timeout=5.0)


def job(conn, pool: dict | None = None, **kw) -> RetentionJob:
    # Not started: _cycle and run_once are plain coroutines on the actor object.
    return RetentionJob(FakeStore(conn, **(pool or {})), interval_ms=1000, batch_size=10,
                        partition_cleanup_days=30, metrics_retention_days=90, **kw)


@pytest.fixture
def warnings():
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING")
    yield seen
    logger.remove(sink)


async def test_lock_taken_elsewhere_skips_without_any_step():
    conn = FakeConn(lock=False)
    j = job(conn)
    result = await j.run_once()
    assert result["skipped"] is True and j.skipped == 1 and j.ran == 0
    assert conn.log == ["acquire", "lock", "release"]


async def test_successful_cycle_unlocks_then_releases():
    conn = FakeConn()
    j = job(conn)
    result = await j.run_once()
    assert result["skipped"] is False and j.ran == 1 and "error" not in result
    assert conn.log[:2] == ["acquire", "lock"]
    assert conn.log[-2:] == ["unlock", "release"]
    assert not conn.terminated


async def test_failing_step_still_unlocks_and_counts_a_failure(warnings):
    conn = FakeConn(fail_step=RuntimeError("boom"))
    j = job(conn)
    result = await j.run_once()
    assert "boom" in result["error"] and j.failures == 1
    assert conn.log[-2:] == ["unlock", "release"]
    assert any("cycle failed" in w for w in warnings)


async def test_unlock_reporting_not_held_warns_and_releases(warnings):
    conn = FakeConn(unlock=False)
    j = job(conn)
    await j.run_once()
    assert j.unlock_not_held == 1
    assert conn.log[-2:] == ["unlock", "release"]
    assert any("not held" in w for w in warnings)


async def test_unlock_failure_terminates_instead_of_releasing(warnings):
    conn = FakeConn(unlock=ConnectionResetError("gone"))
    j = job(conn)
    await j.run_once()
    assert conn.terminated and "release" not in conn.log
    assert j.connections_discarded == 1
    assert any("terminating" in w for w in warnings)


async def test_unanswered_try_lock_terminates_the_connection():
    conn = FakeConn(lock=TimeoutError("no answer"))
    j = job(conn)
    result = await j.run_once()
    assert "error" in result
    assert conn.terminated and "release" not in conn.log


async def test_cancelled_mid_cycle_still_unlocks():
    gate = asyncio.Event()
    conn = FakeConn(block=gate)
    j = job(conn)
    task = asyncio.create_task(j.run_once())
    await asyncio.sleep(0.05)
    assert conn.log[-1] == "step"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert conn.log[-2:] == ["unlock", "release"]


async def test_stop_waits_for_the_running_cycle_which_unlocks():
    gate = asyncio.Event()
    conn = FakeConn(block=gate)
    ref = RetentionJob.start(FakeStore(conn), interval_ms=60_000, batch_size=10,
                             partition_cleanup_days=30, metrics_retention_days=90,
                             first_delay_s=0)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if "step" in conn.log:
            break
    stopping = asyncio.ensure_future(ref.stop(block=False))
    await asyncio.sleep(0.05)
    assert "unlock" not in conn.log and not stopping.done()
    gate.set()
    await stopping
    assert conn.log[-2:] == ["unlock", "release"]
    assert not conn.terminated


async def test_connection_closed_mid_cycle_is_neither_unlocked_nor_released(warnings):
    """The known bug: a cycle whose connection died (asyncpg detached it from the pool)
    tried pg_advisory_unlock on it, failed with "connection has been released back to
    the pool" and logged a warning. The session is over, and the lock with it: nothing is
    called on the connection any more, the cycle fails as StoreUnavailable."""
    conn = FakeConn(lose_on_step=True)
    j = job(conn)
    result = await j.run_once()
    assert result["error"].startswith("StoreUnavailable: database unavailable"), result
    assert conn.log == ["acquire", "lock", "step", "is_closed on a released connection",
                        "terminate on a released connection"]
    assert "unlock" not in conn.log and "release" not in conn.log
    assert j.sessions_lost == 1 and j.connections_discarded == 0 and j.unlock_not_held == 0
    assert not any("pg_advisory_unlock" in w for w in warnings), warnings
    assert j.stats()["sessionsLost"] == 1


async def test_a_database_error_in_a_step_is_the_stores_error_and_still_unlocks():
    conn = FakeConn(fail_step=asyncpg.exceptions.LockNotAvailableError("lock timeout"))
    j = job(conn)
    result = await j.run_once()
    assert result["error"].startswith("StoreBusy: "), result
    assert conn.log[-2:] == ["unlock", "release"]


async def test_an_unreachable_pool_is_store_unavailable_and_touches_no_connection():
    conn = FakeConn()
    j = job(conn, pool={"acquire_error": ConnectionRefusedError(111, "refused")})
    result = await j.run_once()
    assert result["error"].startswith("StoreUnavailable: "), result
    assert conn.log == ["acquire"]
    assert j._store.health.down
