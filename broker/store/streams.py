"""Store functions of the /streams/v1 routes (SQL in streams_sql.py). Each takes the
:class:`~broker.store.db.Store`; errors map like every other store call. A cycle runs
through :func:`broker.store.db.run_transaction`, with :func:`cycle_state` as its first
statement."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from broker.store import streams_sql as q
from broker.store.db import Store, _mapped_errors


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


async def list_queries(store: Store) -> list[asyncpg.Record]:
    async with store.connection() as conn:
        return await conn.fetch(q.QUERY_LIST)


async def cycle_state(conn: asyncpg.Connection, query_id: str, partition_id: str,
                      ops: Sequence[StateOp], group: str, ack_txid: str | None,
                      lease_id: str | None, whole_batch: bool) -> asyncpg.Record:
    """The cycle's first statement, inside its transaction (see streams_sql.CYCLE_STATE)."""
    with _mapped_errors():
        return await conn.fetchrow(
            q.CYCLE_STATE, query_id, partition_id, [o.type for o in ops], [o.key for o in ops],
            [o.value_json for o in ops],  # JSON text, cast to jsonb in SQL
            group, ack_txid, lease_id, whole_batch)


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
