"""The spool's quarantine for operators (routes/quarantine.py): spooled pushes the replay
could not store, listed, shown, replayed (with the queue or partition overridden) or
discarded. The quarantine is node-local, like the spool."""
from __future__ import annotations

from typing import Any

from actors.spool.quarantine import valid_id
from broker.core.errors import BadRequest
from broker.service.context import BrokerContext
from broker.store.errors import StoreError


class ReplayRefused(Exception):
    """The entry cannot be replayed as it is (its event is not valid, or PostgreSQL
    refused it again): it stays in the quarantine. The message says why."""


def entry_id(value: str) -> str:
    """``value`` when it is a quarantine id, else a 400."""
    if not valid_id(value):
        raise BadRequest(f"not a quarantine id: {value[:80]!r}")
    return value


async def entries(ctx: BrokerContext) -> list[Any]:
    return await ctx.spool.quarantine_list()


async def entry(ctx: BrokerContext, ident: str) -> Any:
    """The entry with its event, or None."""
    return await ctx.spool.quarantine_get(entry_id(ident))


async def replay(ctx: BrokerContext, ident: str, overrides: dict[str, str]) -> Any:
    """Push the entry's event now; raises LookupError (no such entry) or ReplayRefused."""
    try:
        return await ctx.spool.quarantine_replay(entry_id(ident), overrides)
    except (ValueError, StoreError) as exc:  # still refused by PostgreSQL: kept
        raise ReplayRefused(str(exc)) from exc


async def discard(ctx: BrokerContext, ident: str) -> bool:
    return await ctx.spool.quarantine_discard(entry_id(ident))
