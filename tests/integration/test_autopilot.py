"""Pop autopilot through the official client (queen-mq 2.6.0; docs/wire-contract.md §5.8).

A 2.6 pop that leaves batch or partitions unset sends ``autopilot=true`` without them; the
broker sizes the pop (actors/autopilot.py) and echoes ``"autopilot": {partitions, batch,
waitMs}`` on every answer of it. Pops are counted from the broker's /metrics/prometheus
(the pop route's request counter); nothing here asserts a timing.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import re
import time

import httpx
import pytest
from queen import Queen

pytestmark = pytest.mark.timeout(90)


def _metric(base_url: str, name: str, label: str | None = None) -> float:
    """The sum of a Prometheus sample family's values (those whose labels contain
    ``label`` when given)."""
    text = httpx.get(base_url + "/metrics/prometheus", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m and (label is None or label in (m.group(1) or "")):
            total += float(m.group(2))
    return total


def wildcard_pops(base_url: str) -> float:
    return _metric(base_url, "queen_requests_total", "pop_queue\"")


async def quiet_pop_result(builder):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        res = await builder.pop_result()
    assert "Pop failed" not in out.getvalue(), out.getvalue()
    return res


async def test_default_consume_is_sized_by_the_broker(client: Queen, base_url, queue_name):
    """A default consume() (autopilot on: no batch, no partitions on the wire) drains 500
    messages in far fewer pops than 500, each message once, and the broker counts its
    decisions."""
    n = 500
    await client.queue(queue_name).push([{"data": i} for i in range(n)])
    seen: list[int] = []

    async def handler(batch):
        for m in batch if isinstance(batch, list) else [batch]:
            seen.append(m["data"])

    pops_before = wildcard_pops(base_url)
    decided_before = _metric(base_url, "queen_pop_autopilot_decisions_total", 'knob="batch"')
    started = time.perf_counter()
    await asyncio.wait_for(client.queue(queue_name).limit(n).timeout_millis(1000)
                           .consume(handler), 60)
    elapsed = time.perf_counter() - started
    pops = wildcard_pops(base_url) - pops_before
    print(f"default consume() of {n}: {pops:.0f} pops, {elapsed:.2f} s")
    assert sorted(seen) == list(range(n))
    assert pops <= 60, pops
    assert _metric(base_url, "queen_pop_autopilot_decisions_total",
                   'knob="batch"') - decided_before >= 1
    assert _metric(base_url, "queen_pop_autopilot_batch_count") >= 1


async def test_pinned_batch_and_partitions_stay_pinned(client: Queen, queue_name):
    """batch(5) is used as it is (the echo says 5, no pop returns more) while the broker
    chooses the sweep width; partitions(1) stays 1 whatever is ready."""
    for p in range(6):
        await client.queue(queue_name).partition(f"p{p}").push(
            [{"data": f"{p}-{i}"} for i in range(20)])
    res = await quiet_pop_result(client.queue(queue_name).batch(5).wait(False))
    assert res.autopilot is not None
    assert res.autopilot.batch == 5
    assert 1 <= len(res.messages) <= 5
    await client.ack(res.messages, True)

    for _ in range(5):
        res = await quiet_pop_result(client.queue(queue_name).partitions(1).wait(False))
        assert res.autopilot is not None and res.autopilot.partitions == 1
        assert len({m["partitionId"] for m in res.messages}) == 1
        await client.ack(res.messages, True)

    got: list[list] = []

    async def handler(batch):
        got.append(batch if isinstance(batch, list) else [batch])

    await asyncio.wait_for(client.queue(queue_name).batch(5).limit(40).timeout_millis(500)
                           .consume(handler), 30)
    assert got and all(1 <= len(b) <= 5 for b in got), [len(b) for b in got]


async def test_echo_on_empty_answers(client: Queen, base_url, queue_name):
    """An empty autopilot pop carries the echo: a non-waiting one with a waitMs advice
    within 50..1000 ms, a waiting one that reached its deadline with waitMs 0."""
    await client.queue(queue_name).push([{"data": 1}])
    res = await quiet_pop_result(client.queue(queue_name).wait(False))
    assert len(res.messages) == 1
    assert res.autopilot is not None and res.autopilot.wait_millis == 0
    assert res.autopilot.batch >= 1 and res.autopilot.partitions >= 1
    await client.ack(res.messages, True)

    res = await quiet_pop_result(client.queue(queue_name).wait(False))
    assert res.messages == []
    assert res.autopilot is not None and 50 <= res.autopilot.wait_millis <= 1000

    res = await quiet_pop_result(client.queue(queue_name).wait(True).timeout_millis(200))
    assert res.messages == []
    assert res.autopilot is not None and res.autopilot.wait_millis == 0

    # The raw answer, on the partition route too (its sweep width is 1).
    body = httpx.get(f"{base_url}/api/v1/pop/queue/{queue_name}/partition/Default",
                     params={"autopilot": "true", "wait": "false"}, timeout=10).json()
    assert body["messages"] == []
    assert body["autopilot"]["partitions"] == 1 and 50 <= body["autopilot"]["waitMs"] <= 1000


async def test_autopilot_off_gets_no_echo_and_the_old_sizing(base_url, queue_name):
    """QUEEN_SDK_POP_AUTOPILOT=off-style requests (no autopilot parameter) are sized as
    before (DEFAULT_BATCH_SIZE, one partition) and their answers carry no echo."""
    q = Queen(base_url)
    q.autopilot_off = True  # what QUEEN_SDK_POP_AUTOPILOT=off sets in the constructor
    try:
        await q.queue(queue_name).push([{"data": i} for i in range(10)])
        res = await quiet_pop_result(q.queue(queue_name).wait(False))
        assert res.autopilot is None
        assert len(res.messages) == 1  # DEFAULT_BATCH_SIZE
        await q.ack(res.messages, True)
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()
    body = httpx.get(f"{base_url}/api/v1/pop/queue/{queue_name}",
                     params={"wait": "false"}, timeout=10).json()
    assert "autopilot" not in body and len(body["messages"]) == 1


async def test_batch_stays_within_what_a_slow_consumer_finishes(client: Queen, base_url,
                                                               queue_name):
    """A consumer that needs SLEEP_S per message on a queue with a short leaseTime: once the
    broker saw it finish a lease, no batch it hands out is more than the consumer finishes
    within the lease (leaseTime / SLEEP_S), and nothing is delivered twice."""
    lease_s, sleep_s = 2, 0.25
    within_lease = int(lease_s / sleep_s)  # 8
    with contextlib.redirect_stdout(io.StringIO()):
        await client.queue(queue_name).config({"leaseTime": lease_s}).create()
    await client.queue(queue_name).push([{"data": i} for i in range(40)])
    seen: list[int] = []
    batches: list[int] = []
    for _ in range(6):
        res = await quiet_pop_result(client.queue(queue_name).wait(False))
        assert res.autopilot is not None
        batches.append(res.autopilot.batch)
        assert res.autopilot.batch <= within_lease, batches
        for m in res.messages:
            await asyncio.sleep(sleep_s)
            seen.append(m["data"])
        if res.messages:
            await client.ack(res.messages, True)
    assert len(seen) == len(set(seen)), seen
    # A fast consumer of the same queue is given more once it is seen to be fast.
    fast: list[int] = []
    for _ in range(4):
        res = await quiet_pop_result(client.queue(queue_name).group("fast").wait(False))
        assert res.autopilot is not None
        fast.append(res.autopilot.batch)
        if res.messages:
            await client.ack(res.messages, True, {"group": "fast"})
    assert fast[-1] > fast[0], fast
