"""The hot-list claim protocol of a wildcard pop (broker/service/pop.py),
without HTTP: a real Store on the test PostgreSQL, a real HotList.

Invariant: every candidate a pop takes from the hot-list (it becomes
INFLIGHT) is checked in with a verdict by the end of the pop. A candidate left
INFLIGHT is invisible to wildcard pops until a reseed finds it stranded
(a minute), although its partition has pending messages.
"""
from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from actors.hotlist import HotList
from broker.core.domain import PushRow
from broker.core.ids import new_uuid7
from broker.http.wire.pop import parse_pop
from broker.service.pop import claim, verdicts
from broker.store.db import Store
from broker.store.errors import StoreUnavailable


def pop_request(queue: str, group: str = "g"):
    return parse_pop({"consumerGroup": group, "batch": "1"}, queue=queue, partition=None,
                     default_batch=1, default_timeout_ms=0, default_subscription_mode="")


async def push(store: Store, queue: str, partitions: list[str]) -> None:
    await store.push([PushRow(queue=queue, partition=p, message_id=new_uuid7(),
                              transaction_id=str(uuid.uuid4()), trace_id=None, payload={"p": p})
                      for p in partitions])


async def test_a_due_reseed_leaves_no_candidate_inflight(store):
    """The reseed floor is due on every take (reseed_ms 0, and no seed claim
    stands): each take hands out candidates and asks for a seed; the pop
    seeds, takes again, and checks in both batches."""
    ref = HotList.start(reseed_ms=0, jitter_ms=0, seed_claim_s=0)
    try:
        hotlist = ref.proxy()
        ctx = SimpleNamespace(store=store, hotlist=hotlist)
        queue = f"claim-{uuid.uuid4().hex[:8]}"
        await push(store, queue, [f"p{i}" for i in range(6)])
        req = pop_request(queue)
        await claim(ctx, req, new_uuid7(), [])  # cold: seeds, then claims
        delivered = 1
        for _ in range(5):
            rows = (await claim(ctx, req, new_uuid7(), [])).rows
            delivered += sum(1 for r in rows if r["kind"] == "msg")
            stats = await hotlist.stats()
            assert stats["inflight"] == 0, stats
        # one message per pop, each from another partition: all six served
        assert delivered == 6
    finally:
        await ref.stop(block=False)


async def test_a_failed_seed_gives_the_candidates_back(store):
    class FailingSeed(SimpleNamespace):
        async def pending_partitions(self, queue, group):
            raise ConnectionError("database down")

    ref = HotList.start(reseed_ms=0, jitter_ms=0, seed_claim_s=0)
    try:
        hotlist = ref.proxy()
        queue = f"claim-{uuid.uuid4().hex[:8]}"
        await push(store, queue, ["a", "b"])
        req = pop_request(queue)
        await claim(SimpleNamespace(store=store, hotlist=hotlist), req, new_uuid7(), [])
        with pytest.raises(ConnectionError):
            await claim(SimpleNamespace(store=FailingSeed(pop=store.pop), hotlist=hotlist),
                        req, new_uuid7(), [])
        assert (await hotlist.stats())["inflight"] == 0
    finally:
        await ref.stop(block=False)


class FailingClaim(SimpleNamespace):
    """The test store, except that every claim raises ``error`` (or, with ``hang``, waits
    until the pop is cancelled)."""

    async def pop(self, **_kwargs):
        self.started.set()
        if self.hang:
            await asyncio.Event().wait()  # until cancelled
        raise self.error


@pytest.mark.parametrize("error", [StoreUnavailable("database down"), TimeoutError(),
                                   RuntimeError("a bug")], ids=type)
async def test_a_claim_that_raises_gives_its_candidates_back(store, error):
    """Invariant 66: a claim that fails (the database gone, a timeout, any error) leaves no
    candidate INFLIGHT; the next pop finds every partition in the ring."""
    ref = HotList.start(reseed_ms=60_000, jitter_ms=0)
    try:
        hotlist = ref.proxy()
        queue = f"claim-{uuid.uuid4().hex[:8]}"
        await push(store, queue, ["a", "b", "c", "d", "e"])
        req = pop_request(queue)
        await claim(SimpleNamespace(store=store, hotlist=hotlist), req, new_uuid7(), [])
        failing = FailingClaim(pending_partitions=store.pending_partitions, error=error,
                               hang=False, started=asyncio.Event())
        with pytest.raises(type(error)):
            await claim(SimpleNamespace(store=failing, hotlist=hotlist), req, new_uuid7(), [])
        stats = await hotlist.stats()
        assert stats["inflight"] == 0 and stats["ready"] == 4, stats  # "a" is leased
    finally:
        await ref.stop(block=False)


async def test_a_cancelled_claim_gives_its_candidates_back(store):
    """Invariant 66: a pop cancelled while its claim runs (its client went away, the broker
    stops) leaves no candidate INFLIGHT."""
    ref = HotList.start(reseed_ms=60_000, jitter_ms=0)
    try:
        hotlist = ref.proxy()
        queue = f"claim-{uuid.uuid4().hex[:8]}"
        await push(store, queue, ["a", "b", "c"])
        req = pop_request(queue)
        await claim(SimpleNamespace(store=store, hotlist=hotlist), req, new_uuid7(), [])
        hanging = FailingClaim(pending_partitions=store.pending_partitions, error=None,
                               hang=True, started=asyncio.Event())
        task = asyncio.create_task(
            claim(SimpleNamespace(store=hanging, hotlist=hotlist), req, new_uuid7(), []))
        await hanging.started.wait()
        assert (await hotlist.stats())["inflight"] == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await hotlist.stats())["inflight"] == 0
    finally:
        await ref.stop(block=False)


def test_verdicts_requeue_what_the_budget_left_unlooked_and_cap_lease_revisits():
    rows = [{"kind": "msg", "partition_name": "a"},
            {"kind": "verdict", "partition_name": "a", "verdict": "took", "verdict_secs": 300},
            {"kind": "verdict", "partition_name": "b", "verdict": "empty", "verdict_secs": None}]
    out = verdicts([("a", 1), ("b", 2), ("c", 3)], rows)
    assert out == [("a", 1, "took", 5.0), ("b", 2, "empty", None), ("c", 3, "requeue", None)]
    out = verdicts([("c", 3)], [])
    assert out == [("c", 3, "empty", None)]  # not looked at, nothing claimed: it is gone
