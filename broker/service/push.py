"""Push (docs/wire-contract.md §4): encrypt, fold into one statement with concurrent pushes,
wake pops after commit; the spool takes over during maintenance, while
PostgreSQL is unreachable, and while this broker's spool still holds pushes for a
partition. PostgreSQL itself stages a push behind staged or spooled pushes to its
partition (``staged``, answered ``buffered``; docs/spool-drain.md)."""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from loguru import logger

from actors.spool import SpoolError, SpoolFull
from broker.core.domain import PushItem, PushRow
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid, new_uuid7
from broker.core.telemetry import telemetry
from broker.core.validate import Invalid, check_name
from broker.service.context import BrokerContext
from broker.store.errors import StoreUnavailable

Outcome = Literal["stored", "buffered", "mixed", "full", "failed", "refused"]


@dataclass(slots=True)  # not frozen: per item, like broker.core.domain.AckRow
class ItemOutcome:
    """What became of one item. ``status``: PostgreSQL's verdict for an item it stored
    (``queued``, or ``duplicate`` of a transactionId it had), ``staged`` (in
    queen.staged, behind spooled pushes to its partition), ``spooled`` (in this
    broker's spool), ``refused`` (its queue's maxSize: ``error`` says why) or ``failed``
    (the spool could not take it). ``message_id`` and ``partition_id`` for the items
    PostgreSQL stored; ``message_id`` alone for a staged or spooled one: the id the
    message is stored under later."""
    item: PushItem
    status: str
    message_id: str | None = None
    partition_id: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class PushOutcome:
    """What became of one push request: ``items`` in request order, ``outcome`` for the
    whole (the route's status code), ``error`` with full/failed (why the spool refused)
    and refused (every item past its queue's maxSize: the reasons)."""
    outcome: Outcome
    items: list[ItemOutcome]
    error: str | None = None


def checked_producer_sub(sub: str | None) -> str | None:
    """The JWT ``sub`` stamped on pushed messages (never the client's word),
    held to the same acceptance rule as the items."""
    try:
        check_name(sub, "token sub", required=False)
    except Invalid as exc:
        raise BadRequest(f"{exc}; it is stored as producerSub") from None
    return sub


_requests = itertools.count(1)
"""Numbers the push requests of this process (PushRow.request): the store admits or
refuses a request's items of a queue with maxSize together, even folded with others."""


async def to_rows(ctx: BrokerContext, items: list[PushItem],
                  producer_sub: str | None = None) -> list[PushRow]:
    """Mint message ids and encrypt payloads of encrypted queues; the rows are one
    request, checked against their queues' maxSize."""
    request = next(_requests)
    cipher = ctx.cipher
    flags: dict[str, bool] = {}
    if cipher is not None:
        flags = await ctx.queue_cache.encryption_flags({i.queue for i in items})
    rows = []
    for item in items:
        encrypt = cipher is not None and flags.get(item.queue, False)
        rows.append(PushRow(
            queue=item.queue, partition=item.partition, message_id=new_uuid7(),
            transaction_id=item.transaction_id, trace_id=item.trace_id,
            payload=cipher.encrypt(item.payload) if encrypt and cipher else item.payload,
            encrypted=encrypt, producer_sub=producer_sub,
            payload_json=None if encrypt else item.payload_json, request=request,
        ))
    return rows


def wake_after_commit(ctx: BrokerContext, pairs: set[tuple[str, str]]) -> None:
    """Committed pushes wake parked pops here and on peers (never before commit)."""
    if pairs:
        ctx.hints.pushed(sorted(pairs))


async def push(ctx: BrokerContext, items: list[PushItem], producer_sub: str | None
               ) -> PushOutcome:
    outcome = await _push(ctx, items, producer_sub)
    count_pushed(items, outcome.items)
    return outcome


# Accepted items: stored as new messages, or durable and stored in order later.
ACCEPTED = ("queued", "staged", "spooled")


def count_pushed(items: list[PushItem], done: list[ItemOutcome]) -> None:
    """Per-queue push figures: one request per queue named, the items accepted."""
    for queue in {i.queue for i in items}:
        telemetry.count(queue, "push_requests")
    for one in done:
        if one.status in ACCEPTED:
            telemetry.count(one.item.queue, "push_messages")


async def _push(ctx: BrokerContext, items: list[PushItem], producer_sub: str | None
                ) -> PushOutcome:
    if ctx.flags.push:  # maintenance: straight to the spool, no database, no wake
        return await _spool(ctx, items, None, producer_sub)
    if ctx.spool_backlog.holds((i.queue, i.partition) for i in items):
        # Earlier pushes to one of these partitions still wait in this broker's
        # spool (an outage just ended): queue behind them, or the order breaks.
        return await _spool(ctx, items, None, producer_sub)
    rows = None
    try:
        rows = await to_rows(ctx, items, producer_sub)
        results = await (await ctx.push_batcher.submit(rows))
    except StoreUnavailable as exc:
        # The outage itself is told once by the store's DatabaseHealth, not once per push.
        logger.debug("push: {}; spooling {} item(s)", exc, len(items))
        return await _spool(ctx, items, rows, producer_sub)
    wake_after_commit(ctx, {(i.queue, i.partition) for i, r in zip(items, results)
                            if r["status"] == "queued"})
    out, staged, refused = [], 0, 0
    last_pid: Any = None
    pid_text: str | None = None
    for item, pushed, row in zip(items, rows, results):
        status = row["status"]
        if status == "staged":
            # Durable in queen.staged, behind earlier spooled pushes to its
            # partition; the merge stores it in order and wakes the pops.
            staged += 1
        elif status == "refused":  # past its queue's maxSize: nothing kept
            refused += 1
            out.append(ItemOutcome(item, "refused", error=row["error"]))
            continue
        else:
            telemetry.messages[status] += 1
        pid = row["partition_id"]
        if pid != last_pid:  # items come in runs of one partition: one string per run
            last_pid, pid_text = pid, None if pid is None else str(pid)
        # A queued or staged item keeps the id minted for it; a duplicate answers the id
        # of the message it repeats.
        out.append(ItemOutcome(item, status, pushed.message_id if status != "duplicate"
                               else str(row["message_id"]), pid_text))
    if refused:
        telemetry.push_refused["max_size"] += refused
    if refused == len(items):
        reasons = dict.fromkeys(o.error for o in out if o.error)
        return PushOutcome("refused", out, "; ".join(reasons))
    if staged:
        telemetry.messages["staged"] += staged
        ctx.merger.kick()
        return PushOutcome("buffered" if staged == len(items) else "mixed", out)
    return PushOutcome("stored", out)


async def _spool(ctx: BrokerContext, items: list[PushItem], rows: list[PushRow] | None,
                 producer_sub: str | None) -> PushOutcome:
    """Accept a push into the node-local spool: ``spooled`` per item; ``full``
    when the spool is at its cap, or ``failed`` for every item when it cannot
    write (nothing half-kept)."""
    # The id each item is answered with is minted now and spooled with it: the drain
    # stores the message under that id (service/drain.py), as a queued push's is.
    ids = [row.message_id for row in rows] if rows else [new_uuid7() for _ in items]
    problem = await _to_spool(ctx, items, rows, ids, producer_sub)
    if problem is not None:
        kind, error = problem
        return PushOutcome(kind, [ItemOutcome(i, "failed") for i in items], error)
    return PushOutcome("buffered", [ItemOutcome(i, "spooled", mid) for i, mid in zip(items, ids)])


async def _to_spool(ctx: BrokerContext, items: list[PushItem], rows: list[PushRow] | None,
                    ids: list[str], producer_sub: str | None
                    ) -> tuple[Literal["full", "failed"], str] | None:
    """Append one push to the spool; None when it is on disk, else why not.
    When the payloads were already encrypted (the queue's flag was known) the
    envelope is spooled; otherwise the drain encrypts at replay."""
    events = []
    for n, item in enumerate(items):
        row = rows[n] if rows else None
        events.append({"queue": item.queue, "partition": item.partition,
                       "transactionId": item.transaction_id, "messageId": ids[n],
                       "payload": row.payload if row else item.payload,
                       "encrypted": bool(row and row.encrypted),
                       "traceId": item.trace_id,
                       "producerSub": row.producer_sub if row else producer_sub})
    try:
        # Two steps: the actor writes the records (and takes the next push), then the
        # sync that covers them returns (FILE_BUFFER_FSYNC); only then is it acknowledged.
        await (await ctx.spool.append(events))
    except SpoolFull as exc:
        logger.warning("push: {} ({} item(s) refused)", exc, len(items))
        telemetry.messages["spool_full"] += len(items)
        return "full", str(exc)
    except SpoolError as exc:
        logger.error("push: spool write failed for {} item(s): {}", len(items), exc)
        telemetry.messages["spool_failed"] += len(items)
        return "failed", str(exc)
    telemetry.messages["buffered"] += len(items)
    if ctx.store.health.down:  # told when the database is back
        ctx.store.health.spooled(len(items))
    return None


def spooled_message_id(event: Mapping[str, Any]) -> str:
    """The id a spooled push was answered with (``messageId``), or a new one for an event
    spooled before the spool kept ids (or holding no UUID there)."""
    mid = event.get("messageId")
    return str(mid) if is_uuid(mid) else new_uuid7()


async def push_spooled(ctx: BrokerContext, events: list[dict]) -> list[Any]:
    """Push spooled events directly (an operator replaying a quarantined
    event): transactionIds kept, payloads of encrypted queues sealed when they
    were spooled plain. One row per event, as Store.push answers."""
    cipher = ctx.cipher
    plain_queues = {e["queue"] for e in events if not e.get("encrypted")}
    flags = (await ctx.queue_cache.encryption_flags(plain_queues)
             if cipher and plain_queues else {})
    rows = []
    for e in events:
        payload, encrypted = e.get("payload"), bool(e.get("encrypted"))
        if not encrypted and cipher is not None and flags.get(e["queue"], False):
            payload, encrypted = cipher.encrypt(payload), True
        rows.append(PushRow(queue=e["queue"], partition=e.get("partition") or "Default",
                            message_id=spooled_message_id(e), transaction_id=e["transactionId"],
                            trace_id=e.get("traceId"), payload=payload, encrypted=encrypted,
                            producer_sub=e.get("producerSub")))
    results = await ctx.store.push(rows)
    wake_after_commit(ctx, {(r.queue, r.partition) for r, res in zip(rows, results)
                            if res["status"] == "queued"})
    if any(res["status"] == "staged" for res in results):
        ctx.merger.kick()
    return results
