"""The official client's binary bodies, through queen-mq 2.6.0 itself:
``binary_push=True`` sends pushes as QPB1 (with ``push_compression``: zstd-framed groups),
and with both a transaction's pushes go as QTB1 (a JSON head plus framed groups).

Invariants: what the client pushes in a binary body is stored and delivered exactly as the
JSON body would be (payloads, transaction ids, order within a partition, dedup); a
transaction's acks and pushes commit together, and the client's results come back in the
order it added the operations; a damaged body is a 400 and stores nothing.
"""
from __future__ import annotations

import struct

import httpx
import pytest
import ujson
from queen.http.push_binary import PushBatch, encode_push_binary, encode_push_frames

from tests.conftest import official_client
from tests.integration.test_client_e2e import payloads, pop


@pytest.fixture
async def binary_client(base_url):
    async with official_client(base_url, binary_push=True, push_compression=True) as q:
        yield q


BINARY = {"Content-Type": "application/x-queen-push"}


@pytest.mark.parametrize("compression", [False, True], ids=["QPB1", "QPB1-frames"])
async def test_a_binary_push_stores_what_a_json_push_would(base_url, queue_name, compression):
    """Payload types, chosen and minted transaction ids, per-partition order and dedup, as
    the official client sends them with binary_push (and push_compression)."""
    async with official_client(base_url, binary_push=True, push_compression=compression) as client:
        sent = [{"transactionId": "t-1", "data": {"n": 1}},
                {"transactionId": "t-2", "data": [1, "two", None, 3.5]},
                {"data": "no id: the broker or the client mints one"},
                {"transactionId": "t-4", "data": None}]
        first = await client.queue(queue_name).partition("p").push(sent)
        assert [r["status"] for r in first] == ["queued"] * 4, first
        again = await client.queue(queue_name).partition("p").push(
            [{"transactionId": "t-1", "data": "dup"}, {"transactionId": "t-5", "data": 5}])
        assert [r["status"] for r in again] == ["duplicate", "queued"], again
        got = await pop(client, queue_name, batch=10, partition="p")
    assert [g["transactionId"] for g in got][:2] == ["t-1", "t-2"]
    assert [g["transactionId"] for g in got][3:] == ["t-4", "t-5"]
    assert got[2]["transactionId"]  # minted, whoever minted it
    assert payloads(got) == [{"n": 1}, [1, "two", None, 3.5],
                             "no id: the broker or the client mints one", None, 5]
    assert [r["message_id"] for r in first] == [g["id"] for g in got[:4]]


async def test_a_binary_push_with_the_counts_flag_is_answered_with_counts(base_url, queue_name):
    body = bytearray(encode_push_frames([PushBatch(queue_name, "p", [b"1", b"2"], ["a", "b"])]))
    body[4] |= 2  # flag 2: counts
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        r = await http.post("/api/v1/push", content=bytes(body), headers=BINARY)
        assert r.status_code == 200 and r.json() == {
            "count": 2, "queued": 2, "buffered": 0, "duplicate": 0, "error": 0}, r.text
        r = await http.post("/api/v1/push", content=bytes(body), headers=BINARY)
        assert r.json() == {"count": 2, "queued": 0, "buffered": 0, "duplicate": 2, "error": 0}


async def test_a_damaged_binary_push_is_a_400_and_stores_nothing(base_url, queue_name):
    good = encode_push_frames([PushBatch(queue_name, "p", [b'"x"', b'"y"'], ["t1", "t2"])])
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for body in (good[:-1], good[:9], good + b"\x00", b"QPB1\x00" + struct.pack("<I", 1),
                     b'{"items": []}'):
            r = await http.post("/api/v1/push", content=body, headers=BINARY)
            assert r.status_code == 400, (body[:12], r.text)
            assert "Invalid binary body" in r.json()["error"]
        r = await http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"})
        assert r.status_code == 204 or not r.json().get("messages"), r.text
        r = await http.post("/api/v1/push", content=good, headers=BINARY)
        assert [x["status"] for x in r.json()] == ["queued", "queued"], r.text


@pytest.mark.parametrize("encode", [encode_push_binary, encode_push_frames], ids=["QPB1", "frames"])
async def test_a_binary_push_with_a_payload_postgresql_cannot_store_is_a_400_and_stores_nothing(
        base_url, queue_name, encode):
    """A \\u0000 escape, a lone surrogate, NaN, a number past a double: the whole push is refused
    before PostgreSQL sees it, the good payloads beside it (a raw tab in a string, which ujson
    reads and jsonb refuses as written) included."""
    good = [b'{"n":1}', b'"a\tb"']
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for hostile in (b'"a\\u0000b"', b'{"k\\u0000":1}', b'"\\ud800"', b'"\xed\xa0\x80"', b"NaN",
                        b"[1,Infinity]", b"1e400"):
            body = encode([PushBatch(queue_name, "p", [*good, hostile], ["t1", "t2", "t3"])])
            r = await http.post("/api/v1/push", content=body, headers=BINARY)
            assert 400 <= r.status_code < 500, (hostile, r.text)
            assert "items[2].payload" in r.json()["error"], (hostile, r.text)
        r = await http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"})
        assert r.status_code == 204 or not r.json().get("messages"), r.text


@pytest.mark.parametrize("encode", [encode_push_binary, encode_push_frames], ids=["QPB1", "frames"])
async def test_a_payload_jsonb_refuses_as_written_is_stored_as_ujson_read_it(
        base_url, queue_name, encode):
    """ujson reads all of these; PostgreSQL's jsonb refuses the first five as written (a raw
    control character in a string, 01, 1., a bare -), which would fail the statement and queue
    nothing. Each is stored as ujson read it (1e-400 as 0.0), as a JSON push would be."""
    raws = [b'"a\tb"', b'"line\nbreak\x01"', b"01", b"1.", b"-",
            b'{"a":1,"a":2}', b"\t[1,\r\n2]\n", b'"\\ud83d\\ude00"', b"1e-400"]
    body = encode([PushBatch(queue_name, "p", raws, [f"t{i}" for i in range(len(raws))])])
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        r = await http.post("/api/v1/push", content=body, headers=BINARY)
        assert r.status_code == 200 and [x["status"] for x in r.json()] == ["queued"] * len(raws), \
            r.text
    async with official_client(base_url) as client:
        got = await pop(client, queue_name, batch=len(raws), partition="p")
    assert [g["transactionId"] for g in got] == [f"t{i}" for i in range(len(raws))]
    assert payloads(got) == [ujson.loads(raw) for raw in raws]


async def test_a_binary_transaction_acks_and_pushes_in_one_commit(binary_client, queue_name):
    client = binary_client
    out_queue = queue_name + "-out"
    await client.queue(queue_name).push([{"transactionId": "in-1", "data": 1},
                                         {"transactionId": "in-2", "data": 2}])
    [m] = await pop(client, queue_name, batch=1)
    result = await (client.transaction().ack(m)
                    .queue(out_queue).partition("px").push([
                        {"transactionId": "out-1", "data": {"from": "in-1"}},
                        {"transactionId": "out-2", "data": [1, "two", None]}])
                    .commit())
    assert result["success"] is True, result
    # the broker lists the head's ack first and the pushes after it; the client restores
    # the caller's order, which here is the same
    assert [r["type"] for r in result["results"]] == ["ack", "push", "push"]
    assert [r.get("transactionId") for r in result["results"][1:]] == ["out-1", "out-2"]
    [n] = await pop(client, queue_name, batch=1, wait=False)
    assert n["transactionId"] == "in-2"  # the ack committed: the partition moved on
    got = await pop(client, out_queue, batch=10, partition="px")
    assert [g["transactionId"] for g in got] == ["out-1", "out-2"]
    assert payloads(got) == [{"from": "in-1"}, [1, "two", None]]


async def test_a_binary_transaction_whose_pushes_come_first_is_answered_in_the_callers_order(
        binary_client, queue_name):
    client = binary_client
    await client.queue(queue_name).push([{"transactionId": "a", "data": 1}])
    [m] = await pop(client, queue_name, batch=1)
    result = await (client.transaction().queue(queue_name + "-o").push(
        [{"transactionId": "p1", "data": 1}]).ack(m).commit())
    assert result["success"] is True, result
    assert [r["type"] for r in result["results"]] == ["push", "ack"]
    assert [r["index"] for r in result["results"]] == [0, 1]


async def test_a_damaged_binary_transaction_is_a_400_and_stores_nothing(base_url, queue_name):
    good = bytearray(b"QTB1" + bytes([0]) + struct.pack("<I", 2) + b"{}"
                     + encode_push_frames([PushBatch(queue_name, "p", [b'"x"'], ["t1"])])[5:])
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for body in (bytes(good[:-3]), b"QTB1\x00" + struct.pack("<I", 99) + b"{}",
                     bytes(good[:5]) + struct.pack("<I", 2) + b"[]" + bytes(good[11:])):
            r = await http.post("/api/v1/transaction", content=body,
                                headers={"Content-Type": "application/x-queen-push"})
            assert r.status_code == 400, r.text
            assert "Invalid binary body" in r.json()["error"] or "head" in r.json()["error"]
        r = await http.get(f"/api/v1/pop/queue/{queue_name}", params={"wait": "false"})
        assert r.status_code in (200, 204) and not (r.content and r.json().get("messages"))
        # the undamaged body commits
        r = await http.post("/api/v1/transaction", content=bytes(good),
                            headers={"Content-Type": "application/x-queen-push"})
        assert r.status_code == 200 and r.json()["success"] is True, r.text


async def test_the_clients_buffered_binary_producer_flushes_through(base_url, queue_name):
    """queue(...).buffer(...).push(...) with binary_push: the buffered batches go out as QPB1
    bodies when flushed, and every message arrives once, in order."""
    async with official_client(base_url, binary_push=True, push_compression=True) as client:
        q = client.queue(queue_name).partition("b").buffer(
            {"message_count": 50, "time_millis": 60_000})
        for n in range(120):
            await q.push([{"transactionId": f"m{n}", "data": n}])
        await client.flush_all_buffers()
        got = []
        while len(got) < 120:
            batch = await pop(client, queue_name, batch=100, partition="b")
            assert batch, f"{len(got)} of 120 arrived"
            got += batch
            await client.ack(batch, True)
    assert [g["transactionId"] for g in got] == [f"m{n}" for n in range(120)]
    assert payloads(got) == list(range(120))
