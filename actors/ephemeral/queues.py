"""Every ephemeral queue of this broker, in RAM (docs/ephemeral.md): the rings, the bounds, the
global budget, leases and their expiry, the counters, the long-poll gate.

Every method is synchronous and never awaits, so one call is atomic on the event loop: the
HTTP handlers call these methods directly (one actor round trip would cost about as much as
the rest of a push, actors/ephemeral/__init__.py), and the keeper actor (actor.py), which owns
this object, runs what time drives: lease expiry and age limits, at the due time.

Time is ``clock()`` (monotonic seconds; a test gives its own). Due work (expired leases, aged
messages) is a heap of deadlines, run at the start of every call and by the keeper's timer,
which ``on_deadline`` (set by the keeper) re-arms when an earlier deadline appears.
"""
from __future__ import annotations

import heapq
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import ujson

from actors.ephemeral.gate import Gate, Waiter
from actors.ephemeral.options import DEFAULTS, DROP_OLDEST, QueueOptions
from actors.ephemeral.rings import Cursor, Delivery, Lease, Ring

ENTRY_OVERHEAD = 128
"""Bytes a held message is charged against the global budget beside its payload: its entry
tuple, push time, list slot and string header come to ~115 bytes on CPython 3.11 (measured
with tracemalloc), more while it is leased (the cursor's and the lease's entries)."""

STRUCTURE_CHARGE = 512
"""Bytes charged against the budget for each queue, ring (partition) and group cursor a
caller brings into being: a pop of a made-up queue or group, or a push to a made-up partition,
creates one, so names alone could otherwise fill memory that no message accounts for."""


class MemoryFull(Exception):
    """The budget (EPHEMERAL_MAX_BYTES) cannot take another queue, partition or group."""


COUNTS = ("pushed", "popped", "acked", "rejected_full", "rejected_memory", "rejected_too_large",
          "dropped_retry_limit", "dropped_ttl", "dropped_length", "dropped_bytes",
          "dropped_reset", "dropped_moved")

_LEASE, _TTL = 0, 1


class PushVerdict(NamedTuple):
    """``status``: pushed, full (the queue's bound under policy reject: 429), memory (the
    global budget: 503) or too_large (can never fit the queue's bounds: 413)."""

    status: str
    pushed: int
    detail: str | None = None


class Queue:
    __slots__ = ("bytes", "charged", "counts", "declared", "groups", "messages", "name",
                 "name_json", "options", "rings", "ttl_due", "turn")

    def __init__(self, name: str, options: QueueOptions, declared: bool) -> None:
        self.name = name
        self.name_json = ujson.dumps(name, ensure_ascii=False, escape_forward_slashes=False)
        self.options = options
        self.declared = declared
        self.rings: dict[str, Ring] = {}
        self.groups: dict[str, None] = {}  # every group that popped (or parked on) the queue
        self.messages = 0
        self.bytes = 0
        self.counts = dict.fromkeys(COUNTS, 0)
        self.ttl_due: float | None = None
        self.turn = 0
        self.charged = 0  # STRUCTURE_CHARGE times its rings, groups and cursors, plus itself


@dataclass
class GroupFigures:
    group: str
    pending: int = 0
    leased: int = 0
    partitions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class QueueFigures:
    queue: str
    declared: bool
    options: QueueOptions
    messages: int
    bytes: int
    counts: dict[str, int]
    partitions: list[dict[str, Any]]
    groups: list[GroupFigures]


class EphemeralQueues:
    def __init__(self, budget_bytes: int, clock: Callable[[], float] = time.monotonic,
                 incarnation: str | None = None) -> None:
        self.budget = budget_bytes
        self.clock = clock
        self.incarnation = incarnation or secrets.token_hex(6)
        self.queues: dict[str, Queue] = {}
        self.rings: dict[int, Ring] = {}  # live rings by number (ids name them)
        self.next_ring = 1
        self.messages = 0
        self.bytes = 0
        self.structures = 0  # what queues, rings and cursors are charged (STRUCTURE_CHARGE)
        self.totals = dict.fromkeys(COUNTS, 0)
        self.gate = Gate()
        self.deadlines: list[tuple[float, int, int, Any]] = []
        self._order = 0
        self.on_deadline: Callable[[float], None] | None = None

    # -- queues --------------------------------------------------------------------------
    def used(self) -> int:
        """Bytes charged against the budget: messages, their entries, the structures."""
        return self.bytes + self.messages * ENTRY_OVERHEAD + self.structures

    def _charge(self, q: Queue | None, units: int) -> int:
        """Charge ``units`` structures (to ``q`` when it exists), or raise MemoryFull."""
        amount = units * STRUCTURE_CHARGE
        if self.used() + amount > self.budget:
            raise MemoryFull(f"ephemeral memory budget of {self.budget} bytes "
                             "(EPHEMERAL_MAX_BYTES) is used up: no room for another queue, "
                             "partition or group; retry once consumers freed some")
        self.structures += amount
        if q is not None:
            q.charged += amount
        return amount

    def _queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            charged = self._charge(None, 1)
            q = self.queues[name] = Queue(name, DEFAULTS, declared=False)
            q.charged = charged
        return q

    def _ring(self, q: Queue, partition: str) -> Ring:
        self._charge(q, 1 + len(q.groups))  # the ring and a cursor per known group
        ring = Ring(q.name, partition, ujson.dumps(partition, ensure_ascii=False,
                                                   escape_forward_slashes=False),
                    self.next_ring, self.incarnation)
        self.next_ring += 1
        q.rings[partition] = self.rings[ring.no] = ring
        for group in q.groups:
            ring.cursor(group)
        return ring

    def _join(self, q: Queue, group: str) -> None:
        """A group the queue did not know: a cursor on every ring, at its oldest message.
        From now on no message of the queue is freed before this group is done with it."""
        self._charge(q, 1 + len(q.rings))  # the group and its cursor on every ring
        q.groups[group] = None
        for ring in q.rings.values():
            ring.cursor(group)

    def options_of(self, name: str) -> QueueOptions:
        """The queue's options; a queue not known yet is created implicitly."""
        return self._queue(name).options

    def configure(self, name: str, options: QueueOptions, declared: bool = True) -> QueueOptions:
        """Apply ``options`` to the queue (created when new): a lowered bound drops the oldest
        messages at once under drop_oldest (kept, refusing pushes, under reject); a changed
        age limit is re-armed."""
        q = self._queue(name)
        q.options, q.declared = options, q.declared or declared
        if options.policy == DROP_OLDEST:
            while q.messages > options.max_length:
                self._evict(q, "dropped_length")
            while q.bytes > options.max_bytes:
                self._evict(q, "dropped_bytes")
        q.ttl_due = None
        if options.ttl_seconds:
            self._run_ttl(q, self.clock())
        return options

    def load(self, declared: Iterable[tuple[str, QueueOptions]]) -> int:
        """Apply declarations; those the budget has no room for are left out (a later
        configure or use brings them in, or answers memory full)."""
        n = 0
        for name, options in declared:
            try:
                self.configure(name, options)
            except MemoryFull:
                continue
            n += 1
        return n

    def reset(self, name: str, reason: str = "dropped_reset") -> int:
        """Drop every message, void every lease, rewind every cursor; the options and the
        known groups stay. Answers how many messages were dropped, counted under ``reason``
        (``dropped_moved``: the queue's owner is now another broker). Ids handed out before
        answer ``stale``."""
        q = self.queues.get(name)
        if q is None:
            return 0
        dropped = q.messages
        self._forget_rings(q)
        self._count(q, reason, dropped)
        self.gate.wake(name, None)  # parked pops look again (and park again: it is empty)
        return dropped

    def delete(self, name: str) -> bool:
        q = self.queues.pop(name, None)
        if q is None:
            return False
        self._forget_rings(q)
        self.structures -= q.charged
        return True

    def _forget_rings(self, q: Queue) -> None:
        for ring in q.rings.values():
            del self.rings[ring.no]
        q.rings = {}  # the groups stay known: their cursors restart on the next rings
        kept = (1 + len(q.groups)) * STRUCTURE_CHARGE
        self.structures -= q.charged - kept
        q.charged = kept
        self._removed(q, q.messages, q.bytes)
        q.ttl_due = None

    # -- push ----------------------------------------------------------------------------
    def push(self, name: str, partition: str, items: Sequence[tuple[str, int]],
             nbytes: int | None = None) -> PushVerdict:
        """Append ``items`` ((payload JSON text, bytes), in order) to the queue's ring of
        ``partition``, all or nothing."""
        if not items:
            return PushVerdict("pushed", 0)
        now = self.clock()
        if self.deadlines and self.deadlines[0][0] <= now:
            self._run_due(now)
        try:  # a new queue or partition is charged too
            q = self.queues.get(name) or self._queue(name)
            ring = q.rings.get(partition) or self._ring(q, partition)
        except MemoryFull as exc:
            self.totals["rejected_memory"] += len(items)
            return PushVerdict("memory", 0, str(exc))
        count = len(items)
        if nbytes is None:
            nbytes = sum(size for _text, size in items)
        opts = q.options
        if count > opts.max_length or nbytes > opts.max_bytes:
            self._count(q, "rejected_too_large", count)
            return PushVerdict("too_large", 0,
                               f"a push of {count} message(s), {nbytes} bytes, can never fit "
                               f"queue {name!r} (maxLength {opts.max_length}, maxBytes "
                               f"{opts.max_bytes}); send fewer at a time")
        charge = nbytes + count * ENTRY_OVERHEAD
        if self.used() + charge > self.budget:
            self._count(q, "rejected_memory", count)
            return PushVerdict("memory", 0,
                               f"ephemeral memory budget of {self.budget} bytes "
                               "(EPHEMERAL_MAX_BYTES) is used up; retry once consumers freed "
                               "some")
        if q.messages + count > opts.max_length or q.bytes + nbytes > opts.max_bytes:
            if opts.policy != DROP_OLDEST:
                self._count(q, "rejected_full", count)
                return PushVerdict("full", 0,
                                   f"queue {name!r} holds {q.messages} message(s), {q.bytes} "
                                   f"bytes: {count} more would pass maxLength "
                                   f"{opts.max_length} or maxBytes {opts.max_bytes} (policy "
                                   "reject); retry once consumers freed some")
            while q.messages + count > opts.max_length:
                self._evict(q, "dropped_length")
            while q.bytes + nbytes > opts.max_bytes:
                self._evict(q, "dropped_bytes")
        ring.append([(text, size, now) for text, size in items], nbytes)
        q.messages += count
        q.bytes += nbytes
        self.messages += count
        self.bytes += nbytes
        q.counts["pushed"] += count
        self.totals["pushed"] += count
        if opts.ttl_seconds and q.ttl_due is None:
            self._schedule_ttl(q, now + opts.ttl_seconds)
        if self.gate.parked:
            self.gate.wake(name, partition)
        return PushVerdict("pushed", count)

    def _evict(self, q: Queue, reason: str) -> None:
        """Drop the queue's oldest message (the oldest head among its rings)."""
        oldest: Ring | None = None
        at = 0.0
        for ring in q.rings.values():
            ring_at = ring.oldest_at()
            if ring_at is not None and (oldest is None or ring_at < at):
                oldest, at = ring, ring_at
        if oldest is None:  # nothing left (counts out of step: never expected)
            raise RuntimeError(f"ephemeral queue {q.name}: nothing to evict")
        n, b = oldest.drop_head(1)
        self._removed(q, n, b)
        self._count(q, reason, n)

    # -- pop -----------------------------------------------------------------------------
    def _rings_of(self, q: Queue, partition: str | None) -> list[Ring]:
        if partition is not None:
            ring = q.rings.get(partition)
            return [] if ring is None else [ring]
        rings = list(q.rings.values())
        if len(rings) > 1:  # start at another partition each time: none starves
            start = q.turn % len(rings)
            q.turn += 1
            rings = rings[start:] + rings[:start]
        return rings

    def available(self, name: str, group: str, partition: str | None = None) -> int:
        """Messages a pop of ``group`` would get now (never delivered to it, or due for
        redelivery)."""
        q = self._for_group(name, group, self.clock())
        return sum(ring.available(group) for ring in self._rings_of(q, partition))

    def _for_group(self, name: str, group: str, now: float) -> Queue:
        """The queue (created when new) with what is due run and ``group`` known to it."""
        if self.deadlines and self.deadlines[0][0] <= now:
            self._run_due(now)
        q = self.queues.get(name) or self._queue(name)
        if group not in q.groups:
            self._join(q, group)
        return q

    def take(self, name: str, group: str, partition: str | None, batch: int,
             auto_ack: bool = False) -> list[Delivery]:
        """Deliver up to ``batch`` messages to ``group``: one lease for the whole batch
        (``leaseSeconds``), or none with ``auto_ack`` (the cursor moves at delivery)."""
        now = self.clock()
        q = self._for_group(name, group, now)
        lease = None if auto_ack else Lease(now + q.options.lease_seconds)
        out: list[Delivery] = []
        for ring in self._rings_of(q, partition):
            if len(out) >= batch:
                break
            if ring.take(ring.cursors[group], batch - len(out), out, lease) and lease is None:
                self._free(q, ring)
        if out:
            q.counts["popped"] += len(out)
            self.totals["popped"] += len(out)
            if lease is not None:
                self._schedule(lease.deadline, _LEASE, lease)
        return out

    # -- ack -----------------------------------------------------------------------------
    def _locate(self, q: Queue | None, message_id: str) -> tuple[str | None, Ring | None, int]:
        """(verdict, ring, position) of an id: verdict ``stale`` (another incarnation of the
        broker or of the ring), ``unknown`` (not an id of this queue), or None."""
        parts = message_id.split("-")
        if len(parts) != 3 or len(parts[0]) != 12 or not all(
                p.isascii() and p.isdigit() and len(p) <= 18 for p in parts[1:]):
            return "unknown", None, 0
        if parts[0] != self.incarnation:
            return "stale", None, 0
        no, seq = int(parts[1]), int(parts[2])
        ring = self.rings.get(no)
        if ring is None:
            return ("stale" if no < self.next_ring else "unknown"), None, 0
        if q is None or ring.queue != q.name or seq >= ring.tail:
            return "unknown", None, 0
        return None, ring, seq

    def ack(self, name: str, group: str,
            acks: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
        """Apply (id, status) acks of ``group``: completed, or failed / retry (redelivered
        with attempts+1 until retryLimit, then dropped). Answers (outcome, dropped) per ack;
        outcome: acked, redelivered, stale, unknown."""
        now = self.clock()
        if self.deadlines and self.deadlines[0][0] <= now:
            self._run_due(now)
        q = self.queues.get(name)
        out: list[tuple[str, bool]] = []
        touched: list[Ring] = []
        for message_id, status in acks:
            verdict, ring, seq = self._locate(q, message_id)
            cursor = ring.cursors.get(group) if ring is not None else None
            if verdict is not None or ring is None or q is None or cursor is None or \
                    seq not in cursor.attempts:
                out.append((verdict or "unknown", False))
                continue
            if status == "completed":
                del cursor.attempts[seq]
                cursor.leased.pop(seq, None)
                touched.append(ring)
                q.counts["acked"] += 1
                self.totals["acked"] += 1
                out.append(("acked", False))
            elif cursor.leased.pop(seq, None) is None:
                out.append(("redelivered", False))  # its lease ended: due for redelivery
            elif self._retry_or_drop(q, ring, cursor, seq):
                out.append(("redelivered", False))
            else:
                touched.append(ring)
                out.append(("acked", True))
        for ring in dict.fromkeys(touched):
            self._free(q, ring)  # type: ignore[arg-type]
        return out

    def _retry_or_drop(self, q: Queue, ring: Ring, cursor: Cursor, seq: int) -> bool:
        """A delivery that failed (ack or expired lease): redeliver it, or, once it was
        delivered 1 + retryLimit times, drop it for this group (counted). True: redelivered."""
        if cursor.attempts[seq] > q.options.retry_limit:
            del cursor.attempts[seq]
            self._count(q, "dropped_retry_limit", 1)
            return False
        heapq.heappush(cursor.retry, seq)
        if self.gate.parked:
            self.gate.wake(q.name, ring.partition, cursor.group)
        return True

    # -- time ----------------------------------------------------------------------------
    def _schedule(self, when: float, kind: int, what: Any) -> None:
        self._order += 1
        heapq.heappush(self.deadlines, (when, self._order, kind, what))
        if self.deadlines[0][0] == when and self.on_deadline is not None:
            self.on_deadline(when)

    def _schedule_ttl(self, q: Queue, when: float) -> None:
        q.ttl_due = when
        self._schedule(when, _TTL, q)

    def next_deadline(self) -> float | None:
        return self.deadlines[0][0] if self.deadlines else None

    def sweep(self) -> int:
        """Run what is due now (the keeper's timer); answers how many deadlines ran."""
        return self._run_due(self.clock())

    def _run_due(self, now: float) -> int:
        ran = 0
        while self.deadlines and self.deadlines[0][0] <= now:
            when, _order, kind, what = heapq.heappop(self.deadlines)
            ran += 1
            if kind == _LEASE:
                self._expire(what)
                continue
            q: Queue = what
            if q.ttl_due == when and self.queues.get(q.name) is q:
                q.ttl_due = None
                self._run_ttl(q, now)
        return ran

    def _expire(self, lease: Lease) -> None:
        """A lease ran out: what it still holds is redelivered (attempts+1) or dropped."""
        touched: dict[Ring, Queue] = {}
        for ring, cursor, seq in lease.items:
            if cursor.leased.get(seq) is not lease or self.rings.get(ring.no) is not ring:
                continue  # acknowledged, dropped, or its ring was reset or deleted
            del cursor.leased[seq]
            q = self.queues[ring.queue]
            if not self._retry_or_drop(q, ring, cursor, seq):
                touched[ring] = q
        for ring, q in touched.items():
            self._free(q, ring)

    def _run_ttl(self, q: Queue, now: float) -> None:
        """Drop the queue's messages older than ttlSeconds; re-arm at the next one's age."""
        ttl = q.options.ttl_seconds
        if not ttl:
            return
        oldest: float | None = None
        for ring in q.rings.values():
            n, b = ring.drop_head(ring.expired(now - ttl))
            if n:
                self._removed(q, n, b)
                self._count(q, "dropped_ttl", n)
            at = ring.oldest_at()
            if at is not None and (oldest is None or at < oldest):
                oldest = at
        if oldest is not None and q.ttl_due is None:
            self._schedule_ttl(q, oldest + ttl)

    # -- bookkeeping ---------------------------------------------------------------------
    def _free(self, q: Queue, ring: Ring) -> None:
        n, b = ring.free_done()
        if n:
            self._removed(q, n, b)

    def _removed(self, q: Queue, n: int, b: int) -> None:
        q.messages -= n
        q.bytes -= b
        self.messages -= n
        self.bytes -= b

    def _count(self, q: Queue, key: str, n: int) -> None:
        q.counts[key] += n
        self.totals[key] += n

    # -- the long-poll gate --------------------------------------------------------------
    def park(self, name: str, group: str, partition: str | None) -> Waiter:
        return self.gate.park(name, group, partition)

    def unpark(self, name: str, waiter: Waiter) -> None:
        self.gate.unpark(name, waiter)

    def wake_group(self, name: str, group: str, partition: str | None = None) -> int:
        return self.gate.wake(name, partition, group)

    # -- figures -------------------------------------------------------------------------
    def depth(self, name: str) -> QueueFigures | None:
        """The queue's gauges (None: no such queue): per partition, and per group (summed
        over partitions, and per partition: its cursor, pending, leased)."""
        q = self.queues.get(name)
        if q is None:
            return None
        now = self.clock()
        partitions: list[dict[str, Any]] = []
        groups: dict[str, GroupFigures] = {}
        for ring in q.rings.values():
            at = ring.oldest_at()
            partitions.append({"partition": ring.partition, "messages": ring.size,
                               "bytes": ring.bytes, "head": ring.head, "tail": ring.tail,
                               "oldestAgeMs": None if at is None else int((now - at) * 1000)})
            for group, cursor in ring.cursors.items():
                g = groups.get(group) or groups.setdefault(group, GroupFigures(group))
                pending = ring.tail - cursor.next + cursor.waiting()
                g.pending += pending
                g.leased += len(cursor.leased)
                g.partitions.append({"partition": ring.partition, "cursor": cursor.next,
                                     "pending": pending, "leased": len(cursor.leased)})
        return QueueFigures(q.name, q.declared, q.options, q.messages, q.bytes, dict(q.counts),
                            partitions, [groups[g] for g in sorted(groups)])

    def summaries(self) -> list[QueueFigures]:
        """Every queue, declared or implicit, without the per-partition detail."""
        out = []
        for name in sorted(self.queues):
            q = self.queues[name]
            groups = sorted(q.groups)
            out.append(QueueFigures(name, q.declared, q.options, q.messages, q.bytes,
                                    dict(q.counts), [{"partition": p} for p in q.rings],
                                    [GroupFigures(g) for g in groups]))
        return out

    def figures(self) -> dict[str, Any]:
        """This broker's totals for /health and /metrics: messages and bytes held (per queue
        too), the budget, parked pops, and the counters since start."""
        return {"incarnation": self.incarnation, "queues": len(self.queues),
                "messages": self.messages, "bytes": self.bytes,
                "chargedBytes": self.used(),
                "maxBytes": self.budget, "parkedPops": self.gate.count(),
                "counts": dict(self.totals),
                "byQueue": {name: (q.messages, q.bytes) for name, q in self.queues.items()}}
