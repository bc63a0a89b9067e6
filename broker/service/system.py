"""The broker's own state for operators: the maintenance flags (docs/behaviour.md §4.2,
docs/wire-contract.md §15.4) and the database as /health and the cluster view see it.

The database holds the truth of the flags (queen.system_state); each broker mirrors both
in memory, and the hot paths read only the mirror. A flip persists the flag, then sets
the local mirror and tells the peers; a peer that misses the hint catches up at its next
reconcile."""
from __future__ import annotations

from actors.live_series import THROUGHPUT_SECONDS as THROUGHPUT_SECONDS
from broker.service.context import BrokerContext
from broker.store.errors import StoreError, StoreUnavailable
from broker.store.schema import schema_version

# THROUGHPUT_SECONDS: how far back the per-second throughput series reaches (its ring's
# length, actors/live_series.py), the bound of the live route's ``seconds``.

FLAG_KEYS = {"push": "maintenance_mode", "pop": "pop_maintenance_mode"}


async def flip(ctx: BrokerContext, which: str, enabled: bool) -> None:
    """Store the flag (``which``: push or pop) first, then flip it here and tell the peers.
    A flip that cannot be stored raises (the store's error: a 503) and changes nothing:
    flipping only this broker would be undone by its own reconcile loop, which re-reads
    the flag from the database, after the route had answered that maintenance was on."""
    await ctx.store.set_system_flag(FLAG_KEYS[which], enabled)
    ctx.flags.set(which, enabled, "HTTP")
    ctx.hints.maintenance_changed(which, enabled)


async def refresh_flags(ctx: BrokerContext) -> None:
    """Read both flags fresh (the mirror stays as it is when the database is down)."""
    try:
        state = await ctx.store.read_system_flags()
    except (StoreUnavailable, StoreError):
        return
    ctx.flags.set("push", state.get("maintenance_mode", False), "read")
    ctx.flags.set("pop", state.get("pop_maintenance_mode", False), "read")


async def database_reachable(ctx: BrokerContext) -> bool:
    """PostgreSQL answers and takes writes (a standby answers but does not)."""
    return await ctx.store.ping()


async def database_state(ctx: BrokerContext) -> tuple[bool, dict]:
    """(reachable and writable, the server in use: address, readOnly, schemaVersion)."""
    ok = await ctx.store.ping()
    server = ctx.store.server
    return ok, {"address": server.address, "readOnly": server.read_only,
                "schemaVersion": schema_version()}
