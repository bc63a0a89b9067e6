"""Keeps this broker's ephemeral rings to the queues it owns (docs/ephemeral.md, "Ownership").

Every MEMBERS_CHECK_S the brokers alive (the mesh's members) are compared with the last ones
seen. On a change, which is counted: every queue whose owner is now another broker loses its
messages here (counted as dropped, reason ``moved``: the new owner starts empty, and a copy
left here would come back stale when ownership returns), and the declarations are read again
from PostgreSQL, so a queue this broker takes over runs with the options last configured
through its previous owner."""
from __future__ import annotations

import asyncio

from loguru import logger

from broker.core.telemetry import telemetry
from broker.service import ephemeral
from broker.service.context import BrokerContext
from broker.service.ownership import owner_of
from broker.store.errors import StoreError, StoreUnavailable

MEMBERS_CHECK_S = 0.5


async def watch_members(ctx: BrokerContext) -> None:
    """Runs until cancelled (the app's shutdown); nothing to do without a mesh."""
    mesh = ctx.mesh
    if mesh is None:
        return
    seen = frozenset(mesh.members())
    while True:
        await asyncio.sleep(MEMBERS_CHECK_S)
        now = frozenset(mesh.members())
        if now != seen:
            seen = now
            await members_changed(ctx, now)


async def members_changed(ctx: BrokerContext, members: frozenset[str]) -> int:
    """Drop the rings of queues now owned elsewhere; reload the declarations. Returns how
    many messages were dropped."""
    telemetry.ephemeral_forwards["members"] += 1
    me = ctx.settings.queen_server_id
    moved = [name for name in list(ctx.ephemeral.queues)
             if owner_of(members, name) != me]
    dropped = sum(ctx.ephemeral.reset(name, "dropped_moved") for name in moved)
    logger.info("ephemeral: brokers alive now {}; {} queue(s) owned elsewhere, {} message(s) "
                "dropped here", sorted(members), len(moved), dropped)
    try:
        await ephemeral.load_declared(ctx)
    except (StoreUnavailable, StoreError) as exc:
        logger.warning("ephemeral: declarations not re-read after the change ({}); a queue "
                       "taken over keeps the options this broker knew", exc)
    return dropped


def owner(ctx: BrokerContext, queue: str) -> tuple[str, str | None]:
    """The broker that owns ``queue`` among the members alive now (the mesh must run), and
    its advertised HTTP API (None: not advertised yet)."""
    assert ctx.mesh is not None
    members = ctx.mesh.members()
    found = owner_of(members, queue)
    return found, members[found]
