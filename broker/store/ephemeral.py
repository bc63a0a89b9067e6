"""The ephemeral queues' declared configuration in PostgreSQL (``queen.ephemeral_queues``,
migration 0014): read at start, merged on configure, removed on delete. The messages never
come here (actors/ephemeral)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.store import ephemeral_sql as sql
from broker.store.db import Store


async def declared(store: Store) -> list[tuple[str, dict[str, Any]]]:
    """Every declared queue with its stored knobs (wire names), by name."""
    async with store.connection() as conn:
        rows = await conn.fetch(sql.DECLARED)
    return [(r["name"], r["options"]) for r in rows]


async def declare(store: Store, queue: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``knobs`` over the queue's stored ones (a None knob removes it); answers what is
    stored now."""
    async with store.connection() as conn:
        return await conn.fetchval(sql.DECLARE, queue, dict(knobs))


async def forget(store: Store, queue: str) -> bool:
    """Remove the queue's declaration; True when there was one."""
    async with store.connection() as conn:
        return bool(await conn.fetchval(sql.FORGET, queue))
