"""Push (api.md §4): validate, encrypt, fold into one statement with concurrent
pushes, wake pops after commit; the spool takes over during maintenance, while
PostgreSQL is unreachable, and while a partition still has spooled pushes."""
from __future__ import annotations

from loguru import logger
from sanic import Blueprint, Request

from actors.spool import SpoolError
from broker.http import json, read_json
from broker.store.db import PushRow, StoreUnavailable
from broker.telemetry import telemetry
from broker.wire import PushItem, check_item_count, new_uuid7, parse_push, push_result

bp = Blueprint("push")


async def to_rows(app, items: list[PushItem], producer_sub: str | None = None) -> list[PushRow]:
    """Mint message ids and encrypt payloads of encrypted queues."""
    cipher = app.ctx.cipher
    flags: dict[str, bool] = {}
    if cipher is not None:
        flags = await app.ctx.queue_cache.encryption_flags({i.queue for i in items})
    rows = []
    for item in items:
        encrypt = cipher is not None and flags.get(item.queue, False)
        rows.append(PushRow(
            queue=item.queue, partition=item.partition, message_id=new_uuid7(),
            transaction_id=item.transaction_id, trace_id=item.trace_id,
            payload=cipher.encrypt(item.payload) if encrypt else item.payload,
            encrypted=encrypt, producer_sub=producer_sub,
        ))
    return rows


def wake_after_commit(app, pairs: set[tuple[str, str]]) -> None:
    """Committed pushes wake parked pops here and on peers (never before commit)."""
    if pairs:
        app.ctx.hints.pushed(sorted(pairs))


@bp.post("/api/v1/push")
async def push(request: Request):
    app = request.app
    producer_sub = getattr(request.ctx, "producer_sub", None)  # JWT sub; never the client's
    items = parse_push(read_json(request))
    check_item_count(len(items), app.ctx.settings.push_max_items_per_request)
    if not items:
        return json([], status=201)
    if app.ctx.flags.push:  # maintenance: straight to the spool, no database, no wake
        return await _spool(app, items, None, producer_sub)
    if app.ctx.spool_backlog.holds((i.queue, i.partition) for i in items):
        # Earlier pushes to one of these partitions still wait in the spool (an
        # outage just ended): queue behind them, or the partition's order breaks.
        return await _spool(app, items, None, producer_sub)
    rows = None
    try:
        rows = await to_rows(app, items, producer_sub)
        results = await (await app.ctx.push_batcher.submit(rows))
    except StoreUnavailable as exc:
        logger.warning("push: {}; spooling {} item(s)", exc, len(items))
        return await _spool(app, items, rows, producer_sub)
    wake_after_commit(app, {(i.queue, i.partition) for i, r in zip(items, results)
                            if r["status"] == "queued"})
    for r in results:
        telemetry.messages[r["status"]] += 1
    return json([push_result(item, row, n) for n, (item, row) in enumerate(zip(items, results))])


async def _spool(app, items: list[PushItem], rows: list[PushRow] | None,
                 producer_sub: str | None = None):
    """Accept a push into the node-local spool: ``buffered`` per item, or
    ``failed`` for every item when the spool cannot write (nothing half-kept).
    When the payloads were already encrypted (the queue's flag was known) the
    envelope is spooled; otherwise the drain encrypts at replay."""
    events = []
    for n, item in enumerate(items):
        row = rows[n] if rows else None
        events.append({"queue": item.queue, "partition": item.partition,
                       "transactionId": item.transaction_id,
                       "payload": row.payload if row else item.payload,
                       "encrypted": bool(row and row.encrypted),
                       "traceId": item.trace_id,
                       "producerSub": row.producer_sub if row else producer_sub})
    try:
        await app.ctx.spool.append(events)
    except SpoolError as exc:
        logger.error("push: spool write failed for {} item(s): {}", len(items), exc)
        telemetry.messages["spool_failed"] += len(items)
        return json([{"index": n, "status": "failed", "queue": i.queue, "partition": i.partition,
                      "transactionId": i.transaction_id, "error": str(exc)}
                     for n, i in enumerate(items)], status=500)
    telemetry.messages["buffered"] += len(items)
    return json([{"index": n, "status": "buffered", "queue": i.queue, "partition": i.partition,
                  "transactionId": i.transaction_id} for n, i in enumerate(items)], status=201)


async def replay_spooled(app, events: list[dict]) -> None:
    """The spool's replay: one transaction per chunk, transactionIds kept, so a
    replay after a crash finds duplicates and counts them as success."""
    cipher = app.ctx.cipher
    plain_queues = {e["queue"] for e in events if not e.get("encrypted")}
    flags = await app.ctx.queue_cache.encryption_flags(plain_queues) if cipher and plain_queues else {}
    rows = []
    for e in events:
        payload, encrypted = e.get("payload"), bool(e.get("encrypted"))
        if not encrypted and cipher is not None and flags.get(e["queue"], False):
            payload, encrypted = cipher.encrypt(payload), True
        rows.append(PushRow(queue=e["queue"], partition=e.get("partition") or "Default",
                            message_id=new_uuid7(), transaction_id=e["transactionId"],
                            trace_id=e.get("traceId"), payload=payload, encrypted=encrypted,
                            producer_sub=e.get("producerSub")))
    results = await app.ctx.store.push(rows)
    wake_after_commit(app, {(r.queue, r.partition) for r, res in zip(rows, results)
                            if res["status"] == "queued"})
