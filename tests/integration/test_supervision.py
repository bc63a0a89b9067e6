"""Consumer supervision: the official client's
``consume().supervision({"group": ...})`` publishes its status in the key/value namespace
``queen-supervisor`` and ``GET /api/v1/status/supervision`` reads it back; forged and
garbage values there are flagged, never a 500; every other ``queen-`` namespace stays the
broker's (docs/supervision.md)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
import uuid

import httpx
import pytest

from tests.waiting import wait_until_async

pytestmark = pytest.mark.timeout(180)

NS = "queen-supervisor"
ROUTE = "/api/v1/status/supervision"


@pytest.fixture
def group() -> str:
    return f"sv-{uuid.uuid4().hex[:10]}"


def instances_of(url: str, group: str) -> list[dict]:
    r = httpx.get(url + ROUTE, params={"group": group}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["group"] == group
    assert [g["group"] for g in body["groups"]] in ([], [group])
    return body["groups"][0]["instances"] if body["groups"] else []


async def published(url: str, group: str, check) -> dict:
    """The group's one instance once ``check(instance)`` holds for it."""
    def ready():
        found = instances_of(url, group)
        return found[0] if len(found) == 1 and check(found[0]) else None
    return await wait_until_async(lambda: asyncio.to_thread(ready), 40,
                                  f"a publication of {group} that passes the check")


# -- the official client ---------------------------------------------------------------------

async def test_a_supervised_consume_is_listed_while_running_and_stopped_after(
        client, base_url, queue_name, group):
    """A consume() with supervision, two workers: the route lists its instance running with
    the pool the client reported (queue, consumer group, desired / running / busy), the
    handler calls counted as completed once the next heartbeat publishes them, and, after
    the abort signal, state stopped with no workers running."""
    await client.queue(queue_name).create()
    handled: list = []

    async def handler(message):
        handled.append(message)

    stop = asyncio.Event()
    consumer = asyncio.ensure_future(  # consume() answers an awaitable builder
        client.queue(queue_name).group("billing").batch(1).concurrency(2).timeout_millis(500)
        .supervision({"group": group}).consume(handler, signal=stop))
    try:
        first = await published(base_url, group, lambda i: i["state"] == "running")
        assert first["status"] == "ok" and first["problem"] is None
        assert first["stale"] is False and first["schema"] == "queen.consumer.status/v1"
        assert first["hostname"] == socket.gethostname() and first["pid"] == os.getpid()
        assert first["engine"] == "python" and first["heartbeatTimeout"] == 30
        assert first["key"] == f"{group}/{first['instance']}/head"
        assert len(first["instance"]) == 32
        [pool] = first["pools"]
        assert (pool["queue"], pool["consumerGroup"]) == (queue_name, "billing")
        assert (pool["desired"], pool["running"], pool["busy"]) == (2, 2, 0)
        assert (pool["completed"], pool["failed"]) == (0, 0)

        await client.queue(queue_name).push([{"data": {"n": n}} for n in range(3)])
        await wait_until_async(lambda: len(handled) == 3, 20, "three handled messages")
        # the client publishes every 10 s: the next heartbeat carries the count
        counted = await published(base_url, group,
                                  lambda i: i["pools"] and i["pools"][0]["completed"] == 3)
        assert counted["instance"] == first["instance"] and counted["state"] == "running"
        assert counted["pools"][0]["lastCompletedAt"] is not None
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 30)

    # consume() returns after its last publication (state stopped) was answered
    [done] = await asyncio.to_thread(instances_of, base_url, group)
    assert done["instance"] == first["instance"]
    assert done["status"] == "ok" and done["state"] == "stopped"
    [pool] = done["pools"]
    assert (pool["running"], pool["busy"], pool["completed"], pool["failed"]) == (0, 0, 3, 0)
    head = await client.kv.get(NS, done["key"])
    assert head["found"] and head["value"]["format"] == "queen.supervisor.remote-status/v1"
    assert head["expiresAt"] == done["expiresAt"]  # the client's 60 s TTL, kept as sent


# -- forged and garbage values -----------------------------------------------------------

def _document(instance: str, **fields) -> dict:
    now = int(time.time())
    return {"schema": "queen.consumer.status/v1", "instance_id": instance, "engine": "go",
            "hostname": "forge", "pid": 7, "state": "running", "updated_at_epoch": now,
            "started_at_epoch": now - 5, "uptime_seconds": 5,
            "configuration": {"heartbeat_timeout": 30},
            "pool_status": [{"name": "consumer", "queue": "q", "consumer_group": "g",
                             "desired": 1, "running": 1, "busy": 0, "completed": 4,
                             "failed": 1}], **fields}


def _publication(slot: str, raw: bytes, *, chunks: int = 1, size: int | None = None,
                 write: str | None = None, chunk_write: str | None = None,
                 data: str | None = None, head: object = None) -> list[dict]:
    """The client's two puts of a slot, each part replaceable by a forgery."""
    write = write or uuid.uuid4().hex
    head_value = head if head is not None else {
        "format": "queen.supervisor.remote-status/v1", "write": write, "chunks": chunks,
        "bytes": len(raw) if size is None else size}
    chunk = {"write": chunk_write or write, "index": 0,
             "data": base64.b64encode(raw).decode() if data is None else data}
    return [{"op": "put", "ns": NS, "key": f"{slot}/head", "ttlSeconds": 60,
             "value": head_value},
            {"op": "put", "ns": NS, "key": f"{slot}/chunk/0000", "ttlSeconds": 60,
             "value": chunk}]


def _put(http: httpx.Client, operations: list[dict]) -> None:
    r = http.post("/api/v1/kv", json={"operations": operations})
    assert r.status_code == 200, r.text
    assert all(x["applied"] for x in r.json()["results"]), r.text


def test_forged_and_garbage_publications_are_flagged_never_a_500(http, group):
    """Every way a publication can be wrong, each under its own instance id: the route
    answers 200, lists each with status incomplete or invalid and the problem, decodes the
    good ones, nulls fields of the wrong type or size, and skips keys that are no head."""
    ids = {name: uuid.uuid4().hex for name in (
        "good", "old", "bad_base64", "not_json", "nan", "deep", "not_object", "missing_chunk",
        "other_write", "huge_chunks", "huge_bytes", "short", "head_garbage", "bad_format",
        "wrong_instance", "bad_fields", "big_chunk", "bad_schema", "no_pools")}

    def raw(name: str, **fields) -> bytes:
        return json.dumps(_document(ids[name], **fields)).encode()

    def slot(name: str) -> str:
        return f"{group}/{ids[name]}"

    ops = [
        *_publication(slot("good"), raw("good")),
        *_publication(slot("old"), raw("old", updated_at_epoch=int(time.time()) - 300)),
        *_publication(slot("bad_base64"), b"x", data="!!! not base64 !!!"),
        *_publication(slot("not_json"), b"{this is not json"),
        *_publication(slot("nan"), b'{"schema": "queen.consumer.status/v1", "x": NaN}'),
        *_publication(slot("deep"), b"[" * 40000),
        *_publication(slot("not_object"), b"[1, 2, 3]"),
        *_publication(slot("missing_chunk"), raw("missing_chunk"), chunks=2),
        *_publication(slot("other_write"), raw("other_write"), chunk_write=uuid.uuid4().hex),
        *_publication(slot("huge_chunks"), raw("huge_chunks"), chunks=10**15),
        *_publication(slot("huge_bytes"), raw("huge_bytes"), size=2**62),
        *_publication(slot("short"), raw("short"), size=len(raw("short")) + 10),
        *_publication(slot("head_garbage"), raw("head_garbage"), head="garbage"),
        *_publication(slot("bad_format"), raw("bad_format"), head={"format": "nope/v9"}),
        *_publication(slot("wrong_instance"), raw("good")),
        *_publication(slot("bad_fields"), raw(
            "bad_fields", pid="seven", hostname="\ud800 lone", engine="a\x01b", state="dancing",
            updated_at_epoch=10**30, uptime_seconds=-4, configuration=[],
            pool_status=[{"queue": 5, "desired": 10**30, "running": -1, "busy": True,
                          "completed": 2**60, "failed": 1.5}])),
        *_publication(slot("big_chunk"), b"x", data="A" * 70000),
        *_publication(slot("bad_schema"), raw("bad_schema", schema="something/v1")),
        *_publication(slot("no_pools"), raw("no_pools", pool_status={"a": 1})),
        {"op": "put", "ns": NS, "key": f"{group}/loose-key", "value": 1, "ttlSeconds": 60},
        {"op": "put", "ns": NS, "key": f"{group}/{uuid.uuid4().hex}/chunk/0000",
         "value": {"orphan": True}, "ttlSeconds": 60},
    ]
    _put(http, ops)

    r = http.get(ROUTE, params={"group": group})
    assert r.status_code == 200, r.text
    body = r.json()
    [grouped] = body["groups"]
    found = {i["instance"]: i for i in grouped["instances"]}
    by_name = {name: found.pop(ids[name]) for name in ids}
    assert found == {}  # the loose key and the orphan chunk are no instances

    def verdict(name: str) -> tuple[str, str | None]:
        return by_name[name]["status"], by_name[name]["problem"]

    good = by_name["good"]
    assert verdict("good") == ("ok", None) and good["state"] == "running"
    assert good["stale"] is False and good["hostname"] == "forge" and good["pid"] == 7
    assert good["pools"][0]["completed"] == 4 and good["pools"][0]["failed"] == 1
    old = by_name["old"]
    assert old["status"] == "ok" and old["stale"] is True and old["ageSeconds"] >= 299
    assert verdict("bad_base64") == ("invalid", "chunk 0's data is not base64")
    assert verdict("not_json") == ("invalid", "the document is not JSON")
    assert verdict("nan") == ("invalid", "the document is not JSON")
    assert verdict("deep") == ("invalid", "the document is not JSON")
    assert verdict("not_object") == ("invalid", "the document is not a JSON object")
    assert verdict("missing_chunk") == ("incomplete", "chunk 1 is missing")
    assert verdict("other_write") == ("incomplete", "chunk 0 belongs to another write")
    assert verdict("huge_chunks")[0] == "invalid"
    assert "chunks must be 1 to 24" in verdict("huge_chunks")[1]
    assert "bytes must be 1 to 1048576" in verdict("huge_bytes")[1]
    assert verdict("short")[0] == "invalid" and "the head says" in verdict("short")[1]
    assert verdict("head_garbage") == ("invalid", "the head is not a JSON object")
    assert verdict("bad_format")[0] == "invalid"
    assert "unsupported head format" in verdict("bad_format")[1]
    assert verdict("wrong_instance") == (
        "invalid", "the document's instance_id is not its key's")
    assert verdict("big_chunk") == ("invalid", "chunk 0 is larger than 65536 bytes")
    assert verdict("bad_schema")[0] == "invalid"
    assert verdict("no_pools")[0] == "invalid" and "pool_status" in verdict("no_pools")[1]
    fields = by_name["bad_fields"]
    assert fields["status"] == "ok"
    assert (fields["pid"], fields["hostname"], fields["engine"], fields["state"],
            fields["updatedAt"], fields["uptimeSeconds"], fields["heartbeatTimeout"]) == (
        None, None, None, None, None, None, 30)
    assert fields["pools"] == [{
        "name": None, "queue": None, "namespace": None, "task": None, "consumerGroup": None,
        "desired": None, "running": None, "busy": None, "completed": None, "failed": None,
        "lastCompletedAt": None, "oldestInflightSeconds": None}]
    for name in ids:  # nothing decoded is answered for what did not decode
        if by_name[name]["status"] != "ok":
            assert by_name[name]["pools"] == [] and by_name[name]["state"] is None
    counts = grouped["counts"]
    assert counts == {"instances": len(ids), "running": 1, "stopped": 0, "stale": 1,
                      "problems": len(ids) - 3}
    assert body["keys"]["live"] >= 2 * len(ids) + 2 and body["truncated"] is False
    # the whole namespace, with whatever other tests left there, answers too
    assert http.get(ROUTE).status_code == 200


def test_the_answer_is_bounded_by_its_byte_budget(http, group):
    """Publications whose chunks together pass the answer's 16 MiB budget: the first ones
    decode, the rest are listed as unread and the answer says it is truncated."""
    pad = "p" * 44_500
    ops = []
    for n in range(300):
        instance = f"{n:04d}" + uuid.uuid4().hex[4:]
        raw = json.dumps(_document(instance, pad=pad)).encode()
        assert 44_900 < len(raw) <= 45_000  # the client's largest chunk
        ops += _publication(f"{group}/{instance}", raw)
    for start in range(0, len(ops), 100):
        _put(http, ops[start:start + 100])
    r = http.get(ROUTE, params={"group": group})
    assert r.status_code == 200
    body = r.json()
    statuses = [i["status"] for i in body["groups"][0]["instances"]]
    assert len(statuses) == 300 and body["truncated"] is True
    read = statuses.count("ok")
    assert 250 < read < 300 and statuses == ["ok"] * read + ["unread"] * (300 - read)
    _put(http, [{"op": "delete", "ns": NS, "key": o["key"]} for o in ops])


def test_a_bad_group_parameter_is_a_400(http):
    assert http.get(ROUTE, params={"group": "a/b"}).status_code == 400
    assert http.get(ROUTE, params={"group": "x" * 256}).status_code == 400
    assert http.get(ROUTE, params={"group": ""}).status_code == 200  # no filter


# -- what stays reserved -------------------------------------------------------------------

def test_only_queen_supervisor_is_open_to_clients(http, group):
    """queen-supervisor takes every write like any namespace (and its rules: an expiry is
    required); every other queen- namespace is refused, through the batch, a transaction
    rider and the path-style routes, and lock permits stay the lock routes' own."""
    key = f"{group}/x"
    for ns in ("queen-locks", "queen-other", "queen-", "queen-supervisor2"):
        r = http.post("/api/v1/kv", json={"operations": [
            {"op": "put", "ns": ns, "key": key, "value": 1, "ttlSeconds": 60}]})
        assert (r.status_code, r.json()["error"]) == (400, "kv_namespace_reserved"), ns
        r = http.put(f"/api/v1/kv/{ns}/k", json={"value": 1, "ttlSeconds": 60})
        assert (r.status_code, r.json()["error"]) == (400, "kv_namespace_reserved"), ns
    r = http.post("/api/v1/transaction", json={"operations": [], "kv": [
        {"op": "put", "ns": "queen-locks", "key": "a#0", "value": 1, "forever": True}]})
    assert r.status_code == 400 and r.json()["error"] == "kv_namespace_reserved"

    r = http.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": NS, "key": key, "value": 1}]})
    assert (r.status_code, r.json()["error"]) == (400, "kv_expiry_not_specified")
    r = http.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": NS, "key": key, "value": 1, "ttlSeconds": 60},
        {"op": "incr", "ns": NS, "key": key + "n", "ttlSeconds": 60},
        {"op": "delete", "ns": NS, "key": key}]})
    assert r.status_code == 200 and all(x["applied"] for x in r.json()["results"])
    r = http.put(f"/api/v1/kv/{NS}/{key}", json={"value": 2, "ttlSeconds": 60})
    assert r.status_code == 200 and r.json()["applied"] is True
    r = http.post("/api/v1/transaction", json={"operations": [], "kv": [
        {"op": "put", "ns": NS, "key": key, "value": 3, "ttlSeconds": 60}]})
    assert r.status_code == 200, r.text
    assert http.get(f"/api/v1/kv/{NS}/{key}").json()["value"] == 3
    assert http.delete(f"/api/v1/kv/{NS}/{key}").json()["applied"] is True
