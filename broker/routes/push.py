"""Push (api.md §4): validate, encrypt, fold into one statement with concurrent
pushes, wake pops after commit; the spool takes over during maintenance, while
PostgreSQL is unreachable, and while a partition still has spooled pushes."""
from __future__ import annotations

import ujson
from loguru import logger
from sanic import Blueprint, Request

from actors.spool import SpoolError, SpoolFull, accepted_at
from broker.http import json, read_json
from broker.store.db import PushRow, StoreUnavailable
from broker.telemetry import telemetry
from broker.validate import Invalid, check_name
from broker.wire import BadRequest, PushItem, check_item_count, new_uuid7, parse_push, push_result

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
            payload_json=None if encrypt else item.payload_json,
        ))
    return rows


def checked_producer_sub(request: Request) -> str | None:
    """The JWT ``sub`` stamped on pushed messages (never the client's word),
    held to the same acceptance rule as the items."""
    sub = getattr(request.ctx, "producer_sub", None)
    try:
        check_name(sub, "token sub", required=False)
    except Invalid as exc:
        raise BadRequest(f"{exc}; it is stored as producerSub") from None
    return sub


def wake_after_commit(app, pairs: set[tuple[str, str]]) -> None:
    """Committed pushes wake parked pops here and on peers (never before commit)."""
    if pairs:
        app.ctx.hints.pushed(sorted(pairs))


@bp.post("/api/v1/push")
async def push(request: Request):
    app = request.app
    producer_sub = checked_producer_sub(request)
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
    held = [n for n, r in enumerate(results) if r["status"] == "held"]
    if held:
        # Another broker's spool (or this one's, after a restart) still holds
        # pushes for these partitions: queue behind them in our own spool.
        return await _spool_held(app, items, rows, results, held, producer_sub)
    for r in results:
        telemetry.messages[r["status"]] += 1
    return json([push_result(item, row, n) for n, (item, row) in enumerate(zip(items, results))])


async def _spool_held(app, items: list[PushItem], rows: list[PushRow], results, held: list[int],
                      producer_sub: str | None):
    """Some items committed, the ``held`` ones go to the spool: one answer per item."""
    outcome, problem = await _to_spool(app, [items[n] for n in held], [rows[n] for n in held],
                                       producer_sub, registered=True)
    out = []
    for n, (item, row) in enumerate(zip(items, results)):
        if row["status"] == "held":
            out.append({"index": n, "status": "buffered" if problem is None else "failed",
                        "queue": item.queue, "partition": item.partition,
                        "transactionId": item.transaction_id,
                        **({"error": problem} if problem else {})})
        else:
            telemetry.messages[row["status"]] += 1
            out.append(push_result(item, row, n))
    if problem is not None:
        return _retry_later(json(out, status=503))
    return json(out, status=201 if len(held) == len(items) else 200)


async def _spool(app, items: list[PushItem], rows: list[PushRow] | None,
                 producer_sub: str | None = None):
    """Accept a push into the node-local spool: ``buffered`` per item; 503
    when the spool is full, or ``failed`` for every item when it cannot write
    (nothing half-kept)."""
    outcome, problem = await _to_spool(app, items, rows, producer_sub)
    if outcome == "full":
        return _retry_later(json({"error": problem}, status=503))
    if outcome == "failed":
        return _retry_later(json(
            [{"index": n, "status": "failed", "queue": i.queue, "partition": i.partition,
              "transactionId": i.transaction_id, "error": problem}
             for n, i in enumerate(items)], status=503))
    return json([{"index": n, "status": "buffered", "queue": i.queue, "partition": i.partition,
                  "transactionId": i.transaction_id} for n, i in enumerate(items)], status=201)


async def _to_spool(app, items: list[PushItem], rows: list[PushRow] | None,
                    producer_sub: str | None, registered: bool = False) -> tuple[str, str | None]:
    """Append one push to the spool: ("buffered", None), ("full", error) or
    ("failed", error). When the payloads were already encrypted (the queue's
    flag was known) the envelope is spooled; otherwise the drain encrypts at
    replay. ``registered``: PostgreSQL already lists this broker as holding
    these partitions (a held push)."""
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
        await app.ctx.spool.append(events, registered=registered)
    except SpoolFull as exc:
        logger.warning("push: {} ({} item(s) refused)", exc, len(items))
        telemetry.messages["spool_full"] += len(items)
        return "full", str(exc)
    except SpoolError as exc:
        logger.error("push: spool write failed for {} item(s): {}", len(items), exc)
        telemetry.messages["spool_failed"] += len(items)
        return "failed", str(exc)
    telemetry.messages["buffered"] += len(items)
    return "buffered", None


def _retry_later(response):
    """Nothing was acknowledged; the client may send the same push again."""
    response.headers["Retry-After"] = "1"
    return response


async def replay_spooled(app, events: list[dict], next_accept: list[int] | None) -> list:
    """The spool's replay: one transaction per chunk, transactionIds kept, so a
    replay after a crash finds duplicates and counts them as success. With
    ``next_accept`` the chunk is merged into the cluster's accept order (items
    behind a peer's earlier spooled push answer ``waiting``); without it (an
    operator replaying a quarantined event) it is a direct push (``held``
    while spooled pushes to its partition wait)."""
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
    store = app.ctx.store
    if next_accept is None:
        results = await store.push(rows)
    else:
        results = await store.replay(rows, [accepted_at(e) for e in events], next_accept)
    wake_after_commit(app, {(r.queue, r.partition) for r, res in zip(rows, results)
                            if res["status"] == "queued"})
    return results
