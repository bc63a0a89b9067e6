"""Offset reads and partition discovery through the official client:
``queue.fetch`` (POST /api/v1/fetch) and ``queue.changed_since``
(POST /api/v1/partitions/changed), against the real broker process."""
from __future__ import annotations

import asyncio

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def push(http: httpx.Client, queue: str, partition: str, values) -> None:
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "payload": v} for v in values]})
    assert r.status_code in (200, 201), r.text


async def test_fetch_reads_by_offset_without_a_lease(client, http, queue_name):
    """Records come back by offset with the client's fields; reading leaves no lease,
    so a pop afterwards still gets every message; offsets pick up where asked."""
    push(http, queue_name, "a", [{"n": i} for i in range(5)])
    push(http, queue_name, "b", ["x"])
    read = await client.queue(queue_name).fetch(["a", "b", "never-written"])
    a = read["a"]
    assert [r["offset"] for r in a["records"]] == [0, 1, 2, 3, 4]
    assert [r["payload"] for r in a["records"]] == [{"n": i} for i in range(5)]
    assert all(r["transactionId"] and r["ts"].endswith("Z") for r in a["records"])
    assert (a["highWatermark"], a["logStartOffset"], a["nextOffset"]) == (5, 0, 5)
    assert [r["payload"] for r in read["b"]["records"]] == ["x"]
    assert read["never-written"]["records"] == []
    later = await client.queue(queue_name).fetch("a", offsets={"a": 3})
    assert [r["offset"] for r in later["a"]["records"]] == [3, 4]
    # no lease was taken: a pop still sees the first message of the partition
    popped = await client.queue(queue_name).partition("a").batch(10).wait(False).pop()
    assert [m["data"] for m in popped] == [{"n": i} for i in range(5)]


async def test_fetch_pages_by_bytes(client, http, queue_name):
    """A byte budget smaller than the partition makes the client ask again from one past
    the last record: every record arrives once, in order; a record larger than the
    budget is still read (alone)."""
    big = "y" * 5000
    push(http, queue_name, "p", [big] + [f"v{i}" for i in range(20)])
    read = await client.queue(queue_name).fetch("p", max_bytes=64)
    assert [r["offset"] for r in read["p"]["records"]] == list(range(21))
    assert read["p"]["records"][0]["payload"] == big


def test_fetch_raw_limits_and_out_of_range(http, queue_name):
    """The raw route: highWatermark, an offset past the end answers OFFSET_OUT_OF_RANGE,
    an offset at the end answers nothing, a queue that does not exist answers
    UNKNOWN_TOPIC_OR_PARTITION; a per-entry maxBytes bounds the entry."""
    push(http, queue_name, "Default", [f"{i:04d}" for i in range(10)])
    r = http.post("/api/v1/fetch", json={"entries": [
        {"queue": queue_name, "partition": "Default", "offset": 11},
        {"queue": queue_name, "partition": "Default", "offset": 10},
        {"queue": "no-such-queue-x", "partition": "Default", "offset": 0},
        {"queue": queue_name, "partition": "Default", "offset": 2, "maxBytes": 14},
    ]})
    assert r.status_code == 200, r.text
    past, end, unknown, bounded = r.json()["entries"]
    assert past["error"] == "OFFSET_OUT_OF_RANGE" and past["highWatermark"] == 10
    assert end.get("error") is None and end["records"] == []
    assert unknown["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    # each payload is 6 bytes of JSON text ("0002"): 14 bytes hold two
    assert [x["offset"] for x in bounded["records"]] == [2, 3]


async def test_fetch_across_retention(client, http, queue_name):
    """Retention deletes the start of a partition: the raw route answers
    OFFSET_OUT_OF_RANGE below logStartOffset, and the client goes on from the oldest
    kept record instead of reading nothing."""
    r = http.post("/api/v1/configure", json={"queue": queue_name, "options": {
        "retentionEnabled": True, "retentionSeconds": 1}})
    assert r.status_code == 200, r.text
    push(http, queue_name, "Default", ["old-0", "old-1", "old-2"])

    def retention_deleted_them() -> bool:
        http.post("/api/v1/system/jobs/retention/run")
        got = http.post("/api/v1/fetch", json={"entries": [
            {"queue": queue_name, "partition": "Default", "offset": 0}]}).json()
        return got["entries"][0]["logStartOffset"] == 3

    wait_until(retention_deleted_them, 30, "retention to delete the first three records",
               interval=0.3)
    # Records pushed now are younger than the retention age; read them before the job
    # can delete them (it runs every RETENTION_INTERVAL, far longer than this test).
    push(http, queue_name, "Default", ["new-3", "new-4"])
    raw = http.post("/api/v1/fetch", json={"entries": [
        {"queue": queue_name, "partition": "Default", "offset": 0}]}).json()["entries"][0]
    assert raw["error"] == "OFFSET_OUT_OF_RANGE" and raw["records"] == []
    read = await client.queue(queue_name).fetch("Default")
    assert [(r["offset"], r["payload"]) for r in read["Default"]["records"]] == [
        (3, "new-3"), (4, "new-4")]
    assert read["Default"]["logStartOffset"] == 3


async def test_changed_since_pages_and_safe_time(client, http, queue_name):
    """changed_since follows the page cursor over more than one page, lists partitions in
    creation order, and its safeTime as the next ``since`` yields only what changed after."""
    names = [f"p{i:04d}" for i in range(1203)]
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue_name, "partition": n, "payload": 1} for n in names]})
    assert r.status_code in (200, 201), r.text
    first = await client.queue(queue_name).changed_since(None)
    assert sorted(p["name"] for p in first["partitions"]) == names
    assert all(p["lastOffset"] == 0 and p["logStart"] == 0 for p in first["partitions"])
    assert first["safeTime"].endswith("Z")
    push(http, queue_name, "p0007", [2])
    push(http, queue_name, "brand-new", [3])
    second = await client.queue(queue_name).changed_since(first["safeTime"])
    assert sorted(p["name"] for p in second["partitions"]) == ["brand-new", "p0007"]
    assert {p["name"]: p["lastOffset"] for p in second["partitions"]}["p0007"] == 1
    assert (await client.queue("no-such-queue-y").changed_since(None))["partitions"] == []


async def test_changed_since_never_misses_a_concurrent_write(client, http, queue_name):
    """Writers push to many partitions while a reader polls changed_since with each answer's
    safeTime: every partition written is reported by some poll after its write (none
    falls between two polls)."""
    written: set[str] = set()
    seen: set[str] = set()
    done = asyncio.Event()

    async def writer() -> None:
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as ac:
            for i in range(60):
                names = [f"w{i}-{k}" for k in range(3)]
                r = await ac.post("/api/v1/push", json={"items": [
                    {"queue": queue_name, "partition": n, "payload": i} for n in names]})
                assert r.status_code in (200, 201), r.text
                written.update(names)
        done.set()

    async def reader() -> None:
        since = None
        while True:
            finished = done.is_set()
            answer = await client.queue(queue_name).changed_since(since)
            seen.update(p["name"] for p in answer["partitions"])
            since = answer["safeTime"] or since
            if finished:
                return

    await asyncio.gather(writer(), writer(), reader())
    assert written <= seen, sorted(written - seen)[:5]


_ENTRY = st.fixed_dictionaries({}, optional={
    "queue": st.one_of(st.text(max_size=5), st.integers(), st.none()),
    "partition": st.one_of(st.text(max_size=5), st.integers(), st.none()),
    "offset": st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3), st.booleans()),
    "maxBytes": st.one_of(st.integers(), st.text(max_size=3), st.booleans()),
    "since": st.one_of(st.text(max_size=12), st.integers()),
    "after": st.one_of(st.text(max_size=12), st.integers()),
    "limit": st.one_of(st.integers(), st.text(max_size=3)),
})
_BODY = st.one_of(
    st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2),
    st.fixed_dictionaries({}, optional={
        "entries": st.one_of(st.lists(st.one_of(_ENTRY, st.integers()), max_size=3),
                             st.text(max_size=3), st.none()),
        "maxBytes": st.one_of(st.integers(), st.text(max_size=3))}))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_BODY, route=st.sampled_from(["/api/v1/fetch", "/api/v1/partitions/changed"]))
def test_read_bodies_answer_200_or_400(http, body, route):
    """Any body answers 200 or a 400 with an error, never a 500 (reads change nothing)."""
    r = http.post(route, json=body)
    assert r.status_code in (200, 400), (body, r.status_code, r.text)
    if r.status_code == 400:
        assert r.json()["error"]
