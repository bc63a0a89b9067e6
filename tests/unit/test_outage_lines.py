"""An outage in few lines: the errors a DatabaseHealth has told are DEBUG for the
parts that meet them after it; a staging drain that empties between two spool files is one
drain; the spool's drained line is timed from the first spooled push's accept time."""
from __future__ import annotations

import asyncio
import time

import pytest
from loguru import logger

import actors.staging_merger as staging_merger
from actors.reconciler import CacheReconciler, MaintenanceFlags, QueueConfigCache
from actors.spool.upload import DrainedLine
from actors.staging_merger import StagingMerger
from broker.store.health import DatabaseHealth, is_outage, outage_level
from tests.waiting import wait_until_async


@pytest.fixture
def lines():
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="DEBUG", format="{level} {message}")
    yield seen
    logger.remove(sink)


class Unreachable(Exception):
    pass


def test_an_error_the_health_was_told_of_is_the_outage(lines):
    health = DatabaseHealth()
    told, other = Unreachable("refused"), Unreachable("refused")
    health.failed(told)
    health.failed(Unreachable("again"))  # the outage is told once
    assert is_outage(told) and not is_outage(other)
    try:
        try:
            raise told
        except Unreachable as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert is_outage(wrapped)
    assert outage_level(told) == "DEBUG" and outage_level(other) == "WARNING"
    assert outage_level(other, "INFO") == "INFO"
    assert [line for line in lines if "unreachable" in line] == [
        "WARNING database: unreachable (refused); pushes are answered buffered (spooled to "
        "disk), other requests 503; the broker reconnects by itself once PostgreSQL is back "
        "and replays the spool\n"]


def test_the_return_of_the_database_is_told_to_its_listeners_once(lines):
    health = DatabaseHealth()
    heard: list[float] = []

    def broken(_at: float) -> None:
        raise RuntimeError("a listener's bug")

    health.on_back += [heard.append, broken, heard.append]
    health.succeeded()  # never down: nothing to tell
    before = time.monotonic()
    health.failed(Unreachable("refused"))
    health.succeeded()
    health.succeeded()
    assert len(heard) == 2 and heard[0] == heard[1] >= before  # the others still heard it
    assert any("a listener of its return failed" in line for line in lines)


async def test_the_reconcile_loop_meets_the_outage_at_debug(lines):
    health = DatabaseHealth()

    async def read_flags():
        exc = Unreachable("refused")
        health.failed(exc)
        raise exc

    ref = CacheReconciler.start(QueueConfigCache(lambda q: {}), MaintenanceFlags(), read_flags,
                                interval_ms=60_000, first_delay_s=3600)
    try:
        assert await ref.proxy().reconcile() is False
    finally:
        await ref.stop(block=False)
    mine = [line for line in lines if "reconcile" in line]
    assert len(mine) == 1 and mine[0].startswith("DEBUG "), lines


async def test_a_staging_drain_that_empties_between_files_is_one_drain(lines, monkeypatch):
    monkeypatch.setattr(staging_merger, "END_AFTER_S", 0.3)
    staged = [0]

    class Batch:
        def __init__(self, n: int) -> None:
            self.merged, self.duplicates, self.late, self.late_pairs = n, 0, 0, {}

    async def merge(_limit: int) -> Batch:
        n, staged[0] = staged[0], 0
        return Batch(n)

    async def count() -> tuple[int, int]:
        return staged[0], 1 if staged[0] else 0

    ref = StagingMerger.start(merge, count, batch=100, busy_s=0.01, idle_s=0.05)
    try:
        for n in (5, 3, 4):  # three files uploaded 0.1 s apart
            staged[0] = n
            ref.proxy().kick()
            await asyncio.sleep(0.1)

        async def ended() -> bool:
            return any("drain ended" in line for line in lines)
        await wait_until_async(ended, 5, "the drain's end")
    finally:
        await ref.stop(block=False)
    drain = [line for line in lines if "staging: drain" in line]
    assert len(drain) == 2, drain
    # The end's count is the start's plus what was staged while it ran, and says so.
    assert "drain started: 5 event(s) staged so far, in 1 partition(s)" in drain[0], drain
    assert "drain ended: 12 event(s) taken here (5 staged when it started, 7 more while it " \
        "ran): 12 merged, 0 duplicate(s) dropped;" in drain[1], drain


def test_the_drained_line_counts_from_the_first_spooled_push(lines):
    line = DrainedLine()
    first_us = time.time_ns() // 1000 - 38_000_000  # spooled 38 s ago, before a restart
    line.maybe_started(3, 0, 0, lambda: first_us)
    line.maybe_started(3, 0, 0, lambda: 0)  # already known: not asked again
    line.maybe_done(1, 2, 0)  # not empty yet
    line.maybe_done(0, 3, 0)
    [drained] = [text for text in lines if "drained" in text]
    assert "3 event(s) stored, 0 quarantined, 38.0 s after the first was spooled" in drained
