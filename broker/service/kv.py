"""The key/value surface (``POST /api/v1/kv`` and its path-style sugar): a batch of
operations applied in order in one PostgreSQL transaction (broker/store/kv.py has the
semantics of each operation)."""
from __future__ import annotations

from broker.service.context import BrokerContext
from broker.store import kv
from broker.store.kv import BatchOutcome, KvOp

# re-exported for broker/http, which imports no store module
from broker.store.kv import KvPreconditionFailed as KvPreconditionFailed
from broker.store.kv import rolled_back as rolled_back


async def batch(ctx: BrokerContext, ops: list[KvOp]) -> BatchOutcome:
    """Results index-aligned with ``ops``; a required operation that did not apply rolls
    the whole batch back (``failed`` says which)."""
    if not ops:
        return BatchOutcome([], None)
    return await kv.batch(ctx.store, ops)
