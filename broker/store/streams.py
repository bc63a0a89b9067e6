"""Store functions of the /streams/v1 routes (SQL in streams_sql.py). Each takes the
:class:`~broker.store.db.Store`; errors map like every other store call. Each is one
statement, one round trip; a cycle's is its own transaction (:func:`cycle`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.core.domain import AckRow, PushRow
from broker.store import codecs
from broker.store import streams_sql as q
from broker.store.db import Store, now_us
from broker.store.errors import PartitionHeld, TransactionAborted, mapped_errors
from broker.store.transactions import rerun_on_conflict


@dataclass(frozen=True)
class StateOp:
    type: str        # "upsert" | "delete"
    key: str
    value_json: str | None  # the value, serialized and checked storable (upsert only)


@dataclass(frozen=True)
class StateRead:
    """One state/get request: rows of (query, partition), filtered."""
    query_id: str
    partition_id: str
    keys: tuple[str, ...]
    key_prefix: str | None
    ripe_at_or_before: int | None


async def register_query(store: Store, name: str, source: str, sink: str | None,
                         config_hash: str, reset: bool) -> asyncpg.Record:
    async with store.connection() as conn:
        return await conn.fetchrow(q.REGISTER_QUERY, name, source, sink, config_hash, reset)


async def delete_query(store: Store, name: str) -> str | None:
    async with store.connection() as conn:
        gone = await conn.fetchval(q.DELETE_QUERY, name)
    return None if gone is None else str(gone)


@dataclass(frozen=True)
class CycleResult:
    status: str                   # ok | replayed | unknown_query | unknown_partition
    applied: int                  # state ops applied
    pushed: list[dict[str, Any]]  # per sink push, in input order: message_id, status
    ack: dict[str, Any] | None    # success, lease_released, dlq, queue_name, partition_name


async def cycle(store: Store, query_id: str, partition_id: str, ops: Sequence[StateOp],
                group: str, ack: AckRow | None, whole_batch: bool,
                pushes: Sequence[PushRow]) -> CycleResult:
    """One cycle in one statement (streams_sql.CYCLE), its own transaction, rerun after a
    deadlock. Raises PartitionHeld (a sink partition a spool holds) or TransactionAborted
    (the ack refused: its reason); either way nothing was committed."""
    (idx, queues, partitions, ids, txids, traces, payloads, encrypted, subs, accept, server,
     wait_ms, _settle_ms) = codecs.push_arrays(pushes, [now_us()] * len(pushes), store.server_id,
                                         store.order_wait_ms, store.settle_ms)
    args = (query_id, partition_id, [o.type for o in ops], [o.key for o in ops],
            [o.value_json for o in ops],  # JSON text, cast to jsonb in SQL
            group, ack.transaction_id if ack else None, ack.lease_id if ack else None,
            whole_batch, ack.status if ack else None, ack.error if ack else None,
            idx, queues, partitions, ids, txids, traces, payloads, encrypted, subs, accept,
            server, wait_ms)

    async def once() -> asyncpg.Record:
        async with store.connection() as conn:
            with mapped_errors():
                try:
                    return await conn.fetchrow(q.CYCLE, *args)
                except asyncpg.exceptions.PostgresError as exc:
                    if exc.sqlstate == q.CYCLE_HELD:
                        item = pushes[int(getattr(exc, "detail", None) or 0)]
                        raise PartitionHeld(item.queue, item.partition) from None
                    if exc.sqlstate == q.CYCLE_ACK_REFUSED:
                        raise TransactionAborted(str(getattr(exc, "message", exc))) from None
                    raise

    row = await rerun_on_conflict(once)
    pushed = [{"message_id": m, "status": st}
              for m, st in zip(row["push_message_id"] or [], row["push_status"] or [])]
    out = None
    if row["ack_success"] is not None:
        out = {"success": row["ack_success"], "lease_released": row["ack_lease_released"],
               "dlq": row["ack_dlq"], "queue_name": row["ack_queue"],
               "partition_name": row["ack_partition"]}
    return CycleResult(row["status"], row["applied"], pushed, out)


async def read_state(store: Store, reads: Sequence[StateRead]) -> list[list[dict[str, Any]]]:
    """Folded state reads: one round trip, one list of rows per read, in order."""
    key_idx = [i for i, r in enumerate(reads) for _ in r.keys]
    keys = [k for r in reads for k in r.keys]
    async with store.connection() as conn:
        rows = await conn.fetch(
            q.STATE_GET, list(range(len(reads))), [r.query_id for r in reads],
            [r.partition_id for r in reads], [r.key_prefix for r in reads],
            [r.ripe_at_or_before for r in reads], key_idx, keys)
    out: list[list[dict[str, Any]]] = [[] for _ in reads]
    for row in rows:
        out[row["idx"]].append({"key": row["key"], "value": row["value"],
                                "updated_at": row["updated_at"]})
    return out


async def streams_status(store: Store, name: str | None = None) -> list[asyncpg.Record]:
    """Every query (or the one named) with its state size and committed cycles."""
    async with store.connection() as conn:
        return await conn.fetch(q.STREAMS_STATUS, name)


async def stream_partitions(store: Store, query_id: Any, limit: int) -> list[asyncpg.Record]:
    """A query's partitions with state or cycles, largest state first."""
    async with store.connection() as conn:
        return await conn.fetch(q.STREAM_PARTITIONS, query_id, limit)
