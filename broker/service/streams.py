"""Streams (the /streams/v1 routes the official clients' streaming SDK runs on): queries,
state reads, and the cycle, which commits a batch's state ops, its sink pushes and its
source ack in one PostgreSQL transaction, or nothing of them.

The cycle is one statement (``queen_streams.cycle_v1``), its own transaction: it runs the
push and ack functions of /api/v1/push and /api/v1/ack inside it (dedup, commit-order
positions, lease validation, failed acks straight to the DLQ). Here: ``to_rows`` (message
ids, encryption) before it, the wakes and counters after its commit.

Results are rows and what was decided; broker/http/wire/streams.py shapes the answers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from broker.core.domain import AckRow, PushItem
from broker.core.telemetry import telemetry
from broker.service.ack import leases_released, refuse_held
from broker.service.context import BrokerContext
from broker.service.push import to_rows, wake_after_commit
from broker.store import streams as store
from broker.store.errors import TransactionAborted
from broker.store.streams import StateOp, StateRead


@dataclass(frozen=True)
class QuerySpec:
    """A query to register: ``reset`` deletes its state when the config changed."""
    name: str
    source: str
    sink: str | None
    config_hash: str
    reset: bool


async def register_query(ctx: BrokerContext, spec: QuerySpec) -> Any:
    """Idempotent per name; the row of queen_streams.register_query_v1 (query_id, name,
    config_hash, fresh, did_reset; conflict with existing_hash when the config changed
    and no reset was asked)."""
    return await store.register_query(ctx.store, spec.name, spec.source, spec.sink,
                                      spec.config_hash, spec.reset)


async def delete_query(ctx: BrokerContext, name: str) -> str | None:
    """Delete a query and all its state; its id, or None when there was none."""
    return await store.delete_query(ctx.store, name)


async def list_queries(ctx: BrokerContext) -> list[Any]:
    """Every query with its state size (the figures of the operator's view)."""
    return await store.streams_status(ctx.store)


async def read_state(ctx: BrokerContext, read: StateRead) -> list[dict[str, Any]]:
    """Rows of one shard; folded with concurrent reads into one round trip."""
    results = await (await ctx.streams_state_batcher.submit([read]))
    return results[0]


@dataclass(frozen=True)
class CycleRequest:
    query_id: str
    partition_id: str
    group: str
    ops: list[StateOp]
    pushes: list[PushItem]
    ack: AckRow | None
    release_lease: bool


class UnknownTarget(Exception):
    """The cycle names a query or a source partition that does not exist: nothing done."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class CycleAck:
    """What became of the cycle's source ack; ``already_acknowledged``: a replayed cycle's,
    which the cursor had passed (nothing was written)."""
    success: bool
    lease_released: bool
    dlq: bool
    already_acknowledged: bool = False


@dataclass(frozen=True)
class CycleOutcome:
    applied: int                           # state ops applied
    pushed: list[tuple[PushItem, Any]]     # (item, push row) of committed sink pushes
    ack: CycleAck | None                   # None: the cycle had no ack
    error: str | None = None               # rolled back: why
    replayed: bool = False


async def cycle(ctx: BrokerContext, req: CycleRequest, producer_sub: str | None) -> CycleOutcome:
    """State ops, sink pushes, source ack: committed together or not at all. A sink push
    to a partition a spool still holds is refused (PartitionHeld, a 503), as for
    /api/v1/transaction: a cycle cannot wait in the spool. PostgreSQL unreachable:
    StoreUnavailable (503), nothing spooled. A cycle already committed (a retry whose
    answer was lost, or another worker took the batch over: its ack is at or behind the
    cursor, or, without an ack, every state row it deletes is gone) writes nothing more."""
    refuse_held(ctx, req.pushes)
    rows = await to_rows(ctx, req.pushes, producer_sub) if req.pushes else []
    ack = req.ack
    whole = ack is not None and req.release_lease and ack.status in ("completed", "success")
    started = time.perf_counter()
    try:
        res = await store.cycle(ctx.store, req.query_id, req.partition_id, req.ops, req.group,
                                ack, whole, rows)
    except TransactionAborted as aborted:
        telemetry.stream_cycles["rolled_back"] += 1
        return CycleOutcome(0, [], None, error=aborted.reason)
    if res.status == "unknown_query":
        raise UnknownTarget(f"unknown query_id {req.query_id}")
    if res.status == "unknown_partition":
        raise UnknownTarget(f"unknown partition_id {req.partition_id}")
    if res.status == "replayed":
        telemetry.stream_cycles["replayed"] += 1
        return CycleOutcome(0, [], None if ack is None else CycleAck(
            success=True, lease_released=False, dlq=False, already_acknowledged=True),
            replayed=True)
    telemetry.stream_cycle_committed(time.perf_counter() - started)
    pushed = list(zip(req.pushes, res.pushed))
    ack_out = None
    if ack is not None and res.ack is not None:
        leases_released(ctx, [ack], [res.ack])
        ack_out = CycleAck(res.ack["success"], res.ack["lease_released"], res.ack["dlq"])
        telemetry.messages["dlq" if ack_out.dlq else "acked_" + ack.status] += 1
    wake_after_commit(ctx, {(i.queue, i.partition) for i, r in pushed if r["status"] == "queued"})
    for _item, r in pushed:  # counted like /api/v1/push and /api/v1/ack count theirs
        telemetry.messages[r["status"]] += 1
    return CycleOutcome(res.applied, pushed, ack_out)


async def status(ctx: BrokerContext) -> list[Any]:
    """The operator's view: every query with its state size and committed cycles."""
    return await store.streams_status(ctx.store)


async def status_of(ctx: BrokerContext, name: str, limit: int) -> tuple[Any, list[Any]] | None:
    """One query's figures and its partitions (largest state first); None: no such query."""
    rows = await store.streams_status(ctx.store, name)
    if not rows:
        return None
    return rows[0], await store.stream_partitions(ctx.store, rows[0]["id"], limit)
