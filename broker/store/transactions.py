"""Transactions: several steps on one connection, committed together or not at all, and
the rerun of a transaction PostgreSQL aborted for a deadlock (shared with the streams
cycle)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias, TypeVar

import asyncpg
from loguru import logger

from broker.store.db import Store
from broker.store.errors import (
    PartitionHeld,
    StoreBusy,
    StoreConflict,
    TransactionAborted,
    mapped_errors,
)

Connection: TypeAlias = asyncpg.Connection
"""The transaction's connection as a hook receives it: outside the store it is only handed
on to store functions that run inside the transaction (kv.apply_ops, timers.apply_ops)."""

Hook = Callable[[Connection], Awaitable[None]]
"""Extra work of a transaction on its connection (the key/value and timer riders): it
keeps its own results, and raises to roll the whole transaction back. It runs again
when the transaction is rerun after a deadlock, so it must overwrite, not append."""


async def run_transaction(store: Store, steps: list[tuple[str, list]],
                          required_leases: list[str], *, before: Hook | None = None,
                          after: Hook | None = None) -> list:
    """Run push and ack steps atomically, in order, on one connection.

    ``steps`` is a list of ("push", [PushRow]) / ("ack", [AckRow]); consecutive
    operations of one kind arrive folded into one step, so each step is one
    round trip. Returns the per-step result rows. Any failed ack, or a
    required lease that is not live, raises TransactionAborted and nothing is
    committed. Acks marked failed go straight to the DLQ (docs/wire-contract.md §7).
    ``before`` runs after the lease check and before the first step, ``after``
    after the last step, both inside the same PostgreSQL transaction.
    """
    return await rerun_on_conflict(
        lambda: _transaction_once(store, steps, required_leases, before, after))


T = TypeVar("T")


async def rerun_on_conflict(once: Callable[[], Awaitable[T]]) -> T:
    """Run a transaction (``once``), again when PostgreSQL aborted it for a deadlock or a
    serialization failure (StoreConflict), at most three times; then StoreBusy (a 503)."""
    for attempt in range(3):
        try:
            return await once()
        except StoreConflict:
            # Two transactions locked partitions and cursors in opposite orders;
            # PostgreSQL aborted this one, so nothing was committed: run it again.
            if attempt == 2:
                raise StoreBusy("transaction kept deadlocking; retry later") from None
            logger.info("transaction deadlocked; retrying")
    raise AssertionError("unreachable")


async def _transaction_once(store: Store, steps: list[tuple[str, list]],
                            required_leases: list[str], before: Hook | None,
                            after: Hook | None) -> list:
    results: list = []
    async with store.connection() as conn:
        with mapped_errors():
            async with conn.transaction():
                if required_leases:
                    live = await store.live_leases(required_leases, conn)
                    dead = [lid for lid in required_leases if lid not in live]
                    if dead:
                        raise TransactionAborted(f"Invalid or expired lease: {dead[0]}",
                                                 dead_lease=dead[0])
                if before is not None:
                    await before(conn)
                for step, (kind, rows) in enumerate(steps):
                    if kind == "push":
                        pushed = await store.push(rows, conn=conn)
                        refused = next((r for r in pushed if r["status"] == "refused"), None)
                        if refused is not None:  # past the queue's maxSize: roll it all back
                            raise TransactionAborted(refused["error"])
                        held = next((n for n, r in enumerate(pushed)
                                     if r["status"] == "staged"), None)
                        if held is not None:
                            raise PartitionHeld(rows[held].queue, rows[held].partition)
                        results.append(pushed)
                    else:
                        acked = await store.ack(rows, failed_to_dlq=True, conn=conn)
                        results.append(acked)
                        bad = next((n for n, r in enumerate(acked) if not r["success"]), None)
                        if bad is not None:
                            raise TransactionAborted(acked[bad]["error"] or "ack failed",
                                                     failed_at=(step, bad))
                if after is not None:
                    await after(conn)
    return results

