"""Transaction riders: the ``kv`` and ``timers`` arrays of ``POST /api/v1/transaction``,
applied in the PostgreSQL transaction of its pushes and acks (``run_transaction``'s
hooks): the key/value operations first (a lock's guard is among them, and a failed
``required`` one rolls everything back before any push or ack ran), the timer
operations after the last step. Results keep the append-only layout of the answer:
operations, then kv, then timers."""
from __future__ import annotations

from dataclasses import dataclass, field

from broker.service.context import BrokerContext
from broker.service.timers import counted, prepared, scheduled
from broker.store import kv, timers
from broker.store.kv import KvOp
from broker.store.timers import TimerOp
from broker.store.transactions import Connection


@dataclass
class Riders:
    kv_ops: list[KvOp]
    timer_ops: list[TimerOp]
    kv_results: list[dict] = field(default_factory=list)
    timer_results: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.kv_ops or self.timer_ops)

    async def prepare(self, ctx: BrokerContext, producer_sub: str | None) -> None:
        """Timer payloads as their messages will carry them (before the transaction)."""
        if self.timer_ops:
            self.timer_ops = await prepared(ctx, self.timer_ops, producer_sub)

    # The hooks overwrite their results: a transaction rerun after a deadlock runs them again.
    async def before(self, conn: Connection) -> None:
        self.kv_results = []
        if self.kv_ops:
            await kv.apply_ops(conn, self.kv_ops, into=self.kv_results)

    async def after(self, conn: Connection) -> None:
        self.timer_results = await timers.apply_ops(conn, self.timer_ops) if self.timer_ops \
            else []

    def committed(self, ctx: BrokerContext) -> None:
        """After commit: this broker's sweeper learns of the new timers (and its
        counters of their verdicts)."""
        scheduled(ctx, self.timer_ops, self.timer_results)
        counted(ctx, self.timer_results)
