"""Framed pops: a pop with ``frames=true`` that finds messages is answered
as QPF1 frames, which the official client (queen-mq 2.6.0, ``framed_pop=True``) unpacks; its
partitions are named by u64 handles, which every ack route takes.

Invariants: a framed pop delivers exactly what a JSON pop would (ids, transaction ids,
payloads, trace ids, order, lease), encrypted queues included; a message acked by its handle
is acked (not delivered again), on /ack, /ack/batch and /transaction, and traced by it; a
handle no partition has is a "not found" verdict, never a 500; a malformed one is a 400.
"""
from __future__ import annotations

import uuid

import asyncpg
import httpx
import pytest
from queen.http.pop_frames import decode_pop_frames, is_pop_frames

from tests.conftest import official_client
from tests.integration.streams_worker import pipeline
from tests.integration.test_client_e2e import configure, expect_empty, pop, push
from tests.integration.test_streams_sdk import SINK_SQL, feed, make_events, windows_of
from tests.waiting import wait_until_async

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def framed(base_url):
    async with official_client(base_url, framed_pop=True) as q:
        yield q


def framed_get(base_url: str, path: str) -> httpx.Response:
    return httpx.get(base_url + path + ("&" if "?" in path else "?") + "frames=true", timeout=10)


def store_two_partitions(client_url: str, queue: str) -> None:
    items = [{"queue": queue, "partition": p, "transactionId": f"{p}-{n}",
              "payload": {"p": p, "n": n, "text": "ünïcødé \u2028 \"quoted\""}}
             for p in ("a", "b") for n in range(3)]
    items[0]["traceId"] = "0190b7f2-6c3e-7d2a-9a41-3f5e8d1c2b7a"
    answer = httpx.post(client_url + "/api/v1/push", json={"items": items}, timeout=10)
    assert answer.status_code == 200, answer.text


async def test_a_framed_pop_delivers_what_a_json_pop_would(base_url, queue_name):
    store_two_partitions(base_url, queue_name)
    path = f"/api/v1/pop/queue/{queue_name}?batch=10&partitions=2&wait=false&consumerGroup=g"
    json_answer = httpx.get(base_url + path.replace("consumerGroup=g", "consumerGroup=j"),
                            timeout=10).json()
    answer = framed_get(base_url, path)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/x-queen-pop"
    assert is_pop_frames(answer.content)
    got = decode_pop_frames(answer.content)
    mine = got["messages"]
    theirs = json_answer["messages"]
    assert [m["transactionId"] for m in mine] == [m["transactionId"] for m in theirs]
    assert [m["id"] for m in mine] == [m["id"] for m in theirs]
    assert [m["data"] for m in mine] == [m["data"] for m in theirs]
    assert [m["traceId"] for m in mine] == [m["traceId"] for m in theirs]
    assert [m["partition"] for m in mine] == [m["partition"] for m in theirs]
    assert [m["createdAt"][:23] for m in mine] == [m["createdAt"][:23] for m in theirs]
    assert got["partitionsClaimed"] == 2 and got["consumerGroup"] == "g"
    assert uuid.UUID(got["leaseId"])
    # one handle per partition, decimal, and the offsets are the positions 1..3
    handles = {m["partition"]: m["partitionId"] for m in mine}
    assert len(set(handles.values())) == 2 and all(h.isdigit() for h in handles.values())
    assert [m["offset"] for m in mine] == [1, 2, 3, 1, 2, 3]
    assert {m["deliveryAttempt"] for m in mine} == {1}


async def test_messages_popped_framed_through_the_client_are_acked_by_their_handles(
        framed, queue_name):
    await push(framed, queue_name, [{"transactionId": f"t{n}", "data": {"n": n}}
                                    for n in range(5)], partition="p")
    got = await pop(framed, queue_name, batch=2, wait=False)
    assert [m["transactionId"] for m in got] == ["t0", "t1"]
    assert got[0]["partitionId"].isdigit()
    single = await framed.ack(got[0], True)
    assert single["success"] is True, single
    batch = await framed.ack([got[1]], True)
    assert batch["success"] is True, batch
    more = await pop(framed, queue_name, batch=2, wait=False)
    assert [m["transactionId"] for m in more] == ["t2", "t3"]
    done = await framed.transaction().ack(more).queue(queue_name).partition("p").push(
        [{"transactionId": "t-next", "data": "in the same commit"}]).commit()
    assert done["success"] is True, done
    rest = await pop(framed, queue_name, batch=10, wait=False)
    assert [m["transactionId"] for m in rest] == ["t4", "t-next"]  # nothing acked came back
    await framed.ack(rest, True)
    await expect_empty(framed, queue_name)


async def test_a_framed_pop_of_an_encrypted_queue_is_decrypted(framed, queue_name):
    await configure(framed, queue_name, encryption_enabled=True)
    secret = {"card": "4111-1111-1111-1111", "amount": 12.5}
    await push(framed, queue_name, [{"transactionId": "enc", "data": secret}])
    got = await pop(framed, queue_name, batch=5, wait=False)
    assert [(m["transactionId"], m["data"]) for m in got] == [("enc", secret)]


async def test_an_autopilot_pop_echoes_its_sizing_inside_the_frame(base_url, queue_name):
    store_two_partitions(base_url, queue_name)
    answer = framed_get(base_url, f"/api/v1/pop/queue/{queue_name}?autopilot=true&wait=false")
    got = decode_pop_frames(answer.content)
    assert got["messages"], got
    sizing = got["autopilot"]
    assert sizing["batch"] >= 1 and sizing["partitions"] >= 1 and sizing["waitMs"] == 0


async def test_an_empty_framed_pop_is_answered_as_json(base_url, queue_name):
    answer = framed_get(base_url, f"/api/v1/pop/queue/{queue_name}?wait=false&autopilot=true")
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["messages"] == [] and "autopilot" in answer.json()


async def test_a_discovery_pop_across_queues_is_answered_as_json(base_url, queue_name):
    namespace = "ns-" + queue_name
    for q in (queue_name + "-x", queue_name + "-y"):
        created = httpx.post(base_url + "/api/v1/configure",
                             json={"queue": q, "namespace": namespace}, timeout=10)
        assert created.status_code == 200, created.text
        httpx.post(base_url + "/api/v1/push", timeout=10, json={
            "items": [{"queue": q, "partition": "p", "payload": q}]}).raise_for_status()
    answer = framed_get(base_url, f"/api/v1/pop?namespace={namespace}&batch=10&partitions=4"
                                  "&wait=false")
    assert answer.headers["content-type"].startswith("application/json")
    assert sorted(m["data"] for m in answer.json()["messages"]) == [queue_name + "-x",
                                                                    queue_name + "-y"]


async def test_a_consumers_trace_names_the_partition_by_its_handle(base_url, queue_name):
    store_two_partitions(base_url, queue_name)
    got = decode_pop_frames(framed_get(
        base_url, f"/api/v1/pop/queue/{queue_name}/partition/a?batch=1&wait=false").content)
    message = got["messages"][0]
    traced = httpx.post(base_url + "/api/v1/traces", timeout=10, json={
        "transactionId": message["transactionId"], "partitionId": message["partitionId"],
        "data": {"step": "seen"}})
    assert traced.status_code == 201, traced.text
    unknown = httpx.post(base_url + "/api/v1/traces", timeout=10, json={
        "transactionId": message["transactionId"], "partitionId": "18446744073709551615",
        "data": {"step": "seen"}})
    assert unknown.status_code == 404, unknown.text


@pytest.mark.parametrize("handle", ["0", "9223372036854775807", "9223372036854775808",
                                    "18446744073709551615"])
async def test_an_ack_by_a_handle_no_partition_has_is_not_found(base_url, queue_name, handle):
    answer = httpx.post(base_url + "/api/v1/ack/batch", timeout=10, json={"acknowledgments": [
        {"transactionId": "t", "partitionId": handle, "status": "completed"}]})
    assert answer.status_code == 200, answer.text
    assert answer.json()[0]["success"] is False


@pytest.mark.parametrize("handle", ["18446744073709551616", "-1", "1.5", "١٢", " 12"])
async def test_an_ack_by_a_malformed_handle_is_a_400(base_url, handle):
    for path, body in (("/api/v1/ack", {"transactionId": "t", "partitionId": handle}),
                       ("/api/v1/ack/batch", {"acknowledgments": [
                           {"transactionId": "t", "partitionId": handle}]})):
        answer = httpx.post(base_url + path, json=body, timeout=10)
        assert answer.status_code == 400, (path, answer.text)
        assert "partitionId" in answer.json()["error"]


async def test_a_stream_whose_client_pops_framed_commits_its_cycles_by_handle(
        base_url, database, queue_name):
    """The streaming SDK keys its cycles and state reads by the popped messages'
    partitionId: a handle after a framed pop. Every closed window reaches the sink once with
    its sum, and the source group's cursor ends at every partition's end."""
    source, sink, query = queue_name, queue_name + "-sink", "framed-" + queue_name
    events, expected = make_events(seed=7)
    with httpx.Client(base_url=base_url, timeout=10) as http:
        feed(http, source, events)
    conn = await asyncpg.connect(database.dsn)

    async def done() -> bool:
        consumed = await conn.fetchval(CONSUMED_SQL, source, "streams." + query)
        return bool(consumed) and len(await conn.fetch(SINK_SQL, sink)) >= len(expected)

    try:
        async with official_client(base_url, framed_pop=True) as q:
            runner = await pipeline(q, source, sink).run(query_id=query, url=base_url,
                                                         batch_size=5, max_partitions=1,
                                                         max_wait_millis=100)
            try:
                await wait_until_async(done, 60, "the stream to consume its source")
            finally:
                await runner.stop()
        got = windows_of(await conn.fetch(SINK_SQL, sink))
    finally:
        await conn.close()
    assert sorted(got) == sorted((k, s, v) for (k, s), v in expected.items())


CONSUMED_SQL = """SELECT bool_and(coalesce(l.cursor_seq, 0) = p.last_seq)
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    LEFT JOIN queen.log_consumers l ON l.partition_id = p.id AND l.consumer_group = $2
    WHERE q.name = $1"""
