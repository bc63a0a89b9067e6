"""The broker's own SQL without the broker: the load generator calls ``broker.store.db.Store``
directly (push: ``Store.push``, one statement per request; pop + ack: ``Store.pop`` then
``Store.ack``), with the same rows, clients and partitions as the HTTP phases.

What a broker adds on top of this floor is its HTTP, its services and actors; what the floor
costs is PostgreSQL's work on ``push_ordered_v5`` / ``pop_messages_v5`` / ``ack_messages_v5``
and asyncpg's on both ends. The phase's ``store_cpu_ms_per_1000`` is this process's own CPU
(``time.process_time``) per 1,000 messages: the store layer's client-side share of a broker's
CPU figure (argument encoding, result decoding, the round trips' wake-ups).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from _loadgen import Phase, Rows, run_workers
from broker.core.domain import QUEUE_MODE, AckRow, PushRow
from broker.core.ids import new_uuid7
from broker.store.db import Store


async def open_store(dsn: str, concurrency: int) -> Store:
    """A pooled store on an already migrated database, set up as a broker sets its pool up."""
    return await Store.connect(dsn, pool_size=concurrency, connect_timeout_ms=10_000,
                               statement_timeout_ms=30_000, lock_timeout_ms=10_000,
                               idle_timeout_ms=60_000, application_name="bench-store-floor",
                               apply=False)


def push_requests(rows: Rows, queue: str, batch: int,
                  spread: bool = False) -> list[list[PushRow]]:
    """The PushRows a broker would build for ``rows`` pushed ``batch`` per request (one
    partition per request, as ``Rows.push_body``; ``spread``: item i of a request to
    partition i % P, the shape of a call folding many requests), built before the clock
    starts."""
    requests = []
    for n, chunk in enumerate(rows.chunks(batch)):
        part = f"p{(chunk.start // batch) % rows.partitions}"
        requests.append([PushRow(queue=queue, message_id=new_uuid7(),
                                 partition=f"p{i % rows.partitions}" if spread else part,
                                 transaction_id=rows.txids[i], trace_id=None, payload=None,
                                 payload_json=rows.payloads[i], request=n + 1)
                         for i in chunk])
    return requests


async def _run(phase: Phase, concurrency: int, worker) -> Phase:
    """Run the phase's workers; its wall time, and this process's CPU per 1,000 messages."""
    cpu = time.process_time()
    phase.elapsed = await run_workers(concurrency, worker)
    used = time.process_time() - cpu
    phase.broker = {"store_cpu_ms_per_1000": used * 1e6 / phase.done if phase.done else None}
    return phase


async def store_push(store: Store, rows: Rows, queue: str, batch: int, concurrency: int,
                     cap_s: float, label: str, spread: bool = False) -> Phase:
    requests = push_requests(rows, queue, batch, spread)
    phase = Phase(label, rows.n)
    it = iter(requests)
    deadline = time.perf_counter() + cap_s

    async def worker(_: int) -> None:
        for request in it:
            if time.perf_counter() > deadline:
                return
            t = time.perf_counter()
            result = await store.push(request)
            phase.latencies_ms.append((time.perf_counter() - t) * 1000)
            phase.requests += 1
            queued = sum(1 for r in result if r["status"] == "queued")
            phase.done += queued
            if queued != len(request):
                phase.error(f"{len(request) - queued} items not queued: {result[0]['status']}")

    return await _run(phase, concurrency, worker)


async def store_pop_ack(store: Store, queue: str, n: int, batch: int, concurrency: int,
                        cap_s: float, label: str) -> Phase:
    """Queue-mode pops of ``batch`` from any partition of ``queue`` (PostgreSQL picks, as for
    a pop without the hot-list's hints), each acked ``completed`` under its lease."""
    phase = Phase(label, n)
    deadline = time.perf_counter() + cap_s

    async def worker(_: int) -> None:
        while phase.done < n and time.perf_counter() < deadline:
            lease = new_uuid7()
            rows: Any = await store.pop(queue=queue, partition=None, namespace=None,
                                        task=None, group=QUEUE_MODE, batch=batch,
                                        max_partitions=1, auto_ack=False, lease_id=lease)
            popped = [r for r in rows if r["kind"] == "msg"]  # not the claim's verdicts
            phase.requests += 1
            if not popped:  # every partition with messages is leased by another worker
                phase.empty += 1
                await asyncio.sleep(0.002)  # as the HTTP phase does
                continue
            acks = [AckRow(r["transaction_id"], str(r["partition_id"]), "completed", None,
                           QUEUE_MODE, lease) for r in popped]
            result = await store.ack(acks)
            phase.requests += 1
            ok = sum(1 for r in result if r["success"])
            phase.done += ok
            if ok != len(acks):
                phase.error(f"{len(acks) - ok} acks refused")

    return await _run(phase, concurrency, worker)
