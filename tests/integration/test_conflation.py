"""Conflation: last-value delivery for a consumer group, through the official
client (queen-mq 2.6.0: ``.conflation()`` on pop and consume) and on the wire.

Invariants: a conflating group's pop of a partition delivers only the newest visible message
and never delivers the ones behind it (they are retired: the cursor passes them, counted in
``queen_messages_total{status="conflated"}``); other groups of the queue still get every
message; the policy is the group's, stored at its first pop of the queue, and the stored one
wins over what a later pop declares (``conflationConflict``); every answer of a conflating
pop, empty ones included, says ``conflation: true``; a failed newest message comes back, or
gives way to a newer one.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json

import asyncpg
import httpx
import pytest
from queen import Queen

from tests.integration.test_client_e2e import configure, push

pytestmark = pytest.mark.timeout(60)


async def conflating_pop(client: Queen, queue: str, group: str, *, batch: int = 10,
                         partitions: int = 10, declare: bool = True) -> list[dict]:
    builder = (client.queue(queue).group(group).batch(batch).partitions(partitions)
               .wait(False))
    if declare:
        builder = builder.conflation()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        messages = await builder.pop()
    assert "Pop failed" not in out.getvalue(), out.getvalue()
    return messages


def raw_pop(base_url: str, queue: str, query: str) -> httpx.Response:
    return httpx.get(f"{base_url}/api/v1/pop/queue/{queue}?wait=false&{query}", timeout=10)


def conflated_total(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics/prometheus", timeout=10).text
    for line in text.splitlines():
        if line.startswith('queen_messages_total{status="conflated"}'):
            return float(line.split()[-1])
    return 0.0


async def fill(client: Queen, queue: str, counts: dict[str, int]) -> None:
    for partition, n in counts.items():
        await push(client, queue, [{"transactionId": f"{partition}-{i}", "data": {"i": i}}
                                   for i in range(n)], partition=partition)


async def test_a_conflating_group_gets_the_newest_message_of_each_partition_only(
        client, base_url, queue_name):
    await fill(client, queue_name, {"a": 5, "b": 3})
    before = conflated_total(base_url)
    got = await conflating_pop(client, queue_name, "latest")
    assert sorted(m["transactionId"] for m in got) == ["a-4", "b-2"]
    assert conflated_total(base_url) - before == 4 + 2  # the retired positions
    await client.ack(got, True, {"group": "latest"})
    assert await conflating_pop(client, queue_name, "latest") == []
    # another group of the same queue still gets every message, in order
    every = await conflating_pop(client, queue_name, "all", declare=False, batch=100)
    assert [m["transactionId"] for m in every if m["partition"] == "a"] == [
        f"a-{i}" for i in range(5)]
    assert len(every) == 8


async def test_every_answer_of_a_conflating_pop_says_so_empty_ones_included(
        base_url, queue_name):
    empty = raw_pop(base_url, queue_name, "consumerGroup=g&conflation=true").json()
    assert empty["messages"] == [] and empty["conflation"] is True
    httpx.post(base_url + "/api/v1/push", timeout=10, json={"items": [
        {"queue": queue_name, "partition": "p", "payload": n} for n in range(3)]}
    ).raise_for_status()
    found = raw_pop(base_url, queue_name, "consumerGroup=g&conflation=true&batch=10").json()
    assert [m["data"] for m in found["messages"]] == [2] and found["conflation"] is True
    # a pop of the same group that does not declare it: the stored policy applies
    again = raw_pop(base_url, queue_name, "consumerGroup=g").json()
    assert again["conflation"] is True and again["messages"] == []


async def test_the_stored_policy_wins_over_a_later_declaration(client, base_url, queue_name):
    await fill(client, queue_name, {"p": 3})
    first = raw_pop(base_url, queue_name, "consumerGroup=plain&batch=1").json()
    assert [m["data"]["i"] for m in first["messages"]] == [0] and "conflation" not in first
    httpx.post(base_url + "/api/v1/ack", timeout=10, json={
        "transactionId": "p-0", "partitionId": first["messages"][0]["partitionId"],
        "consumerGroup": "plain", "leaseId": first["leaseId"]}).raise_for_status()
    # the client warns once and keeps consuming, every message (the stored policy)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        got = await conflating_pop(client, queue_name, "plain")
    assert [m["transactionId"] for m in got] == ["p-1", "p-2"]
    assert "conflation conflict" in err.getvalue()
    answer = raw_pop(base_url, queue_name, "consumerGroup=plain&conflation=true").json()
    assert answer.get("conflationConflict") is True and "conflation" not in answer


async def test_a_failed_newest_message_comes_back_or_gives_way_to_a_newer_one(
        client, queue_name):
    await configure(client, queue_name, retry_limit=5)
    await fill(client, queue_name, {"p": 3})
    got = await conflating_pop(client, queue_name, "g")
    assert [m["transactionId"] for m in got] == ["p-2"]
    await client.ack(got, False, {"group": "g"})
    again = await conflating_pop(client, queue_name, "g")
    assert [m["transactionId"] for m in again] == ["p-2"]
    await client.ack(again, False, {"group": "g"})
    await push(client, queue_name, [{"transactionId": "p-new", "data": "newer"}], partition="p")
    newer = await conflating_pop(client, queue_name, "g")
    assert [m["transactionId"] for m in newer] == ["p-new"]
    await client.ack(newer, True, {"group": "g"})
    assert await conflating_pop(client, queue_name, "g") == []


async def test_a_conflating_group_gets_the_newest_visible_message(client, queue_name):
    """Delayed processing: a message not visible yet is neither delivered nor retired; the
    newest visible one is delivered now, the newer one once it is visible."""
    await configure(client, queue_name, delayed_processing=1)
    await fill(client, queue_name, {"p": 2})
    await asyncio.sleep(1.2)  # the queue's delay (1 s) passes for p-0 and p-1
    await push(client, queue_name, [{"transactionId": "p-late", "data": 2}], partition="p")
    got = await conflating_pop(client, queue_name, "g")
    assert [m["transactionId"] for m in got] == ["p-1"]
    await client.ack(got, True, {"group": "g"})
    await asyncio.sleep(1.2)  # p-late becomes visible
    later = await conflating_pop(client, queue_name, "g")
    assert [m["transactionId"] for m in later] == ["p-late"]


async def test_conflation_is_refused_where_it_cannot_apply(base_url, queue_name):
    for query, words in (("conflation=true", "consumerGroup"),
                         ("conflation=true&consumerGroup=g&autoAck=true", "autoAck")):
        answer = raw_pop(base_url, queue_name, query)
        assert answer.status_code == 400 and words in answer.json()["error"], answer.text


async def test_a_discovery_pop_declares_conflation_on_every_queue_it_matches(
        base_url, queue_name):
    namespace = "ns" + queue_name.replace("-", "")
    queues = [f"{namespace}.one", f"{namespace}.two"]
    for q in queues:
        httpx.post(base_url + "/api/v1/push", timeout=10, json={"items": [
            {"queue": q, "partition": "p", "payload": {"q": q, "i": i}} for i in range(3)]}
        ).raise_for_status()
    found = httpx.get(f"{base_url}/api/v1/pop", timeout=10, params={
        "namespace": namespace, "consumerGroup": "g", "conflation": "true", "batch": "10",
        "partitions": "10", "wait": "false"}).json()
    assert found["conflation"] is True
    assert sorted((m["data"]["q"], m["data"]["i"]) for m in found["messages"]) == [
        (queues[0], 2), (queues[1], 2)]
    # a group already stored as plain on one of them: the declaration conflicts
    httpx.get(f"{base_url}/api/v1/pop/queue/{queues[0]}", timeout=10,
              params={"consumerGroup": "plain", "wait": "false"}).raise_for_status()
    mixed = httpx.get(f"{base_url}/api/v1/pop", timeout=10, params={
        "namespace": namespace, "consumerGroup": "plain", "conflation": "true",
        "wait": "false"}).json()
    assert mixed.get("conflationConflict") is True and "conflation" not in mixed


async def test_the_depth_of_a_conflating_group_counts_work_per_partition(
        client, base_url, queue_name):
    await fill(client, queue_name, {"a": 4, "b": 2, "c": 1})
    assert raw_pop(base_url, queue_name, "consumerGroup=g&conflation=true&batch=1"
                   "&partitions=1").json()["conflation"] is True
    depth = httpx.get(f"{base_url}/api/v1/resources/queues/{queue_name}/depth?group=g",
                      timeout=10).json()
    assert depth["conflation"] is True
    assert depth["effectivePending"] == depth["partitionsPending"] == 3
    plain = httpx.get(f"{base_url}/api/v1/resources/queues/{queue_name}/depth?group=other",
                      timeout=10).json()
    assert plain["conflation"] is False and plain["effectivePending"] == plain["pending"] == 7


async def test_deleting_the_group_forgets_its_policy(client, base_url, queue_name):
    await fill(client, queue_name, {"p": 3})
    assert [m["transactionId"] for m in await conflating_pop(client, queue_name, "g")] == ["p-2"]
    gone = httpx.delete(f"{base_url}/api/v1/consumer-groups/g/queues/{queue_name}", timeout=10)
    assert gone.status_code == 200, gone.text
    again = raw_pop(base_url, queue_name, "consumerGroup=g&batch=10").json()
    assert "conflation" not in again
    assert [m["data"]["i"] for m in again["messages"]] == [0, 1, 2]


async def test_a_default_consume_with_conflation_runs_the_handler_on_the_newest(
        base_url, queue_name):
    q = Queen(base_url)
    try:
        await fill(q, queue_name, {"a": 6, "b": 6})
        seen: list[str] = []

        async def handler(message):
            seen.append(message["transactionId"])

        with contextlib.redirect_stdout(io.StringIO()):
            await (q.queue(queue_name).group("g").conflation().batch(10).partitions(2)
                   .limit(2).idle_millis(1500).each().consume(handler))
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()
    assert sorted(seen) == ["a-5", "b-5"]


async def test_a_conflating_stream_maps_only_the_newest_message_of_each_partition(
        base_url, database, queue_name):
    from queen.streams import Stream

    from tests.waiting import wait_until_async

    source, sink = queue_name, queue_name + "-sink"
    q = Queen(base_url)
    conn = await asyncpg.connect(database.dsn)
    sunk = """SELECT m.payload::text FROM queen.messages m
              JOIN queen.partitions p ON p.id = m.partition_id
              JOIN queen.queues qq ON qq.id = p.queue_id WHERE qq.name = $1"""
    try:
        await fill(q, source, {"a": 5, "b": 4})
        runner = await (Stream.from_(q.queue(source)).map(lambda m: {"seen": m["data"]["i"]})
                        .to(q.queue(sink))).run(query_id="latest-" + queue_name, url=base_url,
                                                conflation=True, max_wait_millis=100)
        try:
            async def sunk_two() -> bool:
                return len(await conn.fetch(sunk, sink)) >= 2
            await wait_until_async(sunk_two, 30, "the stream's two sink messages")
        finally:
            await runner.stop()
        rows = sorted(json.loads(r[0])["seen"] for r in await conn.fetch(sunk, sink))
    finally:
        await conn.close()
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()
    assert rows == [3, 4]  # b's newest (i=3) and a's newest (i=4), nothing behind them
