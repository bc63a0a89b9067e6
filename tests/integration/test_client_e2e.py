"""End-to-end tests through the official Python client (queen-mq 2.6.0).

Every test drives a real broker process on a real PostgreSQL through ``queen.Queen``
(push/pop/ack/consume/transaction/renew/DLQ builders). Direct asyncpg reads are used only
to inspect what was stored (encryption at rest, transaction atomicity); nothing is mocked.

Each test's docstring names the invariant it checks (docs/wire-contract.md §0 and §3–§9).
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from queen import Queen

pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------------------



async def configure(client: Queen, queue: str, **options) -> dict:
    """queue(...).config({...}).create(): raises on an in-band error."""
    result = await client.queue(queue).config(options).create()
    assert isinstance(result, dict) and result.get("configured") is True, result
    return result


async def push(client: Queen, queue: str, items, partition: str | None = None) -> list[dict]:
    builder = client.queue(queue)
    if partition is not None:
        builder = builder.partition(partition)
    results = await builder.push(items)
    assert isinstance(results, list), results
    return results


async def pop(client: Queen, queue: str, *, group: str | None = None, batch: int = 10,
              wait: bool = True, timeout_ms: int = 2000, partition: str | None = None,
              subscription_mode: str | None = None,
              subscription_from: str | None = None,
              partitions: int | None = None) -> list[dict]:
    """Pop through the client's pop() builder.

    QueueBuilder.pop() swallows every error into ``[]`` and prints ``Pop failed: …``; an
    empty answer must really mean "nothing available", so a swallowed error fails the test.
    """
    b = client.queue(queue).batch(batch).wait(wait).timeout_millis(timeout_ms)
    if group:
        b = b.group(group)
    if partition:
        b = b.partition(partition)
    if subscription_mode:
        b = b.subscription_mode(subscription_mode)
    if subscription_from:
        b = b.subscription_from(subscription_from)
    if partitions:
        b = b.partitions(partitions)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        messages = await b.pop()
    assert "Pop failed" not in out.getvalue(), out.getvalue()
    return messages


async def expect_empty(client: Queen, queue: str, **kw) -> None:
    kw.setdefault("wait", False)
    messages = await pop(client, queue, **kw)
    assert messages == [], [m.get("transactionId") for m in messages]


def payloads(messages: list[dict]) -> list:
    return [m["data"] for m in messages]


def utc_iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


async def drain(client: Queen, queue: str, *, group: str | None = None, batch: int = 10,
                expected: int | None = None) -> list[dict]:
    """Pop + ack until the queue yields nothing for this group."""
    seen: list[dict] = []
    ctx = {"group": group} if group else None
    while True:
        msgs = await pop(client, queue, group=group, batch=batch, wait=expected is not None
                         and len(seen) < expected, timeout_ms=2000)
        if not msgs:
            return seen
        seen.extend(msgs)
        res = await client.ack(msgs, True, ctx)
        assert res["success"] is True, res


# -- 1. push / pop / ack -----------------------------------------------------------------------

async def test_push_pop_ack_round_trip_preserves_payloads(client, queue_name):
    """Pushed dict/list/scalar/null payloads come back verbatim in `data`, in push order, with
    the client's transactionIds; acking them completes the messages (nothing left to pop)."""
    values = [{"a": 1, "nested": {"b": [1, 2, {"c": None}]}}, [1, "two", 3.5, False], 42,
              "plain string", None, True, 0, {"unicode": "héllo ✓"}]
    txids = [f"tx-{i}" for i in range(len(values))]
    results = await push(client, queue_name,
                         [{"transactionId": t, "data": v} for t, v in zip(txids, values)])
    assert [r["status"] for r in results] == ["queued"] * len(values)
    assert [r["transaction_id"] for r in results] == txids
    assert all(r.get("message_id") for r in results)

    msgs = await pop(client, queue_name, batch=len(values) + 5)
    assert payloads(msgs) == values
    assert [m["transactionId"] for m in msgs] == txids
    for m in msgs:
        assert m["partition"] == "Default"
        assert m["leaseId"] and m["partitionId"]
        assert m["consumerGroup"] == "__QUEUE_MODE__"

    # single-message ack, then the rest as a batch ack
    first = await client.ack(msgs[0])
    assert first["success"] is True, first
    rest = await client.ack(msgs[1:], True)
    assert rest["success"] is True, rest
    await expect_empty(client, queue_name)

    # acking an already-completed message answers success again ("Observed on the wire")
    again = await client.ack({k: msgs[0][k] for k in ("transactionId", "partitionId")})
    assert again["success"] is True, again


async def test_pop_named_partition_route_and_batch_nack_redelivers_whole_batch_once(
        client, queue_name):
    """A pop on a named partition (partition route) returns only that partition's messages in
    order; nacking the whole batch (ack(list, False), what consume() does when a batch handler
    raises) leaves all of them pending, counts ONE retry (retryLimit=1 does not dead-letter
    anything yet) and they are delivered again."""
    await configure(client, queue_name, retry_limit=1)
    await push(client, queue_name, [{"data": {"p": "a", "i": i}} for i in range(3)], partition="a")
    await push(client, queue_name, [{"data": {"p": "b", "i": i}} for i in range(3)], partition="b")
    msgs = await pop(client, queue_name, partition="b")
    assert payloads(msgs) == [{"p": "b", "i": i} for i in range(3)]
    assert {m["partition"] for m in msgs} == {"b"}
    await client.ack(msgs, False)  # answer checked in test_batch_nack_accepts_every_item
    assert (await client.queue(queue_name).dlq().get())["messages"] == []
    again = await pop(client, queue_name, partition="b")
    assert [m["transactionId"] for m in again] == [m["transactionId"] for m in msgs]
    assert (await client.ack(again))["success"] is True
    await expect_empty(client, queue_name, partition="b")
    assert payloads(await pop(client, queue_name, partition="a")) == [
        {"p": "a", "i": i} for i in range(3)]


async def test_batch_nack_accepts_every_item(client, queue_name):
    """ack(list, False) on a whole popped batch is accepted item by item: the items after the
    first belong to the batch the first nack already sent back, they are not acks under a
    foreign or expired lease (otherwise the client reports the nack as rejected)."""
    await push(client, queue_name, [{"data": i} for i in range(3)])
    msgs = await pop(client, queue_name, batch=3)
    assert len(msgs) == 3
    nack = await client.ack(msgs, False)
    assert nack["success"] is True, nack
    assert [r["success"] for r in nack["results"]] == [True, True, True]


# -- 2. consume() ------------------------------------------------------------------------------

async def test_consume_batches_hand_lists_and_stop_at_limit(client, queue_name):
    """consume() with batch>1 hands the handler lists (each ≤ batch), auto-acks them, and a
    limit stops the loop once that many messages were processed; every message is seen once."""
    n = 25
    await push(client, queue_name, [{"data": i} for i in range(n)])
    calls: list[list] = []

    async def handler(batch):
        assert isinstance(batch, list)
        calls.append([m["data"] for m in batch])

    await asyncio.wait_for(
        client.queue(queue_name).batch(10).limit(n).timeout_millis(1000).consume(handler), 20)
    assert all(1 <= len(c) <= 10 for c in calls), calls
    assert [x for c in calls for x in c] == list(range(n))
    await expect_empty(client, queue_name)  # all auto-acked


async def test_consume_batch_one_and_each_hand_single_messages_and_idle_stops(client, queue_name):
    """batch(1) and each() hand the handler single message dicts; idle_millis ends the loop
    once the queue is drained; auto-ack completes everything."""
    await push(client, queue_name, [{"data": i} for i in range(6)])
    got_single: list = []

    async def single(msg):
        assert isinstance(msg, dict)
        got_single.append(msg["data"])

    await asyncio.wait_for(
        client.queue(queue_name).batch(1).limit(3).timeout_millis(1000).consume(single), 20)
    assert got_single == [0, 1, 2]

    got_each: list = []

    async def each(msg):
        assert isinstance(msg, dict)
        got_each.append(msg["data"])

    await asyncio.wait_for(
        client.queue(queue_name).batch(5).each().idle_millis(1500).timeout_millis(500)
        .consume(each), 20)
    assert got_each == [3, 4, 5]
    await expect_empty(client, queue_name)


async def test_consume_handler_error_nacks_and_message_is_redelivered(client, queue_name):
    """A handler exception under auto-ack nacks the message; it is redelivered (retry budget
    not exhausted) and the later messages of the partition follow it in order."""
    await configure(client, queue_name, retry_limit=3)
    await push(client, queue_name, [{"transactionId": f"m{i}", "data": i} for i in range(4)])
    seen: list[str] = []
    failed_once: set[str] = set()

    async def handler(msg):
        seen.append(msg["transactionId"])
        if msg["transactionId"] == "m1" and "m1" not in failed_once:
            failed_once.add("m1")
            raise RuntimeError("transient")

    await asyncio.wait_for(
        client.queue(queue_name).batch(4).each().idle_millis(1500).timeout_millis(500)
        .consume(handler), 20)
    # m1 failed once and came back, followed again by m2, m3 (everything after the nack).
    assert seen == ["m0", "m1", "m1", "m2", "m3"], seen
    await expect_empty(client, queue_name)


# -- 3. consumer groups --------------------------------------------------------------------------

async def test_consumer_groups_fan_out_every_message_to_every_group(client, queue_name):
    """Two consumer groups each receive every message, in order, independently of each other
    and of queue mode (docs/wire-contract.md §3, rule 2)."""
    await push(client, queue_name, [{"data": i} for i in range(12)])
    g1 = await drain(client, queue_name, group="g1", batch=5, expected=12)
    g2 = await drain(client, queue_name, group="g2", batch=7, expected=12)
    assert payloads(g1) == list(range(12))
    assert payloads(g2) == list(range(12))
    assert all(m["consumerGroup"] == "g1" for m in g1)
    # queue mode is one more independent cursor: still sees everything
    qm = await drain(client, queue_name, batch=12, expected=12)
    assert payloads(qm) == list(range(12))
    # a group that acked everything gets nothing more; a new push reaches both groups
    await expect_empty(client, queue_name, group="g1")
    await push(client, queue_name, [{"data": "late"}])
    assert payloads(await drain(client, queue_name, group="g1", expected=1)) == ["late"]
    assert payloads(await drain(client, queue_name, group="g2", expected=1)) == ["late"]


async def test_queue_mode_competing_consumers_share_without_overlap(client, queue_name):
    """Queue mode: two concurrent consume() loops compete for one shared cursor — together they
    process every message exactly once, and the work is actually shared
    (docs/wire-contract.md §3, rules 2 and 3)."""
    parts = [f"p{i}" for i in range(4)]
    for p in parts:
        await push(client, queue_name, [{"data": f"{p}-{i}"} for i in range(10)], partition=p)
    seen: dict[str, list[str]] = {"A": [], "B": []}

    def handler_for(name):
        async def handler(batch):
            for m in batch:
                seen[name].append(m["data"])
            await asyncio.sleep(0.05)  # hold the lease a little so the other worker gets work
        return handler

    await asyncio.wait_for(asyncio.gather(*[
        client.queue(queue_name).batch(2).idle_millis(2000).timeout_millis(500)
        .consume(handler_for(name)) for name in ("A", "B")]), 40)
    everything = seen["A"] + seen["B"]
    assert sorted(everything) == sorted(f"{p}-{i}" for p in parts for i in range(10))
    assert len(everything) == len(set(everything)), "a message was delivered to both workers"
    assert seen["A"] and seen["B"], {k: len(v) for k, v in seen.items()}


# -- 4. subscription modes -----------------------------------------------------------------------

async def test_subscription_mode_new_skips_history_but_gets_later_messages(client, queue_name):
    """subscription_mode('new'): a group joining after messages exist does not receive them,
    but receives everything pushed after its first pop; mode 'all' (default) gets history."""
    await push(client, queue_name, [{"data": f"old-{i}"} for i in range(3)])
    await asyncio.sleep(0.05)
    await expect_empty(client, queue_name, group="g-new", subscription_mode="new")
    await push(client, queue_name, [{"data": f"new-{i}"} for i in range(2)])
    got = await pop(client, queue_name, group="g-new", subscription_mode="new")
    assert payloads(got) == ["new-0", "new-1"]
    assert (await client.ack(got, True, {"group": "g-new"}))["success"] is True

    hist = await pop(client, queue_name, group="g-all", subscription_mode="all")
    assert payloads(hist) == ["old-0", "old-1", "old-2", "new-0", "new-1"]


async def test_subscription_mode_new_applies_to_partitions_created_later(client, queue_name):
    """A 'new' group that joined before a partition existed still receives that partition's
    messages (they were all pushed after it joined)."""
    await push(client, queue_name, [{"data": "old"}], partition="p1")
    await asyncio.sleep(0.05)
    await expect_empty(client, queue_name, group="g-new", subscription_mode="new")
    await push(client, queue_name, [{"data": "fresh"}], partition="p2")
    got = await pop(client, queue_name, group="g-new", subscription_mode="new")
    assert payloads(got) == ["fresh"]


async def test_subscription_from_timestamp_starts_at_that_instant(client, queue_name):
    """subscription_from(<ISO timestamp>): the group receives only messages created after the
    instant; another group without it receives the full history."""
    await push(client, queue_name, [{"data": f"before-{i}"} for i in range(3)])
    await asyncio.sleep(0.4)
    ts = utc_iso(datetime.now(UTC))
    await asyncio.sleep(0.4)
    await push(client, queue_name, [{"data": f"after-{i}"} for i in range(2)])
    got = await pop(client, queue_name, group="g-ts", subscription_from=ts)
    assert payloads(got) == ["after-0", "after-1"]
    all_ = await pop(client, queue_name, group="g-hist")
    assert payloads(all_) == ["before-0", "before-1", "before-2", "after-0", "after-1"]
    # a timestamp far in the past is the same as "all"
    past = utc_iso(datetime.now(UTC) - timedelta(days=1))
    assert len(await pop(client, queue_name, group="g-past", subscription_from=past)) == 5


# -- 5. leases -----------------------------------------------------------------------------------

async def test_renewed_lease_outlives_original_expiry(client, queue_name):
    """client.renew() (empty-body POST /lease/{id}/extend) extends the lease: after the queue's
    2 s leaseTime has passed, the partition is still held (no other pop of the group gets it)
    and the original holder's ack is accepted."""
    await configure(client, queue_name, lease_time=2)
    await push(client, queue_name, [{"transactionId": "held", "data": 1}])
    [msg] = await pop(client, queue_name, batch=1)
    renewed = await client.renew(msg)
    assert renewed["success"] is True, renewed
    assert renewed["newExpiresAt"], renewed
    await asyncio.sleep(3.0)  # well past the original 2 s expiry
    await expect_empty(client, queue_name)
    ack = await client.ack(msg)  # carries the leaseId: must still be the live lease
    assert ack["success"] is True, ack
    await expect_empty(client, queue_name)


async def test_one_renew_extends_every_partition_of_a_multi_partition_pop(client, queue_name):
    """A consumer-group pop with partitions(2) claims both partitions under one leaseId; one
    renew() keeps both held past the 2 s leaseTime (partition-route pops of the same group get
    nothing) and the holder's acks are then accepted."""
    await configure(client, queue_name, lease_time=2)
    await push(client, queue_name, [{"data": "one"}], partition="p1")
    await push(client, queue_name, [{"data": "two"}], partition="p2")
    msgs = await pop(client, queue_name, group="g", batch=10, partitions=2)
    assert sorted(m["partition"] for m in msgs) == ["p1", "p2"]
    assert len({m["leaseId"] for m in msgs}) == 1
    renewed = await client.renew(msgs)
    assert len(renewed) == 1 and renewed[0]["success"] is True, renewed
    await asyncio.sleep(3.0)
    await expect_empty(client, queue_name, group="g", partition="p1")
    await expect_empty(client, queue_name, group="g", partition="p2")
    await expect_empty(client, queue_name, group="g")
    ack = await client.ack(msgs, True, {"group": "g"})
    assert ack["success"] is True, ack


async def test_renew_by_lease_id_and_list_forms(client, queue_name):
    """renew() accepts a leaseId string and a list of messages (one result per distinct lease);
    an unknown lease reports success False."""
    await configure(client, queue_name, lease_time=30)
    await push(client, queue_name, [{"data": i} for i in range(3)])
    msgs = await pop(client, queue_name, batch=3)
    assert len({m["leaseId"] for m in msgs}) == 1
    by_id = await client.renew(msgs[0]["leaseId"])
    assert by_id["success"] is True, by_id
    as_list = await client.renew(msgs)
    assert isinstance(as_list, list) and len(as_list) == 1 and as_list[0]["success"] is True
    unknown = await client.renew(str(uuid.uuid4()))
    assert unknown["success"] is False, unknown


async def test_expired_lease_redelivers_same_message_and_fences_old_lease(client, queue_name):
    """Without renewal, the lease expires after leaseTime: the next pop redelivers the same
    message under a new leaseId; renewing or acking with the expired lease is refused."""
    await configure(client, queue_name, lease_time=1)
    await push(client, queue_name, [{"transactionId": "slow", "data": {"x": 1}}])
    [first] = await pop(client, queue_name, batch=1)
    await expect_empty(client, queue_name)  # held while the lease lives
    await asyncio.sleep(2.0)
    renew_late = await client.renew(first)
    assert renew_late["success"] is False, renew_late
    [again] = await pop(client, queue_name, batch=1)
    assert again["transactionId"] == "slow" and again["data"] == {"x": 1}
    assert again["leaseId"] != first["leaseId"]
    stale = await client.ack(first)
    assert stale["success"] is False, f"ack with an expired lease was accepted: {stale}"
    fresh = await client.ack(again)
    assert fresh["success"] is True, fresh
    await expect_empty(client, queue_name)


# -- 6. retries and DLQ --------------------------------------------------------------------------

async def test_nacked_message_retried_retry_limit_times_then_dead_lettered(client, queue_name):
    """With retryLimit=2 a repeatedly nacked message is delivered 1 + 2 times, then lands in the
    DLQ (visible through the client's dlq() builder with its data and error) and is never
    delivered to that group again; other groups are unaffected."""
    await configure(client, queue_name, retry_limit=2)
    await push(client, queue_name, [{"transactionId": "poison", "data": {"bad": True}}])
    deliveries = 0
    last = None
    for attempt in range(6):
        msgs = await pop(client, queue_name, group="workers", batch=1,
                         wait=attempt < 3, timeout_ms=2000)
        if not msgs:
            break
        assert msgs[0]["transactionId"] == "poison"
        deliveries += 1
        last = await client.ack(msgs[0], False, {"group": "workers", "error": f"boom-{attempt}"})
        assert last["success"] is True, last
    assert deliveries == 3, deliveries
    assert last.get("dlq") is True, last
    await expect_empty(client, queue_name, group="workers")

    dlq = await client.queue(queue_name).dlq("workers").get()
    assert [m["transactionId"] for m in dlq["messages"]] == ["poison"], dlq
    entry = dlq["messages"][0]
    assert entry["data"] == {"bad": True}
    assert entry["consumerGroup"] == "workers"
    assert entry["errorMessage"] == "boom-2"
    assert dlq.get("total") == 1, dlq  # 2.6 reads `total` (docs/wire-contract.md §12.1)

    # the same message is still live for another group
    other = await pop(client, queue_name, group="auditors")
    assert [m["transactionId"] for m in other] == ["poison"]
    assert (await client.queue(queue_name).dlq("auditors").get())["messages"] == []


async def test_retry_budget_is_per_message_after_a_dead_letter(client, queue_name):
    """After a message is dead-lettered, the next message of the partition gets its own full
    retry budget (docs/wire-contract.md §6.3: reset the counter when the cursor passes a DLQ'd
    message)."""
    await configure(client, queue_name, retry_limit=1)
    await push(client, queue_name, [{"transactionId": "m1", "data": 1},
                                    {"transactionId": "m2", "data": 2}])
    for _ in range(2):
        [m] = await pop(client, queue_name, batch=1)
        assert m["transactionId"] == "m1"
        await client.ack(m, False)
    [m] = await pop(client, queue_name, batch=1)
    assert m["transactionId"] == "m2"
    first_failure = await client.ack(m, False)
    assert first_failure.get("dlq") is False, f"m2 dead-lettered on its first failure: {first_failure}"
    [again] = await pop(client, queue_name, batch=1)
    assert again["transactionId"] == "m2"
    assert (await client.ack(again))["success"] is True
    dlq = await client.queue(queue_name).dlq().get()
    assert [x["transactionId"] for x in dlq["messages"]] == ["m1"]


async def test_dlq_via_http_lists_dead_letters(client, queue_name, base_url):
    """GET /api/v1/dlq?queue= lists a message dead-lettered by ack status 'dlq' (the raw
    route the client's dlq() builder uses)."""
    await push(client, queue_name, [{"transactionId": "x", "data": "payload"}])
    [m] = await pop(client, queue_name, batch=1)
    res = await client.ack(m, "dlq", {"error": "rejected"})
    assert res["success"] is True and res.get("dlq") is True, res
    async with httpx.AsyncClient(base_url=base_url) as http:
        r = await http.get("/api/v1/dlq", params={"queue": queue_name})
    assert r.status_code == 200
    body = r.json()
    assert [x["transactionId"] for x in body["messages"]] == ["x"]
    assert body["messages"][0]["errorMessage"] == "rejected"
    await expect_empty(client, queue_name)


# -- 7. dedup ------------------------------------------------------------------------------------

async def test_duplicate_transaction_id_is_reported_and_delivered_once(client, queue_name):
    """Re-pushing a transactionId (across requests and within one request) is answered with
    status 'duplicate' and the original message_id; only the first copy is ever delivered."""
    [first] = await push(client, queue_name, [{"transactionId": "dup-1", "data": "original"}])
    assert first["status"] == "queued"
    dup_cb: list = []

    async def on_dup(items, _err):
        dup_cb.extend(items)

    second = await client.queue(queue_name).push(
        [{"transactionId": "dup-1", "data": "copy"}]).on_duplicate(on_dup)
    assert second[0]["status"] == "duplicate"
    assert second[0]["message_id"] == first["message_id"]
    assert len(dup_cb) == 1

    within = await push(client, queue_name, [{"transactionId": "dup-2", "data": "a"},
                                             {"transactionId": "dup-2", "data": "b"}])
    assert [r["status"] for r in within] == ["queued", "duplicate"]

    msgs = await pop(client, queue_name, batch=10)
    assert [(m["transactionId"], m["data"]) for m in msgs] == [("dup-1", "original"),
                                                              ("dup-2", "a")]
    await client.ack(msgs)
    # still a duplicate after it was consumed (dedup lasts as long as the row)
    again = await push(client, queue_name, [{"transactionId": "dup-1", "data": "late"}])
    assert again[0]["status"] == "duplicate"
    await expect_empty(client, queue_name)


async def test_same_transaction_id_in_different_partitions_is_not_a_duplicate(client, queue_name):
    """Dedup is per (partition, transactionId)."""
    a = await push(client, queue_name, [{"transactionId": "same", "data": "a"}], partition="a")
    b = await push(client, queue_name, [{"transactionId": "same", "data": "b"}], partition="b")
    assert a[0]["status"] == b[0]["status"] == "queued"


# -- 8. transactions -----------------------------------------------------------------------------

async def test_transaction_acks_and_pushes_atomically(client, queue_name):
    """client.transaction().ack(msg).queue(next).push(...).commit(): the ack completes the
    message (the partition moves on to the next one) and the pushed message is delivered."""
    out_queue = queue_name + "-out"
    await push(client, queue_name, [{"transactionId": "in-1", "data": 1},
                                    {"transactionId": "in-2", "data": 2}])
    [m] = await pop(client, queue_name, batch=1)
    assert m["transactionId"] == "in-1"
    result = await (client.transaction().ack(m)
                    .queue(out_queue).partition("px").push([{"transactionId": "out-1",
                                                             "data": {"from": "in-1"}}])
                    .commit())
    assert result["success"] is True, result
    assert [r["type"] for r in result["results"]] == ["ack", "push"]
    # acked and lease released: the next pop gets in-2 at once
    [n] = await pop(client, queue_name, batch=1, wait=False)
    assert n["transactionId"] == "in-2"
    out = await pop(client, out_queue, batch=5)
    assert [(x["transactionId"], x["data"], x["partition"]) for x in out] == [
        ("out-1", {"from": "in-1"}, "px")]


async def test_transaction_retry_with_same_push_transaction_id_is_idempotent(client, queue_name):
    """A transaction re-sent with the same push transactionId does not abort and does not push
    a second copy (docs/wire-contract.md §7: the 2.6 client relies on this for retries)."""
    out_queue = queue_name + "-out"
    for _ in range(2):
        res = await client.transaction().queue(out_queue).push(
            [{"transactionId": "once", "data": 1}]).commit()
        assert res["success"] is True, res
    msgs = await pop(client, out_queue, batch=5)
    assert [m["transactionId"] for m in msgs] == ["once"]


@pytest.mark.parametrize("failure", ["wrong_lease", "unknown_message"])
async def test_transaction_rolls_back_everything_when_one_operation_fails(
        client, queue_name, database, failure):
    """If any operation of a transaction fails (ack fenced by a wrong leaseId, or ack of an
    unknown message), commit() raises and nothing is applied: no message pushed, the original
    message not acked (it is redelivered once its lease expires)."""
    out_queue = queue_name + "-out"
    await configure(client, queue_name, lease_time=1)
    await push(client, queue_name, [{"transactionId": "orig", "data": "x"}])
    [m] = await pop(client, queue_name, batch=1)
    tx = client.transaction()
    if failure == "wrong_lease":
        tx.queue(out_queue).push([{"transactionId": "never", "data": 1}])
        tx.ack({**m, "leaseId": str(uuid.uuid4())})
    else:
        tx.ack(m)  # valid on its own
        tx.queue(out_queue).push([{"transactionId": "never", "data": 1}])
        tx.ack({"transactionId": "no-such-message", "partitionId": m["partitionId"],
                "leaseId": m["leaseId"]})
    with pytest.raises(Exception):  # noqa: B017 - the client raises a bare Exception here
        await tx.commit()

    conn = await asyncpg.connect(database.dsn)
    try:
        pushed = await conn.fetchval(
            """SELECT count(*) FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
               JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1""", out_queue)
    finally:
        await conn.close()
    assert pushed == 0, "a push of a failed transaction was committed"

    await asyncio.sleep(1.6)  # lease (1 s) expires; an applied ack would have moved the cursor
    again = await pop(client, queue_name, batch=1)
    assert [x["transactionId"] for x in again] == ["orig"], "the rolled-back ack was applied"


# -- 10. encryption ------------------------------------------------------------------------------

async def test_encrypted_queue_round_trips_and_stores_ciphertext(client, queue_name, database):
    """A queue configured with encryption_enabled=True returns the original payload to the
    client, while queen.messages stores the {encrypted, iv, authTag} envelope with
    is_encrypted = true — for plain and transactional pushes alike."""
    await configure(client, queue_name, encryption_enabled=True)
    secret = {"card": "4111-1111-1111-1111", "amount": 12.5, "tags": ["a", "b"]}
    await push(client, queue_name, [{"transactionId": "enc-1", "data": secret},
                                    {"transactionId": "enc-2", "data": "just a string"}])
    res = await client.transaction().queue(queue_name).push(
        [{"transactionId": "enc-tx", "data": {"via": "transaction"}}]).commit()
    assert res["success"] is True

    msgs = await pop(client, queue_name, batch=10)
    assert [(m["transactionId"], m["data"]) for m in msgs] == [
        ("enc-1", secret), ("enc-2", "just a string"), ("enc-tx", {"via": "transaction"})]

    conn = await asyncpg.connect(database.dsn)
    try:
        rows = await conn.fetch(
            """SELECT m.transaction_id, m.payload::text AS payload, m.is_encrypted
               FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
               JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1
               ORDER BY m.transaction_id""", queue_name)
    finally:
        await conn.close()
    assert [r["transaction_id"] for r in rows] == ["enc-1", "enc-2", "enc-tx"]
    for r in rows:
        assert r["is_encrypted"] is True
        stored = json.loads(r["payload"])
        assert set(stored) == {"encrypted", "iv", "authTag"}, stored
        assert "4111" not in r["payload"] and "transaction" not in r["payload"]
