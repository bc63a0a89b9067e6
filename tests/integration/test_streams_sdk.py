"""The official Python client's streaming SDK (queen-mq 2.6.0, ``queen.streams``) against a
real broker: a real ``Stream...run()`` with an event-time tumbling window, a reduce and a
sink, in worker processes (tests/integration/streams_worker.py). Checked: the sink holds
exactly one message per closed window with the sum computed here, also when the worker
dies mid-way (before or after a cycle's commit) and a new one takes over: state and source
offsets are exactly-once. A changed pipeline is refused without reset; with reset it starts
clean."""
from __future__ import annotations

import collections
import contextlib
import io
import json
import random
import subprocess
import sys

import asyncpg
import httpx
import pytest
from queen import Queen
from queen.streams.runtime.register import StreamsConfigHashMismatch

from tests.conftest import ROOT, db_fetch, db_val
from tests.integration.streams_worker import pipeline
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(180)

PARTITIONS = ["alice", "bob", "carol"]
WINDOWS = 12
EVENTS_PER_WINDOW = 4
T0 = 1_800_000_000_000  # epoch ms, window-aligned


def make_events(seed: int) -> tuple[dict[str, list[dict]], dict[tuple[str, int], int]]:
    """Per partition: events in event-time order, then one far-future event that closes
    the last real window (its own window stays open). Returns (events, expected sums)."""
    rng = random.Random(seed)
    events: dict[str, list[dict]] = {}
    expected: dict[tuple[str, int], int] = {}
    for p in PARTITIONS:
        out = []
        for w in range(WINDOWS):
            start = T0 + w * 1000
            amounts = [rng.randint(1, 100) for _ in range(EVENTS_PER_WINDOW)]
            expected[(p, start)] = sum(amounts)
            out += [{"ts": start + 10 * j, "amount": a} for j, a in enumerate(amounts)]
        out.append({"ts": T0 + 10_000_000, "amount": 0})
        events[p] = out
    return events, expected


def feed(http: httpx.Client, source: str, events: dict[str, list[dict]]) -> None:
    for p, items in events.items():
        for n in range(0, len(items), 10):  # several pushes per partition, in order
            r = http.post("/api/v1/push", json={"items": [
                {"queue": source, "partition": p, "payload": e} for e in items[n:n + 10]]})
            assert r.status_code in (200, 201), r.text


SINK_SQL = """SELECT m.payload FROM queen.messages m
    JOIN queen.partitions p ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = $1 ORDER BY p.name, m.seq"""


def windows_of(rows) -> list[tuple[str, int, int]]:
    """(key, windowStart, sum) of each sink message."""
    values = [json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"]
              for r in rows]
    return [(v["key"], v["windowStart"], v["sum"]) for v in values]


def sink_windows(database, sink: str) -> list[tuple[str, int, int]]:
    return windows_of(db_fetch(database, SINK_SQL, sink))


def source_consumed(database, source: str, group: str) -> bool:
    """Every message of every source partition is behind the group's cursor."""
    return bool(db_val(database, """SELECT bool_and(coalesce(l.cursor_seq, 0) = p.last_seq)
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        LEFT JOIN queen.log_consumers l ON l.partition_id = p.id AND l.consumer_group = $2
        WHERE q.name = $1""", source, group))


def worker(url: str, source: str, sink: str, query: str, *crash: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.integration.streams_worker", url,
                             source, sink, query, *crash], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.mark.parametrize("when", ["sent", "unsent"])
def test_tumbling_sums_are_exactly_once_across_a_worker_crash(http, database, base_url,
                                                             queue_name, when):
    """A worker dies at its 5th acknowledging cycle (after sending it, or before); a new
    worker of the same query finishes the job. Every closed window is in the sink exactly
    once with the right sum (nothing counted twice, nothing lost), and the source group's
    cursor is at the end of every partition."""
    source, sink, query = queue_name, queue_name + "-sink", "sum-" + queue_name
    # a dead worker's lease frees its partition after 2 s instead of the default 5 min
    r = http.post("/api/v1/configure", json={"queue": source, "options": {"leaseTime": 2}})
    assert r.status_code == 200, r.text
    events, expected = make_events(seed=hash(when) & 0xFFFF)
    feed(http, source, events)

    first = worker(base_url, source, sink, query, "5", when)
    try:
        assert first.wait(60) == 137, first.stderr.read().decode() if first.stderr else ""
    finally:
        stop(first)
    partial = sink_windows(database, sink)
    assert len(partial) < len(expected), "the crash came after the work was done"

    second = worker(base_url, source, sink, query)
    try:
        wait_until(lambda: source_consumed(database, source, "streams." + query)
                   and len(sink_windows(database, sink)) >= len(expected), 90,
                   "the second worker to finish")
    finally:
        stop(second)
    got = sink_windows(database, sink)
    dupes = [w for w, n in collections.Counter((k, s) for k, s, _ in got).items() if n > 1]
    assert dupes == [], f"windows emitted twice: {dupes}"
    assert {(k, s): v for k, s, v in got} == expected
    # what is left in state: each partition's watermark and its open far-future window
    qid = db_val(database, "SELECT id FROM queen_streams.queries WHERE name = $1", query)
    keys = [r["key"] for r in db_fetch(database,
                                       "SELECT key FROM queen_streams.state WHERE query_id = $1",
                                       qid)]
    assert sorted(k.split("\u001f")[0] for k in keys) == sorted(
        ["__wm__"] * len(PARTITIONS) + ["tumb:1"] * len(PARTITIONS))


async def test_changed_pipeline_needs_reset(base_url, database, queue_name):
    """The same query_id with another window size: Stream.run refuses (409 from the broker);
    with reset=True it runs, and the old state is gone."""
    source, sink, query = queue_name, queue_name + "-sink", "reset-" + queue_name
    q = Queen(base_url)
    conn = await asyncpg.connect(database.dsn)
    count = """SELECT count(*) FROM queen_streams.state s JOIN queen_streams.queries q
               ON q.id = s.query_id WHERE q.name = $1"""
    try:
        await q.queue(source).partition("p").push([{"ts": T0, "amount": 5}])
        runner = await pipeline(q, source, sink).run(query_id=query, url=base_url,
                                                     max_wait_millis=100)
        await wait_until_async(lambda: conn.fetchval(count, query), 30, "state written")
        await runner.stop()
        qid = await conn.fetchval("SELECT id FROM queen_streams.queries WHERE name = $1", query)

        with pytest.raises(StreamsConfigHashMismatch):
            await pipeline(q, source, sink, seconds=2).run(query_id=query, url=base_url)
        assert await conn.fetchval(count, query) > 0

        runner = await pipeline(q, source, sink, seconds=2).run(query_id=query, url=base_url,
                                                                reset=True,
                                                                max_wait_millis=100)
        await runner.stop()
        assert await conn.fetchval(count, query) == 0
        assert await conn.fetchval("SELECT id FROM queen_streams.queries WHERE name = $1",
                                   query) == qid
    finally:
        await conn.close()
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()


def _window_sums(events: dict[str, list[dict]], starts) -> dict[tuple[str, int], int]:
    """Sum per (partition, window start) of every window ``starts(ts)`` puts an event in,
    leaving out the windows of each partition's far-future closing event."""
    out: dict[tuple[str, int], int] = collections.defaultdict(int)
    for p, items in events.items():
        for e in items[:-1]:
            for s in starts(e["ts"]):
                out[(p, s)] += e["amount"]
    return dict(out)


def _session_sums(events: dict[str, list[dict]], gap_ms: int) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for p, items in events.items():
        start, last, acc = None, None, 0
        for e in items[:-1]:
            if last is not None and e["ts"] - last > gap_ms:
                out[(p, start)] = acc
                start, acc = None, 0
            start = e["ts"] if start is None else start
            last, acc = e["ts"], acc + e["amount"]
        out[(p, start)] = acc
    return out


def _sessions_events() -> dict[str, list[dict]]:
    """Bursts of events 100 ms apart, bursts 2 s apart (a session gap of 0.5 s splits them)."""
    rng = random.Random(7)
    events = {}
    for p in PARTITIONS:
        items, t = [], T0
        for _burst in range(5):
            for _ in range(rng.randint(1, 4)):
                items.append({"ts": t, "amount": rng.randint(1, 50)})
                t += 100
            t += 2000
        items.append({"ts": T0 + 10_000_000, "amount": 0})
        events[p] = items
    return events


@pytest.mark.parametrize("kind", ["sliding", "session", "cron"])
async def test_sdk_window_kinds(base_url, database, queue_name, kind):
    """The SDK's other event-time windows give the sums computed here, each window once:
    sliding (2 s every 1 s), session (gap 0.5 s), cron (every second)."""
    from queen.streams import Stream

    source, sink, query = queue_name, queue_name + "-sink", f"{kind}-" + queue_name
    if kind == "session":
        events = _sessions_events()
        expected = _session_sums(events, 500)
    else:
        events, _ = make_events(seed=11)
        step = (lambda ts: [ts // 1000 * 1000 - 1000, ts // 1000 * 1000]) if kind == "sliding" \
            else (lambda ts: [ts // 1000 * 1000])
        expected = _window_sums(events, step)
    with httpx.Client(base_url=base_url, timeout=30) as http:
        feed(http, source, events)
    q = Queen(base_url)
    try:
        s = Stream.from_(q.queue(source))
        et = {"event_time": lambda m: m["data"]["ts"]}
        s = {"sliding": lambda: s.window_sliding(size=2, slide=1, **et),
             "session": lambda: s.window_session(gap=0.5, **et),
             "cron": lambda: s.window_cron(every="second", **et)}[kind]()
        s = (s.reduce(lambda acc, v: acc + v["amount"], 0)
             .map(lambda v, ctx: {"key": ctx["partition"], "windowStart": ctx["windowStart"],
                                  "sum": v})
             .to(q.queue(sink)))
        runner = await s.run(query_id=query, url=base_url, batch_size=7, max_wait_millis=100)
        conn = await asyncpg.connect(database.dsn)
        try:
            await wait_until_async(
                lambda: _at_least(conn.fetch(SINK_SQL, sink), len(expected)), 60,
                "every window in the sink")
            await runner.stop()
            got = windows_of(await conn.fetch(SINK_SQL, sink))
        finally:
            await conn.close()
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()
    assert len(got) == len(expected)
    if kind == "session":  # session starts are the first event's time: compare sums per key
        by_key = collections.defaultdict(list)
        for (k, _), v in expected.items():
            by_key[k].append(v)
        got_by_key = collections.defaultdict(list)
        for k, _, v in got:
            got_by_key[k].append(v)
        assert {k: sorted(v) for k, v in got_by_key.items()} == {
            k: sorted(v) for k, v in by_key.items()}
    else:
        assert {(k, s): v for k, s, v in got} == expected


async def _at_least(rows, n: int) -> bool:
    return len(await rows) >= n
