"""The rows of the key/value namespace ``queen-supervisor``, where the official clients'
``consume().supervision({...})`` publish each consumer's status (docs/supervision.md §2):
per slot ``<group>/<instance>``, a head ``<slot>/head`` and chunks ``<slot>/chunk/NNNN``
written together in one batch (one transaction), each with a TTL.

The operator's view reads them in one read-only snapshot (a head and its chunks are
always of one publication), live rows only (the predicate of every KV read, so an expired
status is gone at once, before the retention job deletes its row). Any client with write
access may put anything there, so every read is bounded: heads by count and size, chunk
values by size and by a byte budget for the whole answer. What the heads mean, and which
chunks to read, is the service's business (broker/service/supervision.py); this module
only reads."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.store.db import Store

Record = Any  # asyncpg.Record rows

NAMESPACE = "queen-supervisor"
"""The one ``queen-`` namespace clients write (broker/http/wire/kv.py)."""

_LIVE = "(k.expires_at IS NULL OR k.expires_at > now())"
_HEAD = "right(k.key, 5) = '/head' AND NOT starts_with(k.key, 'coordination/')"
_CHUNK = "k.key ~ '/chunk/[0-9]{4}$'"

SUMMARY = f"""
SELECT count(*) AS keys,
       count(*) FILTER (WHERE {_HEAD}) AS heads,
       count(*) FILTER (WHERE {_CHUNK}) AS chunks
FROM queen.kv k
WHERE k.namespace = $1 AND {_LIVE}
"""
"""Live keys of the namespace: all, heads (keys ending in ``/head``, but not under
``coordination/``, which upstream supervisors keep for themselves), chunks."""

HEADS = f"""
SELECT k.key, CASE WHEN octet_length(k.value::text) <= $4 THEN k.value END AS value,
       octet_length(k.value::text)::bigint AS size, k.updated_at, k.expires_at
FROM queen.kv k
WHERE k.namespace = $1 AND {_LIVE} AND {_HEAD}
  AND k.key >= $2 AND starts_with(k.key, $2)
ORDER BY k.key
LIMIT $3
"""
"""The live heads of namespace $1 whose key starts with $2, in byte order, at most $3;
a value over $4 bytes of JSON text is left out (NULL, its ``size`` says why)."""

CHUNKS = f"""
SELECT c.key, c.size, c.running > $4 AS over_budget,
       CASE WHEN c.size <= $3 AND c.running <= $4 THEN c.value END AS value
FROM (SELECT k.key, k.value, octet_length(k.value::text)::bigint AS size,
             sum(CASE WHEN octet_length(k.value::text) <= $3
                      THEN octet_length(k.value::text) ELSE 0 END)
                 OVER (ORDER BY k.key) AS running
      FROM queen.kv k
      WHERE k.namespace = $1 AND k.key = ANY($2::text[]) AND {_LIVE}) c
ORDER BY c.key
"""
"""The live rows among keys $2 of namespace $1, in byte order. A value is sent only when
it is at most $3 bytes of JSON text and the values sent before it and with it stay
within $4 bytes (``over_budget`` otherwise); ``size`` is always there."""

DB_NOW = "SELECT now()"
"""The database's clock: staleness is reckoned against it, never a browser's."""


@dataclass(frozen=True)
class Snapshot:
    """One read: the heads (key, value or None, size, updated_at, expires_at), one more
    than asked when there are more; the chunks read (key, value or None, size,
    over_budget); the namespace's key counts; the database's clock."""
    heads: list[Record]
    chunks: list[Record]
    summary: Record
    now: dt.datetime


async def read(store: Store, prefix: str, head_limit: int, head_max_bytes: int,
               chunk_keys: Callable[[list[Record]], list[str]], chunk_max_bytes: int,
               budget_bytes: int) -> Snapshot:
    """Up to ``head_limit`` + 1 heads under ``prefix``, then the chunks ``chunk_keys``
    names for them, in one repeatable-read snapshot."""
    async with store.connection() as conn:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            heads = list(await conn.fetch(HEADS, NAMESPACE, prefix, head_limit + 1,
                                          head_max_bytes))
            wanted = chunk_keys(heads[:head_limit])
            chunks = list(await conn.fetch(CHUNKS, NAMESPACE, wanted, chunk_max_bytes,
                                           budget_bytes)) if wanted else []
            summary = await conn.fetchrow(SUMMARY, NAMESPACE)
            now = await conn.fetchval(DB_NOW)
    return Snapshot(heads, chunks, summary, now)
