"""Micro benchmarks of the broker's in-process hot paths, with pytest-benchmark.

    python3 dev.py micro            # = pytest benchmarks/test_micro.py --benchmark-only

Not part of the test suite (pytest's testpaths is tests/). Timings on this
noisy machine are for comparing two revisions in one run
(`--benchmark-save`/`--benchmark-compare`), never absolute targets. Each case
names the per-request work it stands for.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from actors.hotlist import TOOK, HotList
from actors.mesh import frames
from actors.runtime import AsyncioActor
from actors.spool import encode_records
from broker.core.crypto import PayloadCipher
from broker.http.wire.pop import parse_pop
from broker.http.wire.push import parse_push

ITEMS_100 = {"items": [{"queue": "orders", "partition": f"p{i % 16}",
                        "payload": {"order": i, "lines": [1, 2, 3], "note": "x" * 40},
                        "transactionId": str(uuid.uuid4())} for i in range(100)]}


def test_parse_push_of_100_items(benchmark):
    """Validating one push request of 100 items (before any SQL)."""
    items = benchmark(parse_push, ITEMS_100)
    assert len(items) == 100


def test_parse_pop_query(benchmark):
    args = {"batch": "10", "wait": "true", "timeout": "30000", "consumerGroup": "billing",
            "subscriptionMode": "new"}
    req = benchmark(parse_pop, args, queue="orders", partition=None, default_batch=1,
                    default_timeout_ms=30000, default_subscription_mode="")
    assert req.batch == 10


def test_encrypt_and_decrypt_a_payload(benchmark):
    cipher = PayloadCipher(b"\x11" * 32)
    payload = ITEMS_100["items"][0]["payload"]
    assert benchmark(lambda: cipher.decrypt(cipher.encrypt(payload))) == payload


def test_encode_and_decode_a_wake_frame(benchmark):
    body = {"items": [{"queue": "orders", "partition": f"p{i}"} for i in range(16)]}

    def round_trip():
        raw = frames.encode(frames.MESSAGE_AVAILABLE_BATCH, body)
        return frames.decode_payload(raw[5:])

    assert benchmark(round_trip) == body


def test_spool_encoding_of_100_events(benchmark):
    events = [{"queue": i["queue"], "partition": i["partition"], "payload": i["payload"],
               "transactionId": i["transactionId"]} for i in ITEMS_100["items"]]
    assert len(benchmark(encode_records, events)) > 100


def test_hotlist_take_and_check_in(benchmark):
    """One wildcard pop's hot-list work: mark, take, verdict."""
    hl = HotList(jitter_ms=0)
    hl.take("q", "g", 1)
    hl.seed("q", "g", [f"p{i}" for i in range(1000)])

    def one_pop():
        taken = hl.take("q", "g", 4).entries
        hl.check_in("q", "g", [(p, e, TOOK, 0.0) for p, e in taken])
        for p, _ in taken:
            hl.ack_released("q", "g", p)
            hl.mark("q", p)

    benchmark(one_pop)


class Echo(AsyncioActor):
    def echo(self, value):
        return value


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_actor_ask_round_trip(benchmark, loop):
    """What every batcher submit and hot-list take pays: one proxy call to an actor
    and back (measured as 1,000 sequential asks)."""
    async def start():
        return Echo.start().proxy()

    proxy = loop.run_until_complete(start())

    async def thousand():
        for i in range(1000):
            await proxy.echo(i)

    benchmark.pedantic(lambda: loop.run_until_complete(thousand()), rounds=5, iterations=1)
    loop.run_until_complete(proxy.actor_ref.stop(block=False))


def _popped_rows(n: int) -> list[dict]:
    import datetime as dt
    pid = uuid.uuid4()
    now = dt.datetime.now(dt.UTC)
    return [{"message_id": uuid.uuid4(), "transaction_id": str(uuid.uuid4()), "trace_id": None,
             "payload": {"order": i, "lines": [1, 2, 3], "note": "x" * 40},
             "producer_sub": None, "created_at": now, "queue_name": "orders",
             "partition_name": "p1", "partition_id": pid, "retry_count": 0} for i in range(n)]


def test_shape_pop_response_of_100_messages(benchmark):
    """What a pop of 100 messages costs after the SQL: one dict per message, then JSON."""
    from broker.http.responses import json
    from broker.http.wire.pop import pop_message
    rows = _popped_rows(100)
    lease = str(uuid.uuid4())

    def shape():
        return json({"messages": [pop_message(r, r["payload"], "__QUEUE_MODE__", lease)
                                  for r in rows]})
    response = benchmark(shape)
    assert response.body.count(b'"transactionId"') == 100
