"""Push, pop, ack, transaction and lease routes: the data path (api.md §4–§8)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from loguru import logger
from sanic import Blueprint, Request

from actors.pop_waiters import long_poll
from actors.spool import SpoolError
from broker.http import args, error, json, read_json
from broker.telemetry import telemetry
from broker.store.db import PushRow, StoreUnavailable, TransactionAborted, run_transaction
from broker.wire import (BadRequest, PushItem, ack_result, body_object, iso_milli, new_uuid7,
                         parse_ack_item, parse_group, parse_pop, parse_push, parse_push_item,
                         pop_message, push_result, is_uuid)

bp = Blueprint("messages")


# -- push -------------------------------------------------------------------

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
    if not items:
        return json([], status=201)
    if app.ctx.flags.push:  # maintenance: straight to the spool, no database, no wake
        return await _spool(app, items, None, producer_sub)
    if app.ctx.spool_backlog.holds({(i.queue, i.partition) for i in items}):
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


# -- pop --------------------------------------------------------------------

@bp.get("/api/v1/pop/queue/<queue:str>/partition/<partition:str>", unquote=True)
async def pop_partition(request: Request, queue: str, partition: str):
    return await _pop(request, queue, partition)


@bp.get("/api/v1/pop/queue/<queue:str>", unquote=True)
async def pop_queue(request: Request, queue: str):
    return await _pop(request, queue, None)


@bp.get("/api/v1/pop")
async def pop_discovery(request: Request):
    return await _pop(request, None, None)


async def _pop(request: Request, queue: str | None, partition: str | None):
    app = request.app
    settings = app.ctx.settings
    req = parse_pop(args(request), queue=queue, partition=partition,
                    default_batch=settings.default_batch_size,
                    default_timeout_ms=settings.default_timeout,
                    default_subscription_mode=settings.default_subscription_mode)
    store = app.ctx.store
    if req.subscription_mode is not None:
        key = (req.group, req.queue or "", req.partition or "", req.namespace or "",
               req.task or "")
        stored = app.ctx.queue_cache.subscriptions_stored
        if key not in stored:
            await store.ensure_subscription(
                group=req.group, queue=req.queue or "", partition=req.partition or "",
                namespace=req.namespace or "", task=req.task or "",
                mode=req.subscription_mode, start=req.subscription_from)
            stored.add(key)

    flags = app.ctx.flags
    if flags.pop:
        return await _paused_pop(req)

    lease_id = new_uuid7()
    last_kind = ["empty"]

    async def attempt(hints: list[str]) -> dict | None:
        if flags.pop:  # switched on while this pop was parked: answer empty
            last_kind[0] = "paused"
            return None
        try:
            rows = await _claim(app, req, lease_id, hints)
        except StoreUnavailable:
            if not req.wait:
                raise
            # A long poll rides out an outage: keep waiting, answer empty at the deadline.
            logger.warning("pop on {}: database unavailable, still waiting", req.queue or "*")
            return None
        messages = [r for r in rows if r["kind"] == "msg"]
        if not messages:
            last_kind[0] = rows[-1]["kind"] if rows and rows[-1]["kind"] != "verdict" else "empty"
            return None
        return _pop_answer(app, req, messages, "" if req.auto_ack else lease_id)

    if req.wait:
        deadline = time.monotonic() + req.timeout_ms / 1000
        telemetry.long_polls_in_flight += 1
        try:
            result = await long_poll(
                app.ctx.waiters, req.queue, attempt, deadline,
                initial_ms=settings.pop_wait_initial_interval_ms,
                threshold=settings.pop_wait_backoff_threshold,
                multiplier=settings.pop_wait_backoff_multiplier,
                max_ms=settings.pop_wait_max_interval_ms)
        finally:
            telemetry.long_polls_in_flight -= 1
        if result:
            return json(result)
        if last_kind[0] == "paused":
            return json({"messages": [], "paused": True})
        return json({"success": True, "queue": req.queue, "partition": req.partition,
                     "partitionId": None, "leaseId": None, "consumerGroup": req.group,
                     "messages": []})
    result = await attempt([])
    if result:
        return json(result)
    kind = last_kind[0]
    if kind == "window_buffer":
        return json({"success": True, "queue": req.queue, "partition": req.partition,
                     "leaseId": "", "consumerGroup": req.group, "messages": [],
                     "windowBufferActive": True})
    reason = {"empty": "no_available_partition"}.get(kind, kind)
    return json({"success": False, "error": reason, "messages": []})


# A leased partition is looked at again after at most this long, even when its
# lease is longer: its lease may be released through another broker, whose ack
# this broker's hot-list never hears about.
LEASE_REVISIT_CAP_S = 5.0

# A few candidates beyond the claim budget, so a false positive at the head of
# the ring does not turn a pop with pending partitions into an empty answer.
EXTRA_CANDIDATES = 3


async def _claim(app, req, lease_id: str, hints: list[str]) -> list:
    """One pop attempt. Wildcard pops on one queue take their candidates from
    the hot-list (seeding it from PostgreSQL on first use and when the reseed
    floor is due) and report back what PostgreSQL made of each; an empty ring,
    and every other kind of pop, lets PostgreSQL scan."""
    store, hotlist = app.ctx.store, app.ctx.hotlist
    common = dict(queue=req.queue, partition=req.partition, namespace=req.namespace,
                  task=req.task, group=req.group, batch=req.batch,
                  max_partitions=req.max_partitions, auto_ack=req.auto_ack, lease_id=lease_id)
    if hotlist is None or req.queue is None or req.partition is not None:
        return await store.pop(**common, hints=hints)

    want = req.max_partitions + EXTRA_CANDIDATES
    take = await hotlist.take(req.queue, req.group, want)
    if take.needs_seed:
        try:
            pending = await store.pending_partitions(req.queue, req.group)
        except Exception:
            hotlist.seed_aborted(req.queue, req.group)
            raise
        await hotlist.seed(req.queue, req.group, pending)
        take = await hotlist.take(req.queue, req.group, want)
    candidates = list(dict.fromkeys([*hints, *(name for name, _ in take.entries)]))
    if not candidates:
        # The ring has nothing: let PostgreSQL scan. A partition whose mark was
        # lost (a dropped mesh hint, a push through a broker with no mesh) is
        # then found on the pop's next re-check, not at the next reseed.
        return await store.pop(**common, hints=hints)
    rows = await store.pop(**common, hints=candidates, only_hints=True)
    if take.entries:
        hotlist.check_in(req.queue, req.group, _verdicts(take.entries, rows))
    return rows


def _verdicts(taken: list[tuple[str, int]], rows: list) -> list[tuple]:
    """Hot-list check-in from the pop's verdict rows. A taken partition without a
    verdict was not looked at: requeued when the claim budget ran out, otherwise
    it no longer exists (cleared as empty)."""
    seen = {r["partition_name"]: (r["verdict"], r["verdict_secs"])
            for r in rows if r["kind"] == "verdict"}
    budget_ran_out = any(r["kind"] == "msg" for r in rows)
    out = []
    for name, epoch in taken:
        verdict, secs = seen.get(name, ("requeue" if budget_ran_out else "empty", None))
        if verdict == "took" and secs is not None:
            secs = min(secs, LEASE_REVISIT_CAP_S)
        elif verdict == "leased":
            # the hot-list wants a monotonic deadline
            secs = time.monotonic() + min(secs if secs is not None else 1.0, LEASE_REVISIT_CAP_S)
        out.append((name, epoch, verdict, secs))
    return out


async def _paused_pop(req):
    """Pop maintenance: empty, without touching the database, but still holding a
    waiting pop until its timeout so consumers do not spin."""
    if req.wait:
        await asyncio.sleep(req.timeout_ms / 1000)
    return json({"messages": [], "paused": True})


def _pop_answer(app, req, rows, lease_id: str) -> dict:
    cipher = app.ctx.cipher
    messages = []
    partitions = []
    for row in rows:
        data = row["payload"]
        if row["is_encrypted"] and cipher is not None:
            data = cipher.decrypt(data)
        messages.append(pop_message(row, data, req.group, lease_id))
        if not partitions or partitions[-1] != row["partition_id"]:
            partitions.append(row["partition_id"])
    telemetry.messages["popped"] += len(messages)
    first = rows[0]
    return {
        "success": True,
        "queue": first["queue_name"],
        "partition": first["partition_name"],
        "partitionId": str(first["partition_id"]),
        "leaseId": lease_id,
        "consumerGroup": req.group,
        "partitionsClaimed": len(partitions),
        "messages": messages,
    }


# -- ack --------------------------------------------------------------------

def leases_released(app, rows, results) -> None:
    """A released lease may put a partition with more messages back in the ring."""
    if app.ctx.hotlist is not None:
        for row, r in zip(rows, results):
            if r["lease_released"]:
                app.ctx.hotlist.ack_released(r["queue_name"], row.consumer_group,
                                             r["partition_name"])


async def _ack(request: Request, rows):
    app = request.app
    results = await (await app.ctx.ack_batcher.submit(rows))
    leases_released(app, rows, results)
    for row, r in zip(rows, results):
        telemetry.messages["dlq" if r["dlq"] else "acked_" + row.status if r["success"]
                           else "ack_rejected"] += 1
    return [ack_result(r, row.transaction_id, n) for n, (row, r) in enumerate(zip(rows, results))]


@bp.post("/api/v1/ack")
async def ack(request: Request):
    body = body_object(read_json(request))
    row = parse_ack_item(body, parse_group(body.get("consumerGroup")), batch=False)
    return json(await _ack(request, [row]))


@bp.post("/api/v1/ack/batch")
async def ack_batch(request: Request):
    body = body_object(read_json(request))
    items = body.get("acknowledgments")
    if not isinstance(items, list):
        raise BadRequest("acknowledgments array is required")
    group = parse_group(body.get("consumerGroup"))
    rows = [parse_ack_item(item, group, batch=True) for item in items]
    if not rows:
        return json([])
    return json(await _ack(request, rows))


# -- transaction ------------------------------------------------------------

def _parse_transaction(body: Any):
    body = body_object(body)
    ops = body.get("operations")
    if not isinstance(ops, list):
        raise BadRequest("operations array required")
    if not ops:
        raise BadRequest("operations array cannot be empty")
    required = body.get("requiredLeases") or []
    if not isinstance(required, list) or not all(is_uuid(x) for x in required):
        raise BadRequest("requiredLeases must be an array of lease ids (UUIDs)")
    required = list(dict.fromkeys(required))
    flat: list[tuple[str, Any]] = []  # ("push", PushItem) | ("ack", AckRow)
    for n, op in enumerate(ops):
        if not isinstance(op, dict):
            raise BadRequest(f"operations[{n}] must be an object")
        kind = op.get("type")
        if kind == "push":
            items = op.get("items")
            if not isinstance(items, list):
                raise BadRequest(f"operations[{n}].items array is required")
            flat += [("push", parse_push_item(it, i, default_payload={})) for i, it in enumerate(items)]
        elif kind == "ack":
            row = parse_ack_item(op, parse_group(op.get("consumerGroup")), batch=False)
            if row.lease_id is None and len(required) == 1:
                row = row.__class__(**{**row.__dict__, "lease_id": required[0]})
            flat.append(("ack", row))
        else:
            raise BadRequest(f"operations[{n}].type must be 'push' or 'ack', got {kind!r}")
    return flat, required


@bp.post("/api/v1/transaction")
async def transaction(request: Request):
    flat, required = _parse_transaction(read_json(request))
    app = request.app
    held = {(x.queue, x.partition) for k, x in flat if k == "push"}
    if held and app.ctx.spool_backlog.holds(held):
        # A transaction cannot wait in the spool, and committing its pushes now
        # would put them ahead of spooled pushes to the same partition.
        return error("Pushes to this partition are still being replayed from the spool "
                     "after a database outage; retry shortly", 503)
    push_items = [x for k, x in flat if k == "push"]
    producer_sub = getattr(request.ctx, "producer_sub", None)
    push_rows = (iter(await to_rows(app, push_items, producer_sub)) if push_items
                 else iter(()))
    steps: list[tuple[str, list]] = []
    for kind, x in flat:
        value = next(push_rows) if kind == "push" else x
        if steps and steps[-1][0] == kind:
            steps[-1][1].append(value)
        else:
            steps.append((kind, [value]))
    txn_id = new_uuid7()
    try:
        step_results = await run_transaction(app.ctx.store, steps, required)
        success, reason = True, None
    except TransactionAborted as aborted:
        step_results, success, reason = aborted.results, False, aborted.reason

    results = []
    flat_iter = iter(flat)
    for (kind, rows), res in zip(steps, step_results):
        for row, r in zip(rows, res):
            _, item = next(flat_iter)
            index = len(results)
            if kind == "push":
                results.append({"index": index, "type": "push", "success": True,
                                "status": r["status"], "transactionId": item.transaction_id,
                                "messageId": str(r["message_id"]),
                                "partitionId": str(r["partition_id"]), "queueName": item.queue})
            else:
                results.append({"index": index, "type": "ack", "success": r["success"],
                                "transactionId": item.transaction_id, "error": r["error"],
                                "dlq": r["dlq"]})
    if not success:
        return json({"transactionId": txn_id, "success": False, "error": reason, "results": results})
    for (kind, rows), res in zip(steps, step_results):
        if kind == "ack":
            leases_released(app, rows, res)
    wake_after_commit(app, {(item.queue, item.partition) for kind, item in flat
                            if kind == "push"})
    return json({"transactionId": txn_id, "success": True, "results": results})


# -- lease ------------------------------------------------------------------

@bp.post("/api/v1/lease/<lease_id:str>/extend", unquote=True)
async def extend_lease(request: Request, lease_id: str):
    body = body_object(read_json(request))
    seconds = body.get("seconds", 60)
    if seconds is None:
        seconds = 60
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 86400:
        raise BadRequest("seconds must be an integer between 1 and 86400")
    if not is_uuid(lease_id):
        raise BadRequest(f"leaseId must be a UUID, got {lease_id!r}")
    renewed, expires, err = await request.app.ctx.store.extend_lease(lease_id, seconds)
    expires_at = iso_milli(expires)
    return json({"leaseId": lease_id, "success": renewed > 0, "error": err,
                 "expiresAt": expires_at, "newExpiresAt": expires_at, "renewed": renewed})
