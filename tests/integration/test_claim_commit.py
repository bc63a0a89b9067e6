"""A pop's claim commits asynchronously, and nothing else does (docs/behaviour.md §1.6).

Invariant: the pop statement turns synchronous_commit off for its own transaction only. The
connection it ran on goes back to the server's setting for the next statement (a push or an
ack through the same pooled connection waits for its flush), and inside a transaction block
the setting ends with that block.
"""
from __future__ import annotations

import uuid

from broker.core.domain import QUEUE_MODE, PushRow
from broker.core.ids import new_uuid7
from broker.store import sql
from broker.store.db import Store


def pop_args(queue: str) -> tuple:
    return (queue, None, None, None, QUEUE_MODE, 10, 1, False, new_uuid7(), None, False)


async def test_the_pop_statement_commits_its_claim_asynchronously_and_only_it(database):
    store = await Store.connect(database.dsn, pool_size=1, connect_timeout_ms=5000,
                                statement_timeout_ms=30000, lock_timeout_ms=10000,
                                idle_timeout_ms=30000)
    try:
        queue = f"claim-commit-{uuid.uuid4().hex[:8]}"
        await store.push([PushRow(queue=queue, partition="p", message_id=new_uuid7(),
                                  transaction_id=f"tx-{i}", trace_id=None, payload={"i": i})
                          for i in range(3)])
        async with store.connection() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            async with conn.transaction():
                rows = await conn.fetch(sql.POP, *pop_args(queue))
                assert [r["kind"] for r in rows].count("msg") == 3
                assert await conn.fetchval("SHOW synchronous_commit") == "off"
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        # Through the store (its own implicit transaction): the one pooled connection is
        # back to the server's setting for whatever runs on it next.
        await store.pop(queue=queue, partition=None, namespace=None, task=None,
                        group="g", batch=10, max_partitions=1, auto_ack=False,
                        lease_id=new_uuid7())
        async with store.connection() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await store.close()
