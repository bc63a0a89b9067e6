"""How Python values go to PostgreSQL and back: every pooled connection's json and
jsonb codecs, COPY's binary jsonb, and the compact argument shapes of the push and
ack statements (a column whose items agree goes as one value, which the statement
fills into its array, because asyncpg checks each array element against
collections.abc ABCs; sql.PUSH_ORDERED says more)."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import ujson

from broker.core.domain import AckRow, PushRow


def dumps(value: Any) -> str:
    return ujson.dumps(value, escape_forward_slashes=False)


async def json_codecs(conn: asyncpg.Connection) -> None:
    """Every pooled connection's json and jsonb codecs: Python values in, out."""
    await conn.set_type_codec("jsonb", encoder=dumps, decoder=ujson.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=dumps, decoder=ujson.loads, schema="pg_catalog")


@contextlib.asynccontextmanager
async def jsonb_for_copy(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """COPY is binary, and the pool's jsonb codec is text: for the duration,
    jsonb goes as its binary form (a version byte, 1, then the JSON text,
    given as str), then the pool's codec is set again (json_codecs)."""
    await conn.set_type_codec("jsonb", schema="pg_catalog", format="binary",
                              encoder=lambda text: b"\x01" + text.encode(),
                              decoder=lambda data: ujson.loads(data[1:]))
    try:
        yield
    finally:
        if not conn.is_closed():
            await json_codecs(conn)


def uniform(values: list[Any]) -> tuple[Any, list[Any] | None]:
    """(the value, None) when every element of ``values`` (not empty) equals the first,
    else (None, ``values``): a compact call's scalar-or-array pair (see sql.PUSH_ORDERED)."""
    first = values[0]
    return (first, None) if values.count(first) == len(values) else (None, values)


def _payloads(rows: Sequence[PushRow]) -> list[str]:
    return [r.payload_json if r.payload_json is not None else dumps(r.payload) for r in rows]


def push_arrays(rows: Sequence[PushRow], accept: Sequence[int], server_id: str,
                order_wait_ms: int, settle_ms: int) -> tuple:
    """push_ordered_v3's plain parallel arrays, one element per item: the streams cycle
    passes them on (store/streams.py); the data path's own call is :func:`push_call`."""
    return (
        list(range(len(rows))),
        [r.queue for r in rows],
        [r.partition for r in rows],
        [r.message_id for r in rows],
        [r.transaction_id for r in rows],
        [r.trace_id for r in rows],
        _payloads(rows),
        [r.encrypted for r in rows],
        [r.producer_sub for r in rows],
        list(accept), server_id, order_wait_ms, settle_ms,
    )


def push_call(rows: Sequence[PushRow], accept_us: int, server_id: str, order_wait_ms: int,
              settle_ms: int) -> tuple:
    """``sql.PUSH_ORDERED``'s arguments: columns whose items all agree go as one value."""
    n = len(rows)
    queue, queues = uniform([r.queue for r in rows])
    partition, partitions = uniform([r.partition for r in rows])
    traces = [r.trace_id for r in rows]
    encrypted = [r.encrypted for r in rows]
    sub, subs = uniform([r.producer_sub for r in rows])
    request, requests = uniform([r.request for r in rows])
    return (
        n, queues, queue, partitions, partition,
        [r.message_id for r in rows],
        [r.transaction_id for r in rows],
        None if traces.count(None) == n else traces,
        _payloads(rows),
        encrypted if True in encrypted else None,
        subs, sub, accept_us, server_id, order_wait_ms, settle_ms,
        requests, request,
    )


def ack_call(rows: Sequence[AckRow], failed_to_dlq: bool) -> tuple:
    """``sql.ACK``'s arguments: columns whose items all agree go as one value."""
    status, statuses = uniform([r.status for r in rows])
    error, errors = uniform([r.error for r in rows])
    group, groups = uniform([r.consumer_group for r in rows])
    lease, leases = uniform([r.lease_id for r in rows])
    return (len(rows), [r.transaction_id for r in rows], [r.partition_id for r in rows],
            statuses, status, errors, error, groups, group, leases, lease, failed_to_dlq)
