"""The spool's file records (actors/spool/files.py) and its writer, without the actor:
what a SpoolFile holds through its life, and the totals and backlog SpoolFiles keeps."""
from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import actors.spool.writer as writer_mod
from actors.spool import FileState, SpoolBacklog, SpoolFile
from actors.spool.files import SpoolFiles
from actors.spool.writer import SpoolWriter
from tests.waiting import wait_until_async


def ev(tid: str, partition: str = "p0", queue: str = "q") -> dict:
    return {"queue": queue, "partition": partition, "transactionId": tid, "payload": tid}


@pytest.fixture
def parts(tmp_path):
    files = SpoolFiles(SpoolBacklog())
    writer = SpoolWriter(tmp_path / "spool", files, events_per_file=100, max_bytes=1 << 20,
                         clock=time.time)
    writer.make_dirs()
    return files, writer


async def test_a_file_from_append_to_finished(parts):
    files, writer = parts
    await (await writer.append([ev("a0", "a"), ev("b0", "b")]))
    await (await writer.append([ev("a1", "a")]))
    active = files.active
    assert active is not None and active.state is FileState.ACTIVE and active.fd is not None
    assert active.events == 3 and active.size == active.path.stat().st_size == files.bytes
    assert active.pairs == Counter({("q", "a"): 2, ("q", "b"): 1})
    first_a = active.firsts[("q", "a")]
    assert active.firsts == {("q", "a"): first_a, ("q", "b"): first_a}  # one accept per push
    assert files.pending == 3 and files.pending_files() == 1

    assert await writer.finalize() is True
    assert files.active is None and active.state is FileState.FINISHED and active.fd is None
    assert active.path.suffix == ".buf" and files.finished == {active.name: active}
    assert files.pending == 3 and files.pending_files() == 1
    assert files.oldest_map() == {("q", "a"): first_a, ("q", "b"): first_a}
    assert files.oldest_map(skip=active) == {}


async def test_a_file_being_finalized_still_holds_its_partitions(parts, monkeypatch):
    """While the active file is closed and renamed (in a thread), what the drain registers
    still lists its partitions: it is neither active nor finished for that while."""
    files, writer = parts
    entered, release = threading.Event(), threading.Event()
    real = writer_mod._seal

    def slow_seal(fd, keep, sync):
        entered.set()
        release.wait(10)
        real(fd, keep, sync)

    monkeypatch.setattr(writer_mod, "_seal", slow_seal)
    await (await writer.append([ev("a0", "a")]))
    want = files.oldest_map()
    task = asyncio.ensure_future(writer.finalize_active())
    await wait_until_async(entered.is_set, 5, "the fsync to start")
    try:
        assert files.active is None
        assert files.oldest_map() == want and files.pending == 1
    finally:
        release.set()
    assert await task is True
    assert files.oldest_map() == want and files.stranded == {}


def test_settling_subtracts_each_event_once_and_only_counted_ones():
    backlog = SpoolBacklog()
    files = SpoolFiles(backlog)
    events = [ev("a0", "a"), ev("a1", "a"), ev("b0", "b")]
    file = SpoolFile(Path("queen-1700000000000-00000000.buf"), FileState.FINISHED, events=3, size=10,
                     pairs=Counter({("q", "a"): 2, ("q", "b"): 1}))
    files.count_in(file)
    files.count_in(file)  # once only
    assert backlog.count("q", "a") == 2 and files.pending == 3 and files.bytes == 10
    files.settle(file, events, [0])
    files.settle(file, events, [0, 1])  # 0 settled before: only 1 subtracts
    assert backlog.count("q", "a") == 0 and backlog.count("q", "b") == 1
    assert file.settled == {0, 1}
    extra = events + [ev("a2", "a")]  # a record the file never counted (a failed push's)
    files.settle(file, extra, [3])
    assert backlog.total() == 1


def test_an_unknown_file_is_known_by_name_before_it_is_counted(tmp_path):
    files = SpoolFiles(SpoolBacklog())
    path = tmp_path / "queen-1700000000000-00000000.buf"
    file = files.lookup(path)
    assert files.lookup(path) is file and not file.counted
    file.unreadable += 1
    assert files.pending == 0 and files.pending_files() == 0  # not counted
    files.forget(path.name)
    assert files.finished == {} and files.pending == 0 and files.bytes == 0
