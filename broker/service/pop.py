"""Pop (docs/wire-contract.md §5): hot-list candidates, one claim statement, verdicts back to
the hot-list, long polls parked in the pop-waiter registry until a wake or their backoff
(service/long_poll.py). The result is what the pop took, or why it took nothing; the HTTP
layer shapes the answer."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import ujson
from loguru import logger

from actors.autopilot import START_BATCH, WAIT_MAX_MS, Ask, Decision
from actors.hotlist import LEASE_REVISIT_CAP_S, REQUEUE, SizedTake
from actors.proxies import HotListProxy
from broker.core.domain import QUEUE_MODE, PopRequest
from broker.core.ids import new_uuid7
from broker.core.logs import Throttle, dropped_note
from broker.core.telemetry import telemetry
from broker.service.context import BrokerContext
from broker.service.long_poll import long_poll
from broker.store.errors import StoreUnavailable

# A parked pop re-checks every few hundred ms: during an outage, one line a minute per queue.
_WAITING_LINES = Throttle(60.0)


@dataclass(frozen=True)
class Popped:
    """The messages one claim took, in claim order: PostgreSQL's rows (kind ``msg``,
    grouped by partition) with each row's payload as JSON text (decrypted), under
    ``lease_id`` (``""`` when auto-acked: no lease to renew or ack under). For a framed
    pop, ``handles`` maps its partitions' ids to their handles (None when they could not
    be read: the answer is then JSON)."""
    rows: list
    payloads: list[str]
    lease_id: str
    handles: dict[Any, int] | None = None


@dataclass(frozen=True)
class Sizing:
    """A pop that engaged autopilot (docs/wire-contract.md §5.8): the sweep width and
    message budget it ran with, and the advice on when to poll again (ms; 0: none)."""
    partitions: int
    batch: int
    wait_ms: int


@dataclass(frozen=True)
class PopResult:
    """What a pop took (``popped``), or, when None, why nothing: ``empty`` is ``paused``
    (pop maintenance), ``empty`` (no message to take), or the reason PostgreSQL's claim
    gave (``window_buffer``, ``lease_held``, ``partition_not_found``). ``sizing``: set
    when the pop engaged autopilot. ``conflation``: the group's stored policy on the queue
    (docs/wire-contract.md §5.8), None when not known (queue mode, a discovery pop, or the
    database never answered). ``queue_missing``: an empty wildcard pop of a queue that
    does not exist."""
    popped: Popped | None
    empty: str = "empty"
    sizing: Sizing | None = None
    conflation: bool | None = None
    queue_missing: bool = False


# A pop of a queue that does not exist (a misspelt name) finds nothing, as an empty queue
# does. It is told apart in the answer (docs/wire-contract.md §5.4: queueExists false) and
# in one warning line per queue a minute, never by a 404: the official client's consume()
# loop re-raises any HTTP error of a pop other than 429 and stops, so a consumer started
# before its queue's first push or configure would die. The answer stays the 200 the
# clients read as "no messages".
_MISSING_LINES = Throttle(60.0)


async def _missing(ctx: BrokerContext, req: PopRequest, popped: Popped | None,
                   empty: str) -> bool:
    """Whether an empty wildcard pop of a named queue found no such queue (False when it
    took messages, or the database cannot say)."""
    if popped is not None or req.queue is None or req.partition is not None or empty != "empty":
        return False
    seen = ctx.queue_cache.queues_seen
    if req.queue in seen:
        return False
    try:
        exists = await ctx.store.queue_exists(req.queue)
    except StoreUnavailable:
        return False
    if exists:
        seen.add(req.queue)
        return False
    dropped = _MISSING_LINES.allow(req.queue)
    if dropped is not None:
        logger.warning("pop on {!r}: no such queue (nothing was pushed to or configured "
                       "under that name; misspelt?){}", req.queue, dropped_note(dropped))
    return True


async def pop(ctx: BrokerContext, req: PopRequest) -> PopResult:
    if ctx.flags.pop:
        return await _paused_pop(req)
    attempts = _Attempts(ctx, req)
    if not req.wait:
        popped = await _with_handles(ctx, req, await attempts([]))
        _count(req, popped)
        return PopResult(popped, attempts.empty, await _sizing(ctx, attempts, popped),
                         attempts.conflation,
                         await _missing(ctx, req, popped, attempts.empty))
    settings = ctx.settings
    deadline = time.monotonic() + req.timeout_ms / 1000
    telemetry.long_polls_in_flight += 1
    if req.queue is not None:
        telemetry.long_polls_by_queue[req.queue] += 1
    try:
        popped = await long_poll(
            ctx.waiters, req.queue, attempts, deadline,
            initial_ms=settings.pop_wait_initial_interval_ms,
            threshold=settings.pop_wait_backoff_threshold,
            multiplier=settings.pop_wait_backoff_multiplier,
            max_ms=settings.pop_wait_max_interval_ms,
            recheck_by=lambda: attempts.lease_end,
            partition=req.partition, scope=(req.group, req.namespace, req.task),
            group=req.group,
            # auto-ack leaves no lease: a full batch may leave more for the next pop
            more_after=lambda p: bool(req.auto_ack and p and len(p.rows) >= attempts.batch),
            counters=telemetry.pops)
    finally:
        telemetry.long_polls_in_flight -= 1
        if req.queue is not None:
            telemetry.long_polls_by_queue[req.queue] -= 1
            if telemetry.long_polls_by_queue[req.queue] <= 0:
                del telemetry.long_polls_by_queue[req.queue]
    popped = await _with_handles(ctx, req, popped)
    _count(req, popped)
    return PopResult(popped, attempts.empty, await _sizing(ctx, attempts, popped),
                     attempts.conflation, await _missing(ctx, req, popped, attempts.empty))


async def _with_handles(ctx: BrokerContext, req: PopRequest, popped: Popped | None
                        ) -> Popped | None:
    """A framed pop's messages with their partitions' handles, or (handles None) the
    messages for a JSON answer: the claim has committed, so when the handles cannot be
    read the messages still go out."""
    if popped is None or not req.frames:
        return popped
    if len({r["queue_name"] for r in popped.rows}) > 1:
        return popped  # a discovery pop across queues: a frame names one queue
    try:
        ids = list(dict.fromkeys(r["partition_id"] for r in popped.rows))
        handles = await ctx.store.partition_handles(ids)
    except StoreUnavailable:
        return popped
    if len(handles) < len(ids):  # a partition deleted since the claim
        return popped
    return replace(popped, handles=handles)


def _count(req: PopRequest, popped: Popped | None) -> None:
    telemetry.count(req.queue, "pop_requests")
    if popped is None:
        telemetry.count(req.queue, "pop_empty")


async def _sizing(ctx: BrokerContext, attempts: _Attempts, popped: Popped | None
                  ) -> Sizing | None:
    """The echo of a pop that engaged autopilot; counts the knobs the broker chose."""
    req, decision = attempts.req, attempts.decision
    if not req.autopilot:
        return None
    if decision is not None:
        telemetry.autopilot_decided(decision.batch_chosen, decision.partitions_chosen,
                                    decision.batch)
        batch, partitions = decision.batch, decision.partitions
    else:  # no attempt sized it (the store failed first)
        batch, partitions = attempts.batch, req.max_partitions
    wait_ms = 0
    if popped is None and not req.wait:
        # An empty pop that did not wait: when to look again, from the queue's pushes.
        wait_ms = (await ctx.hotlist.wait_ms(req.queue) if ctx.hotlist is not None
                   else WAIT_MAX_MS)
    return Sizing(partitions, batch, wait_ms)


class _Attempts:
    """A pop's attempts: called once per look (by the long poll; once for a pop that does
    not wait). Each claims under the pop's lease id and keeps what the next look and the
    answer need: the lease id (a new one after an outage), why the last look found
    nothing, and when a lease it found ends."""

    def __init__(self, ctx: BrokerContext, req: PopRequest) -> None:
        self.ctx, self.req = ctx, req
        # autopilot: the last attempt's sizing, and the client's pinned knobs
        self.decision: Decision | None = None
        self.batch = req.batch
        self.ask = (Ask(None if req.autopilot_batch else req.batch,
                        None if req.autopilot_partitions else req.max_partitions, req.auto_ack)
                    if req.autopilot else None)
        self.lease_id = new_uuid7()
        self.empty = "empty"
        self.conflation: bool | None = None  # the group's stored policy, once read
        # A lease ends without an event (no ack arrives): look again right then.
        self.lease_end: float | None = None

    async def __call__(self, hints: list[str]) -> Popped | None:
        ctx, req = self.ctx, self.req
        if ctx.flags.pop:  # switched on while this pop was parked: answer empty
            self.empty = "paused"
            return None
        try:
            await _ensure_subscription(ctx, req)
            if self.conflation is None:
                self.conflation = await _group_policy(ctx, req)
            claimed = await claim(ctx, req, self.lease_id, hints, self.ask, self.decision)
            rows = claimed.rows
            if claimed.decision is not None:
                self.decision, self.batch = claimed.decision, claimed.decision.batch
        except StoreUnavailable:
            # The claim may have committed under this lease id with nobody to receive
            # it: the store ends that lease before its next pop, so never reuse it.
            self.lease_id = new_uuid7()
            if not req.wait:
                raise
            # A long poll rides out an outage: keep waiting, answer empty at the deadline.
            dropped = _WAITING_LINES.allow(req.queue or "*")
            if dropped is not None:
                # DEBUG: the store's DatabaseHealth tells the outage itself, once.
                logger.debug("pop on {}: database unavailable, still waiting{}",
                             req.queue or "*", dropped_note(dropped))
            return None
        retired = sum(r["retired"] or 0 for r in rows if r["kind"] == "verdict")
        if retired:
            telemetry.messages["conflated"] += retired
        messages = [r for r in rows if r["kind"] == "msg"]
        lease_ends = [time.monotonic() + r["verdict_secs"] for r in rows
                      if r["kind"] == "verdict" and r["verdict"] == "leased"
                      and r["verdict_secs"] is not None]
        if claimed.next_due is not None:  # the hot-list's wheel: a lease it knows of ends
            lease_ends.append(claimed.next_due)
        self.lease_end = min(lease_ends) + LEASE_END_SLACK_S if lease_ends else None
        if not messages:
            self.empty = rows[-1]["kind"] if rows and rows[-1]["kind"] != "verdict" else "empty"
            return None
        return _popped(ctx, messages, "" if req.auto_ack else self.lease_id)


async def _ensure_subscription(ctx: BrokerContext, req: PopRequest) -> None:
    """A named group's subscription (new / from a timestamp) is stored before its
    first claim, once per broker (stored subscriptions never change)."""
    if req.subscription_mode is None:
        return
    key = (req.group, req.queue or "", req.partition or "", req.namespace or "", req.task or "")
    stored = ctx.queue_cache.subscriptions_stored
    if key not in stored:
        await ctx.store.ensure_subscription(
            group=req.group, queue=req.queue or "", partition=req.partition or "",
            namespace=req.namespace or "", task=req.task or "",
            mode=req.subscription_mode, start=req.subscription_from)
        stored.add(key)


async def _group_policy(ctx: BrokerContext, req: PopRequest) -> bool | None:
    """Whether the pop's group conflates on its queue (stored on the group's first pop of
    the queue as it declared, then fixed; read once per broker); None in queue mode. A
    discovery pop that declares conflation stores it on every matching queue without a policy
    for the group and conflates when all of them do (read each time: queues come and go);
    one that does not declare gets None (the stored policies still apply to it in SQL)."""
    if req.group == QUEUE_MODE:
        return None
    if req.queue is None:
        if not req.conflation:
            return None
        return await ctx.store.group_policy_scope(req.namespace, req.task, req.group, True)
    key = (req.queue, req.group)
    policies = ctx.queue_cache.group_policies
    if key not in policies:
        policies[key] = await ctx.store.group_policy(req.queue, req.group, req.conflation)
    return policies[key]


# A parked pop that found a partition leased re-checks this long after the
# lease's end (the clocks of PostgreSQL and the broker tick apart a little).
LEASE_END_SLACK_S = 0.02

# A few candidates beyond the claim budget, so a false positive at the head of
# the ring does not turn a pop with pending partitions into an empty answer.
EXTRA_CANDIDATES = 3


@dataclass(frozen=True)
class Claimed:
    rows: list            # queen.pop_messages_v5 rows: messages and verdicts
    next_due: float | None = None  # the hot-list's next wheel time (time.monotonic())
    decision: Decision | None = None  # autopilot's sizing of this attempt


def _autopilot_key(req: PopRequest) -> str:
    """The (queue, group) key of autopilot's state: a discovery pop's is its filter."""
    if req.queue is not None:
        return req.queue
    return f"?namespace={req.namespace or ''}&task={req.task or ''}"


async def claim(ctx: BrokerContext, req: PopRequest, lease_id: str,
                hints: list[str], ask: Ask | None = None,
                decided: Decision | None = None) -> Claimed:
    """One pop attempt. Wildcard pops on one queue take their candidates from
    the hot-list (seeding it from PostgreSQL on first use and when the reseed
    floor is due) and report back what PostgreSQL made of each: every
    candidate taken gets a verdict, or it would stay INFLIGHT until a reseed
    finds it stranded. An empty ring, and every other kind of pop, lets
    PostgreSQL scan. ``ask``: the pop engaged autopilot, which sizes each
    wildcard attempt in the same hot-list call as the take, and other pops once
    (``decided``: an earlier attempt's sizing)."""
    store, hotlist = ctx.store, ctx.hotlist
    telemetry.pops["claim_queries"] += 1  # every path below runs exactly one claim
    wildcard = hotlist is not None and req.queue is not None and req.partition is None
    decision = decided
    if ask is not None and not wildcard and decision is None:
        decision = (await hotlist.size(_autopilot_key(req), req.group, ask) if hotlist is not None
                    else Decision(ask.batch or START_BATCH, ask.partitions or 1,
                                  ask.batch is None, ask.partitions is None))
    if decision is not None and not wildcard:
        req = replace(req, batch=decision.batch, max_partitions=decision.partitions)
    if not wildcard:
        rows = await store.pop(**_claim_args(req, lease_id), hints=hints)
        if ask is not None and hotlist is not None:
            took = _took(req, rows)
            if took is not None:
                hotlist.pilot_took(_autopilot_key(req), req.group, *took)
        return Claimed(rows, None, decision)
    assert hotlist is not None and req.queue is not None
    queue = req.queue

    taken: list[tuple[str, int]] = []  # candidates now INFLIGHT: each is checked in below
    checked_in = False
    try:
        if ask is not None:
            sized = await _taking(hotlist, queue, req.group, hotlist.take_sized(
                queue, req.group, ask, EXTRA_CANDIDATES))
            decision, take = sized.decision, sized.take
            req = replace(req, batch=decision.batch, max_partitions=decision.partitions)
        else:
            take = await _taking(hotlist, queue, req.group, hotlist.take(
                queue, req.group, req.max_partitions + EXTRA_CANDIDATES))
        want = req.max_partitions + EXTRA_CANDIDATES
        common = _claim_args(req, lease_id)
        taken += take.entries
        if take.needs_seed:
            # A reseed that is due still hands out candidates (now INFLIGHT): they
            # join the ones taken after the seed, so each is checked in below.
            try:
                pending = await store.pending_partitions(queue, req.group)
            except BaseException:
                hotlist.seed_aborted(queue, req.group)
                raise
            await hotlist.seed(queue, req.group, pending)
            more = await _taking(hotlist, queue, req.group, hotlist.take(
                queue, req.group, max(0, want - len(taken))))
            taken += more.entries
        candidates = list(dict.fromkeys([*hints, *(name for name, _ in taken)]))
        if not candidates:
            # The ring has nothing: let PostgreSQL scan. A partition whose mark was
            # lost (a dropped mesh hint, a push through a broker with no mesh) is
            # then found on the pop's next re-check, not at the next reseed.
            rows = await store.pop(**common, hints=hints)
            if ask is not None:
                took = _took(req, rows)
                if took is not None:
                    hotlist.pilot_took(queue, req.group, *took)
            return Claimed(rows, take.next_due, decision)
        rows = await store.pop(**common, hints=candidates, only_hints=True)
        took = _took(req, rows) if ask is not None else None
        if taken:
            hotlist.check_in(queue, req.group, verdicts(taken, rows), None, took)
            checked_in = True
        elif took is not None:
            hotlist.pilot_took(queue, req.group, *took)
        return Claimed(rows, None, decision)
    finally:
        # A claim that raised (the database unavailable, a timeout, the pop cancelled,
        # any error) gives its candidates back: left INFLIGHT, a partition is no
        # candidate for any pop until a reseed finds it stranded (``stranded_after_s``),
        # and after an outage every wildcard pop would fall back to the scan.
        if taken and not checked_in:
            hotlist.check_in(queue, req.group,
                             [(name, epoch, REQUEUE, None) for name, epoch in taken])


async def _taking(hotlist: HotListProxy, queue: str, group: str, future: Any) -> Any:
    """The answer of a hot-list take (``Take`` or ``SizedTake``). A pop cancelled while
    the actor answers would never see the candidates the take made INFLIGHT: they are then
    checked back in when the answer comes (the candidates of its earlier takes are given
    back by ``claim``'s ``finally``)."""
    task = asyncio.ensure_future(future)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        def give_back(done: asyncio.Future) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            answer = done.result()
            entries = (answer.take if isinstance(answer, SizedTake) else answer).entries
            if entries:
                hotlist.check_in(queue, group,
                                 [(name, epoch, REQUEUE, None) for name, epoch in entries])
        task.add_done_callback(give_back)
        raise


def _claim_args(req: PopRequest, lease_id: str) -> dict[str, Any]:
    return dict(queue=req.queue, partition=req.partition, namespace=req.namespace,
                task=req.task, group=req.group, batch=req.batch,
                max_partitions=req.max_partitions, auto_ack=req.auto_ack, lease_id=lease_id)


def _took(req: PopRequest, rows: list) -> tuple[list[str], int, float | None, bool] | None:
    """What an autopilot pop's claim took, for the autopilot: (partitions, messages, the
    lease's seconds or None when auto-acked, whether the batch was used up)."""
    partitions: dict[str, None] = {}
    messages = 0
    lease_s: float | None = None
    for r in rows:
        if r["kind"] == "msg":
            messages += 1
            partitions[r["partition_name"]] = None
        elif r["verdict"] == "took" and r["verdict_secs"] is not None:
            lease_s = float(r["verdict_secs"])
    if not messages:
        return None
    return list(partitions), messages, None if req.auto_ack else lease_s, messages >= req.batch


def verdicts(taken: list[tuple[str, int]], rows: list) -> list[tuple]:
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


async def _paused_pop(req: PopRequest) -> PopResult:
    """Pop maintenance: empty, without touching the database, but still holding a
    waiting pop until its timeout so consumers do not spin (an autopilot pop that did
    not wait is advised the longest wait)."""
    if req.wait:
        await asyncio.sleep(req.timeout_ms / 1000)
    sizing = None
    if req.autopilot:
        sizing = Sizing(req.max_partitions, START_BATCH if req.autopilot_batch else req.batch,
                        0 if req.wait else WAIT_MAX_MS)
    return PopResult(None, "paused", sizing)


def _popped(ctx: BrokerContext, rows: list, lease_id: str) -> Popped:
    """The claimed rows with their payloads' JSON texts (decrypted), counted as
    delivered."""
    cipher = ctx.cipher
    payloads = []
    for row in rows:
        data = row["payload"]
        if row["is_encrypted"] and cipher is not None:
            data = ujson.dumps(cipher.decrypt(ujson.loads(data)), ensure_ascii=False,
                               escape_forward_slashes=False)
        payloads.append(data)
    telemetry.messages["popped"] += len(rows)
    by_queue: dict[str, list] = {}
    for row in rows:
        by_queue.setdefault(row["queue_name"], []).append(row["created_us"])
    for queue, created in by_queue.items():
        telemetry.delivered(queue, created)
    return Popped(rows, payloads, lease_id)
