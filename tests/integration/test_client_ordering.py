"""Ordering and exactly-once delivery under concurrency, through the official client.

Concurrent producers push numbered sequences into several partitions while consume() loops
(auto-ack, several workers) read them. Invariants: per-partition FIFO order (each producer's
sequence arrives in the order it was committed), nothing lost, nothing delivered twice
(deliveries counted by transactionId), nothing left unacknowledged afterwards.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
from collections import Counter, defaultdict

import pytest
from queen import Queen

pytestmark = pytest.mark.timeout(120)

# The "Done when" scenario sized for the suite; benchmarks/ runs the same shape with 10,000.
DONE_WHEN_N = 2000
DONE_WHEN_PARTITIONS = 16
DONE_WHEN_PUSH_BATCH = 25




async def produce(client: Queen, queue: str, partition: str, producer: int, count: int,
                  push_batch: int) -> None:
    """One producer: pushes seq 0..count-1 into `partition`, `push_batch` items per request,
    each request awaited before the next (so its own sequence is committed in order)."""
    for start in range(0, count, push_batch):
        items = [{"transactionId": f"{partition}:{producer}:{seq}",
                  "data": {"partition": partition, "producer": producer, "seq": seq}}
                 for seq in range(start, min(start + push_batch, count))]
        results = await client.queue(queue).partition(partition).push(items)
        assert [r["status"] for r in results] == ["queued"] * len(items), results


async def consume_until(client: Queen, queue: str, expected: int, *, concurrency: int,
                        batch: int, deliveries: list[dict], producers_done: asyncio.Event,
                        deadline_s: float) -> None:
    """Run consume() until `expected` deliveries were seen (and producers are done), then
    stop it through its abort signal. Records every delivery in handler order."""
    stop = asyncio.Event()

    async def handler(messages):
        assert isinstance(messages, list)  # batch > 1 ⇒ the handler gets lists
        for m in messages:
            deliveries.append({"transactionId": m["transactionId"], "partition": m["partition"],
                               **m["data"]})
        if len(deliveries) >= expected and producers_done.is_set():
            stop.set()

    consumer = (client.queue(queue).batch(batch).concurrency(concurrency)
                .timeout_millis(500).consume(handler, signal=stop))
    task = asyncio.ensure_future(consumer)
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while not task.done() and loop.time() < end:
            if len(deliveries) >= expected and producers_done.is_set():
                stop.set()
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(task, 10)  # workers notice the signal after ≤ one long poll
    finally:
        if not task.done():
            task.cancel()


def check_exactly_once_in_order(deliveries: list[dict], expected_ids: set[str]) -> None:
    counts = Counter(d["transactionId"] for d in deliveries)
    duplicated = {t: c for t, c in counts.items() if c > 1}
    lost = expected_ids - counts.keys()
    unexpected = counts.keys() - expected_ids
    assert not duplicated, f"{len(duplicated)} messages delivered more than once, e.g. " \
                           f"{list(duplicated.items())[:5]}"
    assert not lost, f"{len(lost)} messages never delivered, e.g. {sorted(lost)[:5]}"
    assert not unexpected, unexpected
    # message metadata agrees with the payload (partition route of the push)
    assert all(d["partition"] == d["transactionId"].split(":")[0] for d in deliveries)
    # per (partition, producer): seq strictly increasing in delivery order
    seqs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for d in deliveries:
        seqs[(d["partition"], d["producer"])].append(d["seq"])
    for key, got in seqs.items():
        assert got == sorted(got), f"partition order broken for {key}: {got[:50]}"


async def assert_drained(client: Queen, queue: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        left = await client.queue(queue).batch(10).wait(False).pop()
    assert "Pop failed" not in out.getvalue(), out.getvalue()
    assert left == [], f"unacked messages left: {[m['transactionId'] for m in left]}"


async def test_concurrent_producers_partitions_keep_order_none_lost_none_duplicated(
        client, queue_name):
    """8 concurrent producers (2 per partition) push numbered sequences into 4 partitions while
    a 4-worker consume() reads: per-partition order of every producer's sequence is preserved,
    no message is lost or delivered twice, and everything ends acknowledged."""
    producers, partitions, per_producer = 8, 4, 60
    expected_ids = {f"p{i % partitions}:{i}:{s}" for i in range(producers)
                    for s in range(per_producer)}
    deliveries: list[dict] = []
    producers_done = asyncio.Event()

    async def all_producers():
        await asyncio.gather(*[produce(client, queue_name, f"p{i % partitions}", i,
                                       per_producer, push_batch=6) for i in range(producers)])
        producers_done.set()

    await asyncio.gather(
        all_producers(),
        consume_until(client, queue_name, len(expected_ids), concurrency=4, batch=10,
                      deliveries=deliveries, producers_done=producers_done, deadline_s=40))
    check_exactly_once_in_order(deliveries, expected_ids)
    await assert_drained(client, queue_name)


async def test_done_when_consume_loop_keeps_partition_order_exactly_once(client, queue_name):
    """The "Done when" scenario: DONE_WHEN_N messages pushed concurrently in batches into 16
    partitions are processed by one consume() loop (batches, several workers) with every
    partition's sequence delivered in order, none lost and none delivered twice (counted by
    transactionId); afterwards nothing is left to deliver."""
    per_partition = DONE_WHEN_N // DONE_WHEN_PARTITIONS
    parts = [f"part-{i:02d}" for i in range(DONE_WHEN_PARTITIONS)]
    expected_ids = {f"{p}:0:{s}" for p in parts for s in range(per_partition)}
    assert len(expected_ids) == DONE_WHEN_N
    deliveries: list[dict] = []
    producers_done = asyncio.Event()

    async def all_producers():
        await asyncio.gather(*[produce(client, queue_name, p, 0, per_partition,
                                       push_batch=DONE_WHEN_PUSH_BATCH) for p in parts])
        producers_done.set()

    await asyncio.gather(
        all_producers(),
        consume_until(client, queue_name, DONE_WHEN_N, concurrency=4, batch=100,
                      deliveries=deliveries, producers_done=producers_done, deadline_s=60))
    check_exactly_once_in_order(deliveries, expected_ids)
    # one producer per partition ⇒ each partition must arrive as exactly 0..n-1
    by_partition: dict[str, list[int]] = defaultdict(list)
    for d in deliveries:
        by_partition[d["partition"]].append(d["seq"])
    assert {p: by_partition[p] == list(range(per_partition)) for p in parts} == \
        {p: True for p in parts}
    await assert_drained(client, queue_name)
