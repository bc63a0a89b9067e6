"""A host crash under the spool: a real broker writes its spool on LossyFS (tests/lossyfs.py),
a file system that drops every change not yet made durable when told to, as a power cut would.

Invariant: every push answered ``buffered`` is stored in PostgreSQL after the crash and a
restart on the same spool, exactly once and in per-partition push order; a push answered
503 is not acknowledged, and one refused because its fsync failed is never delivered.
"""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import Database, start_broker
from tests.lossyfs import fuse_available
from tests.waiting import wait_until_async

pytestmark = pytest.mark.skipif(fuse_available() is not None, reason=str(fuse_available()))

CLIENTS = 4
PUSHES = 150  # per client, one item each


async def stored(db: Database, queue: str) -> dict[str, list[str]]:
    """transactionIds per partition, in position order."""
    conn = await asyncpg.connect(db.dsn)
    try:
        rows = await conn.fetch(
            "SELECT p.name, m.transaction_id FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY p.name, m.seq",
            queue)
    finally:
        await conn.close()
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["name"], []).append(r["transaction_id"])
    return out


async def push_maintenance_off(db: Database) -> None:
    """The flag lives in PostgreSQL: a broker restarted on it starts with it off."""
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute("UPDATE queen.system_state SET value = '{\"enabled\": false}' "
                           "WHERE key = 'maintenance_mode'")
    finally:
        await conn.close()


async def push_all(url: str, queue: str, tag: str) -> tuple[dict[str, list[str]], list[str]]:
    """CLIENTS clients, each pushing PUSHES single items one after another to its own
    partition. Returns (acknowledged transactionIds per partition in push order, refused)."""
    acked: dict[str, list[str]] = {}
    refused: list[str] = []

    async def client(c: int) -> None:
        partition = f"p{c}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for i in range(PUSHES):
                txid = f"{tag}-{c}-{i:04d}"
                r = await http.post("/api/v1/push", json={"items": [
                    {"queue": queue, "partition": partition, "transactionId": txid,
                     "payload": {"c": c, "i": i}}]})
                if r.status_code == 201:
                    assert r.json()[0]["status"] == "buffered", r.text
                    acked.setdefault(partition, []).append(txid)
                else:
                    assert r.status_code == 503 and r.headers["retry-after"], r.text
                    assert r.json()[0]["status"] == "failed", r.text
                    refused.append(txid)

    await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    return acked, refused


def spool_figures(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()["spool"]


def kill_9(broker) -> None:
    os.kill(broker.proc.pid, signal.SIGKILL)
    broker.proc.wait(10)


def spooling_broker(db: Database, tmp_path: Path, env: dict):
    """A broker on ``env``'s spool with push maintenance on: every push goes to its spool."""
    b = start_broker(db, tmp_path, **env)
    try:
        httpx.post(b.url + "/api/v1/system/maintenance", json={"enabled": True},
                   timeout=10).raise_for_status()
    except BaseException:
        b.stop()
        raise
    return b


async def restart_and_drain(db: Database, tmp_path: Path, env: dict, queue: str,
                            expected: int) -> tuple[dict[str, list[str]], object]:
    await push_maintenance_off(db)
    b = start_broker(db, tmp_path, **env)

    async def drained() -> bool:
        return sum(map(len, (await stored(db, queue)).values())) >= expected and \
            spool_figures(b.url)["pendingCount"] == 0
    try:
        await wait_until_async(drained, 60, f"{expected} stored messages of {queue}",
                               interval=0.2)
        return await stored(db, queue), b
    except BaseException:
        b.stop()  # the caller stops it only once it has it
        raise


async def test_every_buffered_push_survives_a_host_crash_in_order(
        fresh_database, lossyfs, tmp_path, queue_name):
    env = {"FILE_BUFFER_DIR": str(lossyfs.mountpoint / "spool")}
    b = spooling_broker(fresh_database, tmp_path, env)
    try:
        acked, refused = await push_all(b.url, queue_name, "crash")
        spool_id = spool_figures(b.url)["spoolId"]
        kill_9(b)
    finally:
        b.stop()
    lossyfs.crash()  # the host loses power: every unsynced write and rename is gone
    assert not refused and sum(map(len, acked.values())) == CLIENTS * PUSHES
    got, b2 = await restart_and_drain(fresh_database, tmp_path, env, queue_name,
                                      CLIENTS * PUSHES)
    try:
        assert got == acked  # all of them, once each, in push order per partition
        assert spool_figures(b2.url)["spoolId"] == spool_id  # its name survived too
    finally:
        b2.stop()


async def test_a_push_whose_fsync_failed_is_refused_and_never_delivered(
        fresh_database, lossyfs, tmp_path, queue_name):
    env = {"FILE_BUFFER_DIR": str(lossyfs.mountpoint / "spool")}
    b = spooling_broker(fresh_database, tmp_path, env)
    try:
        before, none = await push_all(b.url, queue_name, "before")
        assert not none
        lossyfs.fail_fsync(True)
        during_acked, during_refused = await push_all(b.url, queue_name, "during")
        assert not during_acked and len(during_refused) == CLIENTS * PUSHES
        figures = spool_figures(b.url)
        assert figures["syncFailures"] >= 1 and not figures["healthy"]
        lossyfs.fail_fsync(False)
        after, none = await push_all(b.url, queue_name, "after")
        assert not none
        kill_9(b)
    finally:
        b.stop()
    lossyfs.crash()
    acked = {p: before[p] + after[p] for p in before}
    got, b2 = await restart_and_drain(fresh_database, tmp_path, env, queue_name,
                                      2 * CLIENTS * PUSHES)
    try:
        assert got == acked
    finally:
        b2.stop()
