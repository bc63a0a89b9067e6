"""The disk spool (actors/spool/), docs/behaviour.md §5 and §14 invariants 39-45.

Real files in tmp_path. The database is faked at its boundary: ``FakeDB.upload``
is what the broker's upload into PostgreSQL's staging table does (one
all-or-nothing transaction per file, a ledger of uploaded files, the events
PostgreSQL refuses named by index) and can be told to fail transiently
(unreachable) or permanently (rejected). Dedup by (queue, partition,
transactionId) stands in for the merge's. ``FakeDB.replay`` is the direct push
an operator's quarantine replay makes.
"""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import actors.spool.writer as writer_mod
from actors.spool import (
    RejectedEvents,
    Spool,
    SpoolBacklog,
    SpoolError,
    SpoolFull,
    encode_records,
    read_records,
)
from actors.spool.records import (
    NAME,
    encode_file,
    encode_legacy_records,
    frame_record,
    scan_bytes,
)
from tests.waiting import wait_until_async


class Unreachable(ConnectionError):
    pass


class Rejected(ValueError):
    """What a refused direct push (the quarantine's replay) raises; an upload raises the
    spool's own RejectedEvents instead, naming the refused events."""


class FakeDB:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.keys: set[tuple] = set()
        self.duplicates = 0
        self.calls = 0
        self.chunks: list[int] = []
        self.down = False
        self.poison: set[str] = set()  # transactionIds the server rejects
        self.gate: asyncio.Event | None = None  # when set, replay waits for it
        self.down_on: set[int] = set()  # call numbers (1-based) that fail as unreachable
        self.probe = None  # called with ("start" | "committed", events) inside replay
        self.running = 0
        self.max_running = 0
        self.uploaded: set[str] = set()  # the ledger: spool files whose upload committed
        self.oldest: list[dict] = []  # the backlog each upload registered

    async def replay(self, events: list[dict]) -> list[dict]:
        """The quarantine's direct push: one transaction."""
        indexes = list(range(len(events)))
        await self._transaction(events, indexes, lambda: None)
        return [{"status": "queued"} for _ in events]

    async def upload(self, name: str, events: list[dict], indexes: list[int], oldest) -> bool:
        """One spool file, one transaction (see broker/service/drain.py); False when the
        ledger lists the file already."""
        def ledger() -> bool:
            self.oldest.append(dict(oldest))
            if name in self.uploaded:
                return False
            self.uploaded.add(name)
            return True
        return await self._transaction(events, indexes, ledger,
                                       lambda _message, bad: RejectedEvents(bad))

    async def _transaction(self, events: list[dict], indexes: list[int], ledger,
                           refused=lambda message, _bad: Rejected(message)) -> bool:
        self.calls += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        chunk = [events[k] for k in indexes]
        try:
            if self.probe is not None:
                self.probe("start", chunk)
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)  # a real upload yields to the loop
            if self.down or self.calls in self.down_on:
                raise Unreachable("connection refused")
            bad = {k: "invalid input syntax" for k in indexes
                   if events[k]["transactionId"] in self.poison}
            if bad:
                raise refused("invalid input syntax", bad)
            if ledger() is False:
                return False
            self.chunks.append(len(chunk))
            for e in chunk:  # one transaction: nothing above raised
                key = (e["queue"], e["partition"], e["transactionId"])
                if key in self.keys:
                    self.duplicates += 1
                else:
                    self.keys.add(key)
                    self.rows.append(e)
            if self.probe is not None:
                self.probe("committed", chunk)
            return True
        finally:
            self.running -= 1

    def tids(self, partition: str | None = None) -> list[str]:
        return [r["transactionId"] for r in self.rows
                if partition is None or r["partition"] == partition]


def ev(tid: str, partition: str = "p0", queue: str = "q") -> dict:
    return {"queue": queue, "partition": partition, "transactionId": tid,
            "payload": {"n": tid, "text": "héllo"}, "traceId": None, "producerSub": None,
            "encrypted": False}


def files(directory: Path, suffix: str) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(suffix))


async def until_stats(spool, cond, timeout: float = 3.0) -> dict:
    """Wait until the spool's own stats satisfy ``cond`` (files vanish from
    disk a moment before the actor has counted them out)."""
    async def satisfied() -> dict | None:
        stats = await spool.stats()
        return stats if cond(stats) else None
    return await wait_until_async(satisfied, timeout, "the spool's stats to satisfy the condition")


class FixedClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def db() -> FakeDB:
    return FakeDB()


@pytest.fixture
def sdir(tmp_path) -> Path:
    return tmp_path / "buffers"


@pytest.fixture
async def make(db, sdir):
    refs = []

    def start(directory: Path | None = None, **kw):
        kw.setdefault("upload", db.upload)
        kw.setdefault("replay", db.replay)
        kw.setdefault("is_transient", lambda exc: isinstance(exc, ConnectionError))
        kw.setdefault("flush_ms", 5)
        cls = kw.pop("cls", Spool)
        ref = cls.start(directory or sdir, **kw)
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        if ref.is_alive():
            await ref.stop(block=False)
    assert db.max_running <= 1, "the drain ran concurrently with itself"


# -- file format and naming ------------------------------------------------------

def test_reader_of_the_previous_format_skips_bad_json_and_stops_at_torn_tail(tmp_path):
    """Files the previous release wrote (no header, no checksums) still read."""
    good = encode_legacy_records([ev("a"), ev("b")])
    bad = (5).to_bytes(4, "little") + b"{nope"
    tail = encode_legacy_records([ev("c")])
    path = tmp_path / "x.buf"
    path.write_bytes(good + bad + encode_legacy_records([ev("d")]) + tail[:-3])
    scan = read_records(path)
    assert [e["transactionId"] for e in scan.events] == ["a", "b", "d"] and scan.legacy
    assert [(i, why) for i, _, why in scan.bad] == [(2, "unparseable")]
    assert scan.torn == len(tail) - 3 and scan.good_end == path.stat().st_size - scan.torn
    assert scan.events[0]["payload"] == {"n": "a", "text": "héllo"}


def test_reader_keeps_records_around_a_damaged_one_and_stops_at_torn_tail(tmp_path):
    records = [encode_records([ev(t)]) for t in "abcd"]
    body = bytearray(encode_file([]) + b"".join(records[:3]))
    body[len(encode_file([])) + len(records[0]) + 20] ^= 0x01  # one bit of b's payload
    path = tmp_path / "x.buf"
    path.write_bytes(bytes(body) + records[3][:-3])
    scan = read_records(path)
    assert [e["transactionId"] for e in scan.events] == ["a", "c"] and not scan.legacy
    assert [(i, raw, why) for i, raw, why in scan.bad] == [(1, bytes(body[
        len(encode_file([])) + len(records[0]):len(encode_file([])) + len(records[0])
        + len(records[1])]), "corrupt")]
    assert scan.torn == len(records[3]) - 3


def test_encode_requires_transaction_id_and_defaults_partition(tmp_path):
    with pytest.raises(SpoolError):
        encode_records([{"queue": "q", "payload": 1}])
    path = tmp_path / "x.buf"
    path.write_bytes(encode_file([{"queue": "q", "transactionId": "t", "payload": 1}]))
    assert read_records(path).events[0]["partition"] == "Default"


async def test_rotation_finalizes_files_named_in_creation_order(make, sdir):
    clock = FixedClock()  # same millisecond throughout: the sequence orders them
    ref = make(events_per_file=3, start_paused=True, clock=clock)
    spool = ref.proxy()
    for i in range(7):
        await (await spool.append([ev(f"t{i}")]))
    bufs = files(sdir, ".buf")
    assert len(bufs) == 2 and len(files(sdir, ".tmp")) == 1
    assert (sdir / "failed").is_dir() and oct(sdir.stat().st_mode & 0o777) == "0o755"
    for p in bufs + files(sdir, ".tmp"):
        assert NAME.match(p.name), p.name
    assert [[e["transactionId"] for e in read_records(p).events] for p in bufs] == [
        ["t0", "t1", "t2"], ["t3", "t4", "t5"]]
    stats = await spool.stats()
    assert stats["pendingCount"] == 7 and stats["pendingFiles"] == 3 and stats["paused"]

    # shutdown finalizes the active file
    await ref.stop(block=False)
    assert files(sdir, ".tmp") == [] and len(files(sdir, ".buf")) == 3
    old = {p.name for p in files(sdir, ".buf")}

    # a restarted process with a clock running behind still names files after them
    clock2 = FixedClock(clock.t - 60)
    ref2 = make(events_per_file=3, start_paused=True, clock=clock2)
    assert (await ref2.proxy().stats())["pendingCount"] == 7  # counted at start
    await (await ref2.proxy().append([ev("t7")]))
    await ref2.stop(block=False)
    names = [p.name for p in files(sdir, ".buf")]
    assert names[:3] == sorted(old) and names[3] not in old and names == sorted(names)
    assert [e["transactionId"] for e in read_records(sdir / names[3]).events] == ["t7"]


# -- draining -----------------------------------------------------------------------

async def test_uploads_whole_files_in_per_partition_push_order(make, db, sdir):
    spool = make(events_per_file=4).proxy()
    pushes = [[ev(f"{p}-{i}", partition=p) for p in ("a", "b") for i in range(n, n + 2)]
              for n in range(0, 10, 2)]
    for push in pushes:
        await (await spool.append(push))
    await wait_until_async(lambda: len(db.rows) == 20)
    assert db.tids("a") == [f"a-{i}" for i in range(10)]
    assert db.tids("b") == [f"b-{i}" for i in range(10)]
    assert db.chunks == [4] * 5  # one upload per file, the whole file
    await wait_until_async(lambda: files(sdir, ".buf") == [])
    stats = await until_stats(spool, lambda st: st["pendingCount"] == 0)
    assert stats["pendingFiles"] == 0 and stats["dbHealthy"]


async def test_pause_holds_everything_resume_drains(make, db, sdir):
    spool = make(start_paused=True).proxy()
    await (await spool.append([ev("a"), ev("b")]))
    await (await spool.append([ev("c")]))
    await asyncio.sleep(0.05)  # proves nothing happens for ten drain periods: a sleep on purpose
    assert db.calls == 0 and db.rows == []
    assert files(sdir, ".buf") == [] and len(files(sdir, ".tmp")) == 1  # not even finalized
    assert await spool.recover() == 0  # booting with maintenance on replays nothing
    await spool.resume()
    await wait_until_async(lambda: len(db.rows) == 3)
    assert db.tids() == ["a", "b", "c"]
    await wait_until_async(lambda: not [n for n in os.listdir(sdir) if n.startswith("queen-")])
    await spool.pause()
    await (await spool.append([ev("d")]))
    await asyncio.sleep(0.03)  # proves nothing drains while paused (six periods): a sleep on purpose
    assert len(db.rows) == 3
    assert (await spool.stats())["pendingCount"] == 1


async def test_append_is_not_blocked_by_a_slow_replay(make, db, sdir):
    db.gate = asyncio.Event()
    spool = make().proxy()
    await (await spool.append([ev("a")]))
    await wait_until_async(lambda: db.calls == 1)  # the drain is stuck inside replay
    for i in range(5):
        await asyncio.wait_for(spool.append([ev(f"b{i}")]), 0.5)
    assert (await asyncio.wait_for(spool.stats(), 0.5))["pendingCount"] == 6
    db.gate.set()
    await wait_until_async(lambda: len(db.rows) == 6)
    assert db.tids() == ["a"] + [f"b{i}" for i in range(5)]


async def test_uploading_a_file_twice_stages_nothing_twice(make, db, sdir, tmp_path):
    """Invariant 41: crash after the commit, before the delete. The second
    upload finds the file in PostgreSQL's ledger and only deletes it."""
    spool = make(start_paused=True).proxy()
    await (await spool.append([ev("a"), ev("b", "p1"), ev("c")]))
    assert await spool.finalize()
    (buf,) = files(sdir, ".buf")
    shutil.copy(buf, tmp_path / "copy")
    await spool.resume()
    await wait_until_async(lambda: not buf.exists())
    assert db.tids() == ["a", "b", "c"]
    shutil.copy(tmp_path / "copy", buf)  # as if the delete never happened
    await spool.kick()
    await wait_until_async(lambda: not buf.exists())
    assert db.tids() == ["a", "b", "c"] and db.duplicates == 0 and db.calls == 2
    assert (await spool.stats())["pendingCount"] == 0  # never negative


async def test_torn_last_record_still_replays_everything_before(make, db, sdir):
    """Invariant 43."""
    spool = make(start_paused=True).proxy()
    await (await spool.append([ev(f"t{i}") for i in range(5)]))
    await spool.finalize()
    (buf,) = files(sdir, ".buf")
    os.truncate(buf, buf.stat().st_size - 7)
    await spool.resume()
    await wait_until_async(lambda: not buf.exists())
    assert db.tids() == ["t0", "t1", "t2", "t3"]


async def test_recover_finalizes_and_replays_a_crashed_runs_tmp(make, db, sdir):
    """Invariant 44: nothing of a crashed run's .tmp is lost, small files included."""
    sdir.mkdir()
    (sdir / "queen-1700000000000-00000000.buf").write_bytes(encode_file([ev("old")]))
    crashed = sdir / "queen-1700000000001-00000000.tmp"
    crashed.write_bytes(encode_file([ev("x1"), ev("x2", "p1")])
                        + encode_records([ev("x3")])[:-2])  # torn mid-write
    assert crashed.stat().st_size < 1024
    (sdir / "queen-1700000000002-00000000.tmp").write_bytes(b"")  # empty: just deleted
    spool = make(flush_ms=10_000).proxy()
    assert (await spool.stats())["pendingCount"] == 3
    assert await spool.recover() == 3
    assert db.tids() == ["old", "x1", "x2"]
    assert [n for n in os.listdir(sdir) if n.startswith("queen-")] == []
    assert (await spool.stats())["pendingCount"] == 0


async def test_recover_stops_at_first_failure_and_drain_continues(make, db, sdir):
    sdir.mkdir()
    for n in range(3):
        (sdir / f"queen-170000000000{n}-00000000.buf").write_bytes(encode_file([ev(f"f{n}")]))
    db.down = True
    spool = make(flush_ms=10).proxy()
    assert await spool.recover() == 0
    assert len(files(sdir, ".buf")) == 3
    db.down = False
    await wait_until_async(lambda: len(db.rows) == 3)
    assert db.tids() == ["f0", "f1", "f2"]


async def test_transient_failures_keep_files_in_place_then_drain(make, db, sdir):
    """Invariant 45, first half: a down database never gets a file quarantined."""
    db.down = True
    spool = make(flush_ms=1, cooldown_after=1000).proxy()
    await (await spool.append([ev("a")]))
    await (await spool.append([ev("b")]))
    await wait_until_async(lambda: db.calls >= 20)
    assert (await spool.stats())["dbHealthy"] is False
    assert os.listdir(sdir / "failed") == []
    assert len(files(sdir, ".buf")) >= 1 and db.rows == []
    db.down = False
    await wait_until_async(lambda: len(db.rows) == 2)
    assert db.tids() == ["a", "b"]
    await wait_until_async(lambda: files(sdir, ".buf") == [])
    stats = await until_stats(spool, lambda st: st["pendingCount"] == 0)
    assert stats["dbHealthy"] is True
    assert stats["failedFiles"]["count"] == 0


async def test_transient_failures_cool_down(make, db, sdir):
    db.down = True
    spool = make(flush_ms=1, cooldown_after=3, cooldown_s=0.3).proxy()
    await (await spool.append([ev("a")]))
    await wait_until_async(lambda: db.calls >= 3)
    await asyncio.sleep(0.1)  # proves no upload is tried for 0.1 s (100 periods): a sleep on purpose
    assert db.calls == 3  # cooling down
    db.down = False
    await wait_until_async(lambda: len(db.rows) == 1, timeout=2)


async def test_a_rejected_event_is_quarantined_alone_and_its_neighbours_commit(make, db, sdir):
    """Invariant 45, second half, sharpened: a chunk the database
    rejects for good is bisected; only the rejected event is set aside, every
    other event commits in order, and newer files drain after it."""
    db.poison = {"bad"}
    spool = make(start_paused=True, flush_ms=2).proxy()
    await (await spool.append([ev("ok1"), ev("bad"), ev("ok3")]))
    await spool.finalize()
    await (await spool.append([ev("ok4")]))
    await spool.finalize()
    head = files(sdir, ".buf")[0].name
    await spool.resume()
    await wait_until_async(lambda: "ok4" in db.tids())
    assert db.tids() == ["ok1", "ok3", "ok4"]
    assert files(sdir, ".buf") == [] and os.listdir(sdir / "failed") == []
    (entry,) = await spool.quarantine_list()
    assert entry["id"] == head[:-4] + "-00000001" and entry["reason"] == "rejected"
    assert entry["transactionId"] == "bad" and entry["originFile"] == head
    assert "invalid input syntax" in entry["error"]
    full = await spool.quarantine_get(entry["id"])
    assert full["event"]["payload"] == {"n": "bad", "text": "héllo"}
    stats = await until_stats(spool, lambda st: st["pendingCount"] == 0)
    assert stats["quarantinedEvents"] == 1 and stats["dbHealthy"]


async def test_rejected_events_are_set_aside_and_the_rest_uploaded_in_order(make, db, sdir):
    """PostgreSQL names the events it refuses (broker/service/drain.py finds
    them under savepoints); the spool quarantines them and uploads the rest."""
    db.poison = {"t03", "t07"}
    spool = make(start_paused=True, flush_ms=2).proxy()
    await (await spool.append([ev(f"t{i:02d}") for i in range(12)]))
    await spool.resume()
    await wait_until_async(lambda: "t11" in db.tids())
    assert db.tids() == [f"t{i:02d}" for i in range(12) if i not in (3, 7)]
    assert [e["transactionId"] for e in await spool.quarantine_list()] == ["t03", "t07"]
    assert db.calls == 2  # refused naming both, then the rest


async def test_unstorable_events_of_an_older_version_are_quarantined_without_a_round_trip(
        make, db, sdir):
    """A file written before the acceptance rule existed may hold a NUL, a NaN
    or a braced trace id: set aside at once, the rest replayed."""
    sdir.mkdir()
    bad_nul = {**ev("nul"), "payload": "a\u0000b"}
    bad_trace = {**ev("trace"), "traceId": "{0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a}"}
    body = encode_file([ev("a"), bad_nul, ev("b"), bad_trace, ev("c")])
    (sdir / "queen-1700000000000-00000000.buf").write_bytes(body)
    spool = make(flush_ms=10_000).proxy()
    assert await spool.recover() == 3
    assert db.tids() == ["a", "b", "c"] and db.calls == 1  # the bad ones never sent
    entries = await spool.quarantine_list()
    assert [(e["transactionId"], e["reason"]) for e in entries] == [("nul", "invalid"),
                                                                     ("trace", "invalid")]
    assert "NUL" in entries[0]["error"] and "traceId" in entries[1]["error"]


async def test_unparseable_records_are_quarantined_raw(make, db, sdir):
    sdir.mkdir()
    good = encode_file([ev("a")])
    junk = b"{not json"
    (sdir / "queen-1700000000000-00000000.buf").write_bytes(
        good + frame_record(junk) + encode_records([ev("b")]))
    spool = make(flush_ms=10_000).proxy()
    assert await spool.recover() == 2 and db.tids() == ["a", "b"]
    (entry,) = await spool.quarantine_list()
    assert entry["reason"] == "unparseable" and entry["id"].endswith("-raw00000001")
    import base64
    assert base64.b64decode((await spool.quarantine_get(entry["id"]))["rawBase64"]) == junk


async def test_transient_failure_after_a_rejection_resumes_without_losing_or_repeating(
        make, db, sdir):
    db.poison = {"bad"}
    db.down_on = {2}  # [a, bad, c, d] refused naming "bad"; then the database is down
    spool = make(flush_ms=10_000).proxy()
    await (await spool.append([ev("a"), ev("bad"), ev("c"), ev("d")]))
    await spool.finalize()
    assert await spool.recover() == 0
    assert db.tids() == []
    assert [e["transactionId"] for e in await spool.quarantine_list()] == ["bad"]
    assert await spool.recover() == 3
    assert db.tids() == ["a", "c", "d"]
    assert [e["transactionId"] for e in await spool.quarantine_list()] == ["bad"]


async def test_files_older_versions_set_aside_become_quarantine_entries(make, db, sdir):
    """Leftover failed/ files (whole files an older version gave up on) are
    readable by the same tools: one entry per event, replayable."""
    (sdir / "failed").mkdir(parents=True)
    (sdir / "failed" / "queen-1600000000000-00000000.buf").write_bytes(
        encode_legacy_records([ev("h1"), ev("h2")]))
    spool = make(flush_ms=10_000).proxy()
    await spool.recover()
    assert os.listdir(sdir / "failed") == []
    entries = await spool.quarantine_list()
    assert [(e["transactionId"], e["reason"]) for e in entries] == [("h1", "legacy"),
                                                                     ("h2", "legacy")]
    assert (await spool.stats())["quarantinedEvents"] == 2
    result = await spool.quarantine_replay(entries[0]["id"], {"partition": "elsewhere"})
    assert result["status"] == "queued" and result["partition"] == "elsewhere"
    assert db.rows[-1]["partition"] == "elsewhere" and db.tids() == ["h1"]
    assert await spool.quarantine_discard(entries[1]["id"]) is True
    assert await spool.quarantine_discard(entries[1]["id"]) is False
    assert await spool.quarantine_list() == [] and (await spool.stats())["quarantinedEvents"] == 0


async def test_replaying_a_quarantined_event_that_is_still_refused_keeps_it(make, db, sdir):
    db.poison = {"bad"}
    spool = make(start_paused=True, flush_ms=2).proxy()
    await (await spool.append([ev("bad")]))
    await spool.resume()
    await wait_until_async(lambda: db.calls >= 1)
    # the entry is written right after the rejection
    entries = await wait_until_async(spool.quarantine_list, 3, "the rejected event quarantined")
    with pytest.raises(Rejected):
        await spool.quarantine_replay(entries[0]["id"], {})
    with pytest.raises(ValueError, match="NUL"):
        await spool.quarantine_replay(entries[0]["id"], {"queue": "q\x00"})
    assert len(await spool.quarantine_list()) == 1
    db.poison = set()
    assert (await spool.quarantine_replay(entries[0]["id"], {}))["transactionId"] == "bad"
    assert db.tids() == ["bad"] and await spool.quarantine_list() == []


async def test_a_push_past_the_byte_cap_is_refused_and_nothing_is_written(make, sdir):
    spool = make(start_paused=True, max_bytes=600).proxy()
    await (await spool.append([ev("a"), ev("b")]))
    before = (await spool.stats())["pendingBytes"]
    assert 0 < before < 600
    with pytest.raises(SpoolFull, match="FILE_BUFFER_MAX_BYTES"):
        await (await spool.append([ev(f"x{i}") for i in range(5)]))
    stats = await spool.stats()
    assert stats["pendingBytes"] == before and stats["pendingCount"] == 2
    assert stats["rejectedFull"] == 5
    (tmp,) = files(sdir, ".tmp")
    assert tmp.stat().st_size == before


# -- write failures ------------------------------------------------------------------

async def test_unusable_directory_raises_clear_spool_error(make, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    spool = make(not_a_dir).proxy()
    with pytest.raises(SpoolError, match="spool write failed: .*Not a directory"):
        await (await spool.append([ev("a"), ev("b")]))
    stats = await spool.stats()
    assert stats["healthy"] is False and stats["failedCount"] == 2
    assert stats["pendingCount"] == 0


async def test_disk_full_midway_leaves_no_partial_request(make, db, sdir, monkeypatch):
    real_write = os.write
    budget = {"bytes": None}

    def write(fd, data):
        if budget["bytes"] is None:
            return real_write(fd, data)
        if budget["bytes"] <= 0:
            raise OSError(28, "No space left on device")
        n = real_write(fd, bytes(data[:budget["bytes"]]))
        budget["bytes"] -= n
        return n

    monkeypatch.setattr(writer_mod, "_os_write", write)
    spool = make(start_paused=True).proxy()
    await (await spool.append([ev("a1"), ev("a2")]))
    (tmp,) = files(sdir, ".tmp")
    size = tmp.stat().st_size
    budget["bytes"] = 30  # the next push gets 30 bytes onto disk, then ENOSPC
    with pytest.raises(SpoolError) as err:
        await (await spool.append([ev("b1"), ev("b2"), ev("b3")]))
    assert str(err.value) == "spool write failed: [Errno 28] No space left on device"
    assert tmp.stat().st_size == size
    stats = await spool.stats()
    assert stats["healthy"] is False and stats["failedCount"] == 3 and stats["pendingCount"] == 2
    budget["bytes"] = None  # space again
    await (await spool.append([ev("c1")]))
    assert (await spool.stats())["healthy"] is True
    await spool.resume()
    await wait_until_async(lambda: len(db.rows) == 3)
    await asyncio.sleep(0.02)  # proves nothing more is uploaded (the failed push): a sleep on purpose
    assert db.tids() == ["a1", "a2", "c1"]


# -- the backlog (sticky failover) ---------------------------------------------------

def counts(backlog: SpoolBacklog) -> dict:
    return dict(backlog._counts)


def test_backlog_counts_per_queue_and_partition():
    b = SpoolBacklog()
    assert not b.holds([("q", "p0")]) and b.total() == 0 and b.partitions() == 0
    b.add([ev("a"), ev("b"), ev("c", "p1"), ev("d", queue="q2"),
           {"queue": "q", "transactionId": "e"}, {"queue": "q", "partition": None, "transactionId": "f"}])
    assert counts(b) == {("q", "p0"): 2, ("q", "p1"): 1, ("q2", "p0"): 1, ("q", "Default"): 2}
    assert b.total() == 6 and b.partitions() == 4
    assert b.holds([("q", "p1")]) and b.holds([("x", "y"), ("q2", "p0")])
    assert b.holds([("q", None)]) and b.holds([("q", "Default")])
    assert not b.holds([("q", "p9"), ("q2", "p1")]) and not b.holds([])
    b.remove([ev("a"), ev("c", "p1"), ev("c", "p1"), ev("zz", "p7")])  # never below zero
    assert counts(b) == {("q", "p0"): 1, ("q2", "p0"): 1, ("q", "Default"): 2}
    assert not b.holds([("q", "p1")]) and b.partitions() == 3  # zero entries are dropped
    b.clear()
    assert b.total() == 0 and b.partitions() == 0 and not b.holds([("q", "p0")])


async def test_backlog_counts_appends_across_partitions(make, sdir):
    ref = make(start_paused=True, events_per_file=3)
    spool = ref.proxy()
    backlog = await spool.backlog_ref()
    assert isinstance(backlog, SpoolBacklog) and backlog.total() == 0
    await (await spool.append([ev("a0", "a"), ev("b0", "b")]))
    await (await spool.append([ev("a1", "a"), ev("a2", "a"), ev("c0", "c", queue="q2")]))  # rotates
    await (await spool.append([ev("b1", "b")]))
    # the very object the spool keeps up to date, read without a round trip
    assert backlog is await spool.backlog_ref()
    assert counts(backlog) == {("q", "a"): 3, ("q", "b"): 2, ("q2", "c"): 1}
    assert backlog.holds([("q", "a")]) and backlog.holds([("q2", "c")])
    assert not backlog.holds([("q", "c")]) and not backlog.holds([("q2", "a")])
    stats = await spool.stats()
    assert stats["backlogPartitions"] == 3 and stats["pendingCount"] == 6


async def test_backlog_holds_until_the_upload_returned(make, db, sdir):
    db.gate = asyncio.Event()
    seen = []
    ref = make(events_per_file=3)
    spool = ref.proxy()
    backlog = await spool.backlog_ref()
    db.probe = lambda when, events: seen.append((when, backlog.count("q", "a"), backlog.count("q", "b")))
    await (await spool.append([ev("a0", "a"), ev("a1", "a"), ev("a2", "a")]))
    await (await spool.append([ev("b0", "b")]))
    await wait_until_async(lambda: db.calls == 1)  # the drain is stuck inside the first upload
    await asyncio.sleep(0.02)  # proves the counts stay while it is stuck: a sleep on purpose
    assert backlog.holds([("q", "a")]) and backlog.holds([("q", "b")])
    assert backlog.total() == 4
    db.gate.set()
    await wait_until_async(lambda: backlog.total() == 0)
    assert not backlog.holds([("q", "a")]) and not backlog.holds([("q", "b")])
    assert db.tids() == ["a0", "a1", "a2", "b0"]
    # each file still counted while its transaction ran, even once committed;
    # taken off only after upload() returned
    assert seen == [("start", 3, 1), ("committed", 3, 1), ("start", 0, 1), ("committed", 0, 1)]
    assert (await spool.stats())["backlogPartitions"] == 0


async def test_an_upload_registers_what_is_left_and_holds_its_own_partitions(make, db, sdir):
    """The backlog an upload registers (in its transaction) is what is still
    on disk, plus the uploaded file's partitions from a bound below any accept
    time still to come: a push appended during the upload is held for too."""
    db.gate = asyncio.Event()
    spool = make(events_per_file=2).proxy()
    await (await spool.append([ev("a0", "a"), ev("b0", "b")]))  # file 1
    await wait_until_async(lambda: db.calls == 1)
    await (await spool.append([ev("b1", "b")]))  # the active file
    db.gate.set()
    await wait_until_async(lambda: db.tids() == ["a0", "b0", "b1"])
    first = db.oldest[0]
    assert set(first) == {("q", "a"), ("q", "b")}
    appended_b1 = db.rows[2]["acceptedAt"]
    assert first[("q", "b")] <= appended_b1 and first[("q", "a")] > db.rows[0]["acceptedAt"]


async def test_backlog_holds_pushes_spooled_during_a_drain(make, db, sdir):
    """A push appended while older events of its partition replay stays held."""
    db.gate = asyncio.Event()
    spool = make().proxy()
    backlog = await spool.backlog_ref()
    await (await spool.append([ev("a0", "a")]))
    await wait_until_async(lambda: db.calls == 1)
    await (await spool.append([ev("a1", "a")]))  # sticky: the broker diverted it here
    assert backlog.count("q", "a") == 2
    db.gate.set()
    await wait_until_async(lambda: db.calls == 2)
    await wait_until_async(lambda: backlog.total() == 0)
    assert db.tids() == ["a0", "a1"]


async def test_backlog_ignores_a_failed_append(make, sdir, monkeypatch, tmp_path):
    budget = {"bytes": None}
    real_write = os.write

    def write(fd, data):
        if budget["bytes"] is None:
            return real_write(fd, data)
        if budget["bytes"] <= 0:
            raise OSError(28, "No space left on device")
        n = real_write(fd, bytes(data[:budget["bytes"]]))
        budget["bytes"] -= n
        return n

    monkeypatch.setattr(writer_mod, "_os_write", write)
    spool = make(start_paused=True).proxy()
    backlog = await spool.backlog_ref()
    await (await spool.append([ev("a1", "a")]))
    budget["bytes"] = 30  # part of the next push reaches the disk, then ENOSPC: rolled back
    with pytest.raises(SpoolError):
        await (await spool.append([ev("a2", "a"), ev("b1", "b")]))
    assert counts(backlog) == {("q", "a"): 1}

    # rolling back fails as well: the file is finalized with a torn tail, still not counted
    monkeypatch.setattr(writer_mod, "_os_ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(5, "EIO")))
    budget["bytes"] = 30
    with pytest.raises(SpoolError):
        await (await spool.append([ev("a3", "a"), ev("c1", "c")]))
    assert counts(backlog) == {("q", "a"): 1}

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    broken = make(not_a_dir).proxy()
    with pytest.raises(SpoolError):
        await (await broken.append([ev("x", "a")]))
    assert (await broken.backlog_ref()).total() == 0


async def test_backlog_counts_files_found_at_start(make, db, sdir):
    sdir.mkdir()
    (sdir / "queen-1700000000000-00000000.buf").write_bytes(
        encode_file([ev("a0", "a"), ev("b0", "b"), ev("a1", "a"), ev("x0", "x", queue="q2")])
        + frame_record(b"{nope"))  # unparseable: no partition to hold
    (sdir / "queen-1700000000001-00000000.tmp").write_bytes(  # a crashed run's active file
        encode_file([ev("b1", "b"), ev("c0", "c")])
        + encode_records([ev("d0", "d")])[:-2])  # torn: never acknowledged, not counted
    (sdir / "queen-1700000000002-00000000.tmp").write_bytes(b"")
    ref = make(flush_ms=10_000)
    spool = ref.proxy()
    backlog = await spool.backlog_ref()
    assert counts(backlog) == {("q", "a"): 2, ("q", "b"): 2, ("q", "c"): 1, ("q2", "x"): 1}
    assert (await spool.stats())["backlogPartitions"] == 4
    assert await spool.recover() == 6
    assert backlog.total() == 0 and backlog.partitions() == 0
    assert db.tids("b") == ["b0", "b1"]


async def test_backlog_drops_quarantined_events(make, db, sdir):
    sdir.mkdir()
    (sdir / "queen-1700000000000-00000000.buf").write_bytes(
        encode_file([ev("a0", "a"), ev("bad", "p"), ev("p1", "p"), ev("a1", "a")]))
    (sdir / "queen-1700000000001-00000000.buf").write_bytes(encode_file([ev("a2", "a")]))
    db.poison = {"bad"}
    spool = make(flush_ms=10_000).proxy()  # recover() drives every attempt
    backlog = await spool.backlog_ref()
    assert counts(backlog) == {("q", "a"): 3, ("q", "p"): 2}
    assert await spool.recover() == 4  # "bad" is set aside, the rest uploaded
    assert backlog.total() == 0 and db.tids() == ["a0", "p1", "a1", "a2"]
    assert [e["transactionId"] for e in await spool.quarantine_list()] == ["bad"]


async def test_backlog_keeps_counts_through_transient_failures(make, db, sdir):
    db.down = True
    spool = make(flush_ms=1, cooldown_after=1000).proxy()
    backlog = await spool.backlog_ref()
    await (await spool.append([ev("a0", "a"), ev("b0", "b")]))
    await (await spool.append([ev("a1", "a")]))
    await wait_until_async(lambda: db.calls >= 10)
    assert counts(backlog) == {("q", "a"): 2, ("q", "b"): 1}
    assert await spool.recover() == 0
    assert counts(backlog) == {("q", "a"): 2, ("q", "b"): 1}
    db.down = False
    await wait_until_async(lambda: backlog.total() == 0)
    assert db.tids() == ["a0", "b0", "a1"]


async def test_backlog_retried_file_subtracts_once(make, db, sdir):
    sdir.mkdir()
    (sdir / "queen-1700000000000-00000000.buf").write_bytes(
        encode_file([ev(f"a{i}", "a") for i in range(6)]))
    (sdir / "queen-1700000000001-00000000.buf").write_bytes(encode_file([ev("a6", "a")]))
    db.down_on = {2}  # the second file fails once
    spool = make(flush_ms=10_000).proxy()
    backlog = await spool.backlog_ref()
    assert backlog.count("q", "a") == 7
    assert await spool.recover() == 6
    assert backlog.count("q", "a") == 1
    assert await spool.recover() == 1
    assert backlog.total() == 0 and db.tids() == [f"a{i}" for i in range(7)]
    assert db.duplicates == 0


async def test_backlog_ignores_a_file_uploaded_again_after_its_delete(make, db, sdir, tmp_path):
    """An uploaded file that reappears (crash before the delete) must not
    release newer spooled events of the same partition."""
    spool = make(flush_ms=10_000).proxy()
    backlog = await spool.backlog_ref()
    await (await spool.append([ev("a0", "a"), ev("a1", "a")]))
    assert await spool.finalize()
    (buf,) = files(sdir, ".buf")
    shutil.copy(buf, tmp_path / "copy")
    assert await spool.recover() == 2 and backlog.total() == 0
    await (await spool.append([ev("a2", "a")]))  # active file, not drained yet
    shutil.copy(tmp_path / "copy", buf)
    assert await spool.recover() == 0 and db.duplicates == 0  # the ledger: skipped
    assert counts(backlog) == {("q", "a"): 1}
    await spool.finalize()
    assert await spool.recover() == 1
    assert backlog.total() == 0 and db.tids() == ["a0", "a1", "a2"]


async def test_backlog_follows_a_stranded_tmp_file(make, db, sdir, monkeypatch):
    """A .tmp that cannot be renamed yet keeps holding its partitions, and is
    counted once when it finally becomes drainable."""
    spool = make(flush_ms=10_000).proxy()
    backlog = await spool.backlog_ref()
    await (await spool.append([ev("a0", "a")]))
    real_rename = os.rename

    def no_rename(src, dst):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "rename", no_rename)
    assert await spool.finalize() is False
    assert len(files(sdir, ".tmp")) == 1 and counts(backlog) == {("q", "a"): 1}
    assert await spool.recover() == 0  # leftovers finalizing fails again: counted once
    assert counts(backlog) == {("q", "a"): 1}
    assert (await spool.stats())["pendingCount"] == 1
    monkeypatch.setattr(os, "rename", real_rename)
    assert await spool.recover() == 1
    assert backlog.total() == 0 and (await spool.stats())["pendingCount"] == 0


# -- durability: what "buffered" waits for (FILE_BUFFER_FSYNC) -----------------------

class GatedSync:
    """Stands in for the writer's fdatasync (run in a thread): each call waits until the
    test opens the gate, records the file's size it covered, then syncs for real (or
    raises EIO when told to)."""

    def __init__(self, monkeypatch) -> None:
        import threading
        self.real = writer_mod._datasync
        self.started = threading.Semaphore(0)
        self.gate = threading.Semaphore(0)
        self.covered: list[int] = []
        self.fail = False
        monkeypatch.setattr(writer_mod, "_datasync", self)

    def __call__(self, fd: int, directory) -> None:
        self.covered.append(os.fstat(fd).st_size)  # what the file held as the sync began
        self.started.release()
        self.gate.acquire(timeout=10)
        if self.fail:
            import errno
            raise OSError(errno.EIO, "Input/output error (injected)")
        self.real(fd, directory)

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.acquire, True, 10), "no sync started"

    def open(self, times: int = 1) -> None:
        for _ in range(times):
            self.gate.release()


async def test_a_spooled_push_is_acknowledged_only_after_a_sync_covering_it(
        make, sdir, monkeypatch):
    """Group commit: one sync runs at a time; the pushes written while it runs wait for
    the next one, which covers them all; none is answered before its sync returns."""
    sync = GatedSync(monkeypatch)
    spool = make(start_paused=True).proxy()
    first = await spool.append([ev("a")])
    await sync.wait_started()
    later = [await spool.append([ev(t)]) for t in ("b", "c", "d")]
    await asyncio.sleep(0.05)  # give a wrongly early answer the chance to show
    assert not first.done() and not any(f.done() for f in later)
    sync.open()
    await first
    assert not any(f.done() for f in later)  # written after the first sync began
    await sync.wait_started()
    sync.open()
    await asyncio.gather(*later)
    (tmp,) = files(sdir, ".tmp")
    assert len(sync.covered) == 2 and sync.covered[0] < sync.covered[1] == tmp.stat().st_size
    stats = await spool.stats()
    assert stats["syncs"] == 2 and stats["fsync"] == "always" and stats["syncFailures"] == 0


async def test_a_failed_sync_answers_its_pushes_with_an_error_and_keeps_only_what_was_synced(
        make, db, sdir, monkeypatch):
    """A failed fsync is a failed write: the pushes it covered are refused, the file is
    cut back to its last good sync and never trusted past it, and the next push goes to a
    fresh file; every acknowledged push drains."""
    sync = GatedSync(monkeypatch)
    ref = make(start_paused=True, flush_ms=10_000)
    spool = ref.proxy()
    ok = await spool.append([ev("ok1")])
    sync.open()
    await ok
    sync.fail = True
    doomed = [await spool.append([ev(t)]) for t in ("x1", "x2")]
    sync.open(2)
    for f in doomed:
        with pytest.raises(SpoolError, match="fsync failed"):
            await f
    stats = await until_stats(spool, lambda s: s["syncFailures"] == 1)
    assert not stats["healthy"] and stats["failedCount"] == 2
    sync.fail = False
    after = await spool.append([ev("ok2")])
    sync.open()
    await after
    await spool.resume()
    await wait_until_async(lambda: len(db.rows) == 2)
    assert db.tids() == ["ok1", "ok2"]  # the refused pushes are not delivered
    assert (await spool.stats())["healthy"]


async def test_interval_policy_answers_at_once_and_syncs_within_the_window(
        make, sdir, monkeypatch):
    calls: list[int] = []
    real = writer_mod._datasync
    monkeypatch.setattr(writer_mod, "_datasync",
                        lambda fd, d: (calls.append(fd), real(fd, d)))
    # A window far longer than three appends take, so the one sync comes after all of them.
    spool = make(start_paused=True, sync_interval_ms=1000).proxy()
    for t in ("a", "b", "c"):
        assert (await spool.append([ev(t)])).done()
    assert calls == []
    stats = await until_stats(spool, lambda s: s["syncs"] >= 1, timeout=10)
    assert stats["fsync"] == "interval:1000" and len(calls) == 1


async def test_start_cuts_a_torn_tail_and_quarantines_a_damaged_record_while_its_neighbours_drain(
        make, db, sdir):
    sdir.mkdir()
    head = encode_file([ev("a")])
    damaged = bytearray(encode_records([ev("b")]))
    damaged[-5] ^= 0x04  # one bit inside the payload's text: valid JSON, other content
    tail = encode_records([ev("d")])
    path = sdir / "queen-1700000000000-00000000.tmp"
    path.write_bytes(head + bytes(damaged) + encode_records([ev("c")]) + tail[:-4])
    spool = make(flush_ms=10_000).proxy()
    stats = await spool.stats()
    assert stats["tornBytesCut"] == len(tail) - 4 and stats["damagedRecords"] == 1
    assert (sdir / "queen-1700000000000-00000000.buf").stat().st_size == \
        len(head) + len(damaged) + len(encode_records([ev("c")]))
    assert await spool.recover() == 2 and db.tids() == ["a", "c"]
    (entry,) = await spool.quarantine_list()
    assert entry["reason"] == "corrupt" and entry["id"].endswith("-raw00000001")
    import base64
    raw = base64.b64decode((await spool.quarantine_get(entry["id"]))["rawBase64"])
    assert raw == bytes(damaged)


async def test_a_new_spool_id_is_on_disk_before_it_is_used(make, sdir, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    spool = make(start_paused=True).proxy()
    ident = await spool.identity()
    assert (sdir / "spool-id").read_text().strip() == ident
    assert synced[-2:] == [str(sdir / "spool-id.part"), str(sdir)]  # the file, then its name


# -- the record format, property-tested ------------------------------------------------

_events = st.lists(st.fixed_dictionaries({
    "queue": st.text(min_size=1, max_size=8), "transactionId": st.text(min_size=1, max_size=12),
    "payload": st.one_of(st.none(), st.integers(), st.text(max_size=40),
                         st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))}),
    min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(events=_events, data=st.data())
def test_a_flipped_bit_anywhere_damages_only_its_own_record(events, data):
    """Never a different payload: the record holding the bit is set aside whole, every
    other record reads as written, and nothing is taken for a torn tail."""
    records = [encode_records([e]) for e in events]
    k = data.draw(st.integers(0, len(records) - 1), label="record")
    bit = data.draw(st.integers(0, len(records[k]) * 8 - 1), label="bit")
    damaged = bytearray(records[k])
    damaged[bit // 8] ^= 1 << (bit % 8)
    blob = encode_file([]) + b"".join(records[:k]) + bytes(damaged) + b"".join(records[k + 1:])
    scan = scan_bytes(blob)
    want = [{**e, "partition": "Default"} for j, e in enumerate(events) if j != k]
    assert scan.events == want
    assert scan.bad == [(k, bytes(damaged), "corrupt")] and scan.torn == 0


@settings(max_examples=200, deadline=None)
@given(events=_events, data=st.data())
def test_a_file_cut_anywhere_reads_as_its_whole_records_and_a_torn_tail(events, data):
    blob = encode_file(events)
    cut = data.draw(st.integers(0, len(blob)), label="cut")
    scan = scan_bytes(blob[:cut])
    whole = [i for i, end in enumerate(_record_ends(events)) if end <= cut]
    assert scan.events == [{**events[i], "partition": "Default"} for i in whole]
    assert scan.bad == [] and scan.good_end + scan.torn == cut
    header = len(encode_file([]))  # a cut inside the header leaves no file to speak of
    assert scan.good_end == (_record_ends(events)[whole[-1]] if whole else
                             header if cut >= header else 0)


def _record_ends(events) -> list[int]:
    ends, pos = [], len(encode_file([]))
    for e in events:
        pos += len(encode_records([e]))
        ends.append(pos)
    return ends
