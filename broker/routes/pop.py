"""The three pop routes (api.md §5): hot-list candidates, one claim statement,
long polls parked in the pop-waiter registry until a wake or their backoff."""
from __future__ import annotations

import asyncio
import time

from loguru import logger
from sanic import Blueprint, Request

from actors.pop_waiters import long_poll
from broker.http import args, json
from broker.store.db import StoreUnavailable
from broker.telemetry import telemetry
from broker.wire import new_uuid7, parse_pop, pop_message

bp = Blueprint("pop")


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
            await _ensure_subscription(app, req)
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


async def _ensure_subscription(app, req) -> None:
    """A named group's subscription (new / from a timestamp) is stored before its
    first claim, once per broker (stored subscriptions never change)."""
    if req.subscription_mode is None:
        return
    key = (req.group, req.queue or "", req.partition or "", req.namespace or "", req.task or "")
    stored = app.ctx.queue_cache.subscriptions_stored
    if key not in stored:
        await app.ctx.store.ensure_subscription(
            group=req.group, queue=req.queue or "", partition=req.partition or "",
            namespace=req.namespace or "", task=req.task or "",
            mode=req.subscription_mode, start=req.subscription_from)
        stored.add(key)


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
