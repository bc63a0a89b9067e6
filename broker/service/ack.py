"""Acknowledgements, transactions and lease renewal (docs/wire-contract.md §6-§8), and the
wakes a released lease owes the pops parked on its partition."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.core.domain import AckRow, PushItem
from broker.core.ids import new_uuid7
from broker.core.telemetry import telemetry
from broker.service.context import BrokerContext
from broker.service.push import to_rows, wake_after_commit
from broker.store.errors import PartitionHeld, TransactionAborted
from broker.store.kv import KvPreconditionFailed
from broker.store.transactions import run_transaction

if TYPE_CHECKING:
    from broker.service.riders import Riders


def leases_released(ctx: BrokerContext, rows: Sequence[AckRow], results: Sequence[Any]) -> None:
    """A released lease makes its partition claimable again (if it holds more
    messages): the hot-list gets it back, and pops parked on it here and on
    the peers are woken, instead of waiting out their backoff."""
    released = [(r["queue_name"], row.consumer_group, r["partition_name"])
                for row, r in zip(rows, results) if r["lease_released"]]
    if released:
        ctx.hints.released(released)


async def ack(ctx: BrokerContext, rows: list[AckRow]) -> list[Any]:
    """Apply acks (folded with concurrent ones); one result row per ack."""
    results = await (await ctx.ack_batcher.submit(rows))
    leases_released(ctx, rows, results)
    for row, r in zip(rows, results):
        telemetry.messages["dlq" if r["dlq"] else "acked_" + row.status if r["success"]
                           else "ack_rejected"] += 1
    count_acks(rows, results)
    return results


def refuse_held(ctx: BrokerContext, pushes: Sequence[PushItem]) -> None:
    """PartitionHeld for the first push to a partition this broker's spool still holds:
    a push inside a transaction cannot wait in the spool, and committing it now would put
    it ahead of the spooled ones."""
    held = next(((i.queue, i.partition) for i in pushes
                 if ctx.spool_backlog.holds([(i.queue, i.partition)])), None)
    if held is not None:
        raise PartitionHeld(*held)


def count_acks(rows: Sequence[AckRow], results: Sequence[Any]) -> None:
    """Per-queue ack figures: one request per queue touched; accepted acks as
    success (completed) or failed (failed, dead-lettered included)."""
    queues = set()
    for row, r in zip(rows, results):
        queue = r["queue_name"]
        queues.add(queue)
        if r["success"]:
            telemetry.count(queue, "ack_success" if row.status == "completed" else "ack_failed")
    for queue in queues:
        telemetry.count(queue, "ack_requests")


@dataclass(frozen=True)
class TransactionOutcome:
    transaction_id: str
    steps: list[tuple[str, list]]   # ("push", [PushRow]) | ("ack", [AckRow]), in order
    results: list[list[Any]]        # result rows per step (committed); [] when rolled back
    aborted: TransactionAborted | None  # why it was rolled back, and where
    kv_failed: KvPreconditionFailed | None = None  # a required kv rider op that did not apply


async def transaction(ctx: BrokerContext, flat: list[tuple[str, Any]], required: list[str],
                      producer_sub: str | None, riders: Riders | None = None
                      ) -> TransactionOutcome:
    """Pushes and acks (and the riders' key/value and timer operations) committed
    together or not at all. A push to a partition a spool still holds is refused
    (PartitionHeld, a 503): a transaction cannot wait in the spool, and committing its
    pushes now would put them ahead of the spooled ones."""
    pushes: list[PushItem] = [x for k, x in flat if k == "push"]
    refuse_held(ctx, pushes)
    push_rows = iter(await to_rows(ctx, pushes, producer_sub) if pushes else ())
    steps: list[tuple[str, list]] = []
    for kind, x in flat:
        value = next(push_rows) if kind == "push" else x
        if steps and steps[-1][0] == kind:
            steps[-1][1].append(value)
        else:
            steps.append((kind, [value]))
    txn_id = new_uuid7()
    if riders:
        await riders.prepare(ctx, producer_sub)
    try:
        results = await run_transaction(
            ctx.store, steps, required, before=riders.before if riders else None,
            after=riders.after if riders else None)
    except TransactionAborted as aborted:
        return TransactionOutcome(txn_id, steps, [], aborted)
    except KvPreconditionFailed as failed:
        return TransactionOutcome(txn_id, steps, [], None, failed)
    if riders:
        riders.committed(ctx)
    touched = {i.queue for i in pushes}
    for (kind, rows), res in zip(steps, results):
        if kind == "ack":
            leases_released(ctx, rows, res)
            touched.update(r["queue_name"] for r in res)
    for queue in touched:
        telemetry.count(queue, "transactions")
    wake_after_commit(ctx, {(i.queue, i.partition) for i in pushes})
    return TransactionOutcome(txn_id, steps, results, None)


async def extend_lease(ctx: BrokerContext, lease_id: str, seconds: int):
    """(renewed rows, new expiry, error)."""
    return await ctx.store.extend_lease(lease_id, seconds)
