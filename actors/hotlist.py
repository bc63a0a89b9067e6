"""The hot-list: in-memory wildcard-pop candidates per (queue, consumer group).

A wildcard pop takes candidate partitions from here instead of scanning
PostgreSQL for claimable ones, then lets PostgreSQL decide (claim, lease and
cursor checks) and reports one verdict per candidate back. PostgreSQL stays
the only authority on what is claimable: the hot-list may hold false positives
(cost: one empty claim attempt) and may only *miss* a pending partition until
the group's next reseed. This module does no database work; the caller (the
pop route) runs the SQL and reports back.

Per (queue, group) there is a ring: a FIFO of READY partitions without
duplicates, plus a wheel (min-heap by due time) of deferred or leased ones.
Each partition entry is in one state:

    IDLE      untracked (no entry is stored)
    READY     in the ring, waiting to be taken
    WHEEL     deferred until a due time, then READY again
    INFLIGHT  taken by a pop that has not checked in yet

and carries an epoch, bumped by every mark while it is tracked. A pop
snapshots the epoch on `take`; an "empty" check-in clears the entry only if
the epoch is unchanged, so a push racing with the claim leaves a candidate
behind rather than losing one.

Typical pop flow (broker/service/pop.py ``claim``)::

    t = hl.take(queue, group, k)     # candidates become INFLIGHT
    taken = t.entries
    if t.needs_seed:                 # cold ring, or the reseed floor is due
        try:
            parts = await scan_pending_partitions(queue, group)
        except Exception:
            hl.seed_aborted(queue, group)
            hl.check_in(queue, group, requeue(taken))
            raise
        hl.seed(queue, group, parts)
        taken += hl.take(queue, group, k - len(taken)).entries
    verdicts = await claim(taken)    # SQL
    hl.check_in(queue, group, verdicts)   # every taken candidate, or it stays INFLIGHT

The booleans that ``mark``, ``seed`` and ``ack_released`` return say whether
a ring gained READY candidates (parked pops would find something). The broker
does not need them: after every commit and every released lease it wakes one
parked pop per cohort and partition anyway (actors/hints.py,
actors/pop_waiters.py), and a woken pop that finds nothing parks again.

`HotList` is the actor itself: the broker starts it (``HotList.start(...)``) and
calls it through its proxy, so one asyncio task owns the state; the unit tests
also call a plain instance's methods directly, without a task.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from actors.autopilot import Ask, Autopilot, Decision
from actors.runtime import AsyncioActor

__all__ = [
    "DEFERRED",
    "EMPTY",
    "LEASED",
    "REQUEUE",
    "TOOK",
    "TOOK_AUTOACK",
    "HotList",
    "SizedTake",
    "Take",
]

# Entry states. IDLE entries are not stored at all.
IDLE = 0
READY = 1
WHEEL = 2
INFLIGHT = 3

# Check-in verdicts: (partition, epoch_taken, verdict, extra).
TOOK = "took"                  # delivered under a lease; extra = lease seconds
TOOK_AUTOACK = "took_autoack"  # delivered, no lease
EMPTY = "empty"                # nothing claimable, no foreign lease
LEASED = "leased"              # another worker's lease; extra = lease-until (hot-list clock)
DEFERRED = "deferred"          # delayed processing / window buffer; extra = seconds or None
REQUEUE = "requeue"            # not evaluated (budget exhausted)
_VERDICTS = frozenset({TOOK, TOOK_AUTOACK, EMPTY, LEASED, DEFERRED, REQUEUE})

# Revisit a leased partition this long after its lease expires.
LEASE_PADDING_S = 0.3
# A leased partition (this broker's lease or another's) is looked at again after at most
# this long, even when its lease is longer: the lease may be released through another
# broker, whose ack this hot-list never hears about. The pop service caps the lease times
# it reports with it.
LEASE_REVISIT_CAP_S = 5.0
# Another consumer's lease: looked at again first this long after the "leased" verdict,
# doubling per consecutive one up to LEASE_REVISIT_CAP_S. A lease is mostly ended by an
# ack, and an ack through another broker (or a lease that merely expired) reaches no ring
# here: waiting for the lease's end would leave the partition to that broker's pops alone
# for as long. Under load that showed as seconds-long stalls of one group's deliveries
# (benchmarks/README.md, "mixed load").
LEASED_REVISIT_MIN_S = 0.25
# Backoff of a "deferred" verdict that names no due time: doubles per
# consecutive deferral within these bounds.
DEFER_MIN_S = 0.05
DEFER_MAX_S = 1.0
# Bound of the mesh dirty-hint set; hints beyond it are dropped (the reseed
# floor heals a lost hint).
MAX_DIRTY = 200_000
# A peer's dirty hint adds a partition to a ring only while the ring tracks
# fewer than this many: a hint may name partitions that do not exist, and
# must not grow memory without bound. A hint dropped here costs latency only
# (the next reseed finds a real partition); local marks (committed pushes)
# are not capped.
MAX_REMOTE_RING_ENTRIES = 10_000


def _doubled(backoff: float, low: float, high: float) -> float:
    """The next step of a backoff that doubles from ``low`` (its first step) up to ``high``."""
    return min(max(backoff * 2, low), high)


class Take(NamedTuple):
    """What `take` hands a pop.

    `needs_seed`: the caller must scan PostgreSQL and call `seed` (or
    `seed_aborted` if the scan fails); it is reported to one caller at a time.
    `entries`: (partition, epoch) candidates now INFLIGHT; each needs exactly
    one verdict in a later `check_in`. `next_due`: when nothing could be
    taken, the clock time at which the ring's wheel next makes a candidate
    READY (a lease ends, a delay passes), or None: a pop that parks re-checks
    then, since nothing wakes it when a lease merely expires.
    """

    needs_seed: bool
    entries: list[tuple[str, int]]
    next_due: float | None = None


class SizedTake(NamedTuple):
    """`take_sized`'s answer: the pop autopilot's sizing and the candidates taken with it."""

    decision: Decision
    take: Take


class _Entry:
    __slots__ = ("backoff", "due", "epoch", "state", "taken_at", "wheel_seq")

    def __init__(self) -> None:
        self.state = IDLE
        self.epoch = 0
        self.taken_at = 0.0
        self.due = 0.0
        self.wheel_seq = -1  # identifies this entry's live heap item
        self.backoff = 0.0   # last backoff of a "leased" or an undated "deferred" verdict


class _Ring:
    __slots__ = ("entries", "jitter", "last_take", "ready", "seed_claimed_until", "seeded_at",
                 "wheel")

    def __init__(self, jitter: float) -> None:
        self.entries: dict[str, _Entry] = {}  # tracked (non-IDLE) partitions
        # READY partitions, FIFO; an ordered dict is an ordered set.
        self.ready: OrderedDict[str, None] = OrderedDict()
        # (due, seq, partition); stale items (seq no longer the entry's) are
        # skipped when popped.
        self.wheel: list[tuple[float, int, str]] = []
        self.seeded_at: float | None = None  # None: never seeded (cold)
        self.seed_claimed_until = float("-inf")
        self.jitter = jitter
        self.last_take = float("-inf")  # when a pop last took from this ring


class HotList(AsyncioActor):
    """Wildcard-pop candidates of every (queue, group) polled on this broker.

    `reseed_ms` (QUEEN_HOTLIST_RESEED_MS) plus a fixed random per-group jitter
    in [0, `jitter_ms`) is the reseed floor. `stranded_after_s`: an INFLIGHT
    entry taken longer ago than this is given back by a reseed (its pop
    vanished). `seed_claim_s`: how long one `needs_seed` report stands before
    another taker is asked to seed (the first one vanished). `clock` must be
    monotonic; `now` arguments are on the same clock. `track_dirty`: keep the
    mesh dirty-hint set (off when the mesh is inactive).
    """

    def __init__(
        self,
        *,
        reseed_ms: float = 30_000,
        jitter_ms: float = 15_000,
        stranded_after_s: float = 60.0,
        seed_claim_s: float = 30.0,
        max_dirty: int = MAX_DIRTY,
        track_dirty: bool = True,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        idle_ring_s: float = 600.0,
        max_remote_ring_entries: int = MAX_REMOTE_RING_ENTRIES,
    ) -> None:
        super().__init__()
        self.reseed_s = reseed_ms / 1000
        self.jitter_s = jitter_ms / 1000
        self.stranded_after_s = stranded_after_s
        self.seed_claim_s = seed_claim_s
        self.max_dirty = max_dirty
        self.max_remote_ring_entries = max_remote_ring_entries
        self.remote_marks_dropped = 0
        self.track_dirty = track_dirty
        self.clock = clock
        self._rng = rng or random.Random()
        # A group that stopped polling leaves its ring behind; rings nobody took
        # from for this long are dropped (a later poll starts cold, with a seed).
        self.idle_ring_s = idle_ring_s
        self._next_idle_sweep = float("-inf")
        self._rings: dict[str, dict[str, _Ring]] = {}  # queue -> group -> ring
        self._dirty: dict[tuple[str, str], None] = {}  # ordered set
        self._wheel_seq = 0
        # Pop autopilot's sizing state: fed by the marks, check-ins and released leases
        # this object sees (actors/autopilot.py says why it lives here).
        self.pilot = Autopilot(clock)

    # --- marking ----------------------------------------------------------

    def mark(self, queue: str, partition: str, remote: bool = False) -> bool:
        """A push to (queue, partition) committed; `remote`: a peer's HOTLIST_DIRTY hint.

        Marks the partition in every existing ring of the queue. True when
        some ring had it IDLE (the empty->pending transition). A local mark also queues a mesh dirty hint
        (coalesced per partition until drained); a remote one never does.
        """
        if not remote:
            self._add_dirty(queue, partition)
        self.pilot.pushed(queue)
        groups = self._rings.get(queue)
        if not groups:
            return False  # nobody polls this queue here: the cold seed finds it
        transitioned = False
        for ring in groups.values():
            entry = ring.entries.get(partition)
            if entry is None:
                if remote and len(ring.entries) >= self.max_remote_ring_entries:
                    self.remote_marks_dropped += 1
                    continue
                entry = ring.entries[partition] = _Entry()
                self._make_ready(ring, partition, entry)
                transitioned = True
            else:
                entry.epoch += 1  # READY / WHEEL / INFLIGHT: no second entry
        return transitioned

    def mark_many(
        self, pairs: Iterable[tuple[str, str]], remote: bool = False
    ) -> list[tuple[str, str]]:
        """`mark` for each pair; returns the pairs that transitioned (each once)."""
        return [(q, p) for q, p in pairs if self.mark(q, p, remote)]

    def _add_dirty(self, queue: str, partition: str) -> None:
        if not self.track_dirty:
            return
        key = (queue, partition)
        if key in self._dirty or len(self._dirty) >= self.max_dirty:
            return
        self._dirty[key] = None

    def pending_dirty(self) -> int:
        """How many (queue, partition) dirty hints wait to be broadcast."""
        return len(self._dirty)

    def drain_dirty(self, max_items: int | None = None) -> list[tuple[str, str]]:
        """Remove and return up to `max_items` dirty hints (all if None), oldest first."""
        if max_items is None or max_items >= len(self._dirty):
            drained = list(self._dirty)
            self._dirty.clear()
            return drained
        drained = []
        for key in self._dirty:
            if len(drained) >= max_items:
                break
            drained.append(key)
        for key in drained:
            del self._dirty[key]
        return drained

    # --- serving pops -----------------------------------------------------

    def take(self, queue: str, group: str, k: int, now: float | None = None) -> Take:
        """Up to k READY candidates, oldest first, now INFLIGHT with their epochs.

        Creates the ring on the group's first wildcard poll. A never-seeded
        ring serves nothing to the caller asked to seed it. `needs_seed` is
        also reported when the reseed floor is due, even if the ring is
        non-empty; then the entries are served as well.
        """
        now = self.clock() if now is None else now
        if now >= self._next_idle_sweep:
            self._drop_idle_rings(now)
        ring = self._ring(queue, group)
        ring.last_take = now
        needs_seed = False
        if now >= ring.seed_claimed_until and (
            ring.seeded_at is None or now >= ring.seeded_at + self.reseed_s + ring.jitter
        ):
            needs_seed = True
            ring.seed_claimed_until = now + self.seed_claim_s
            if ring.seeded_at is None:
                return Take(True, [])
        self._promote_due(ring, now)
        taken: list[tuple[str, int]] = []
        while ring.ready and len(taken) < k:
            partition, _ = ring.ready.popitem(last=False)
            entry = ring.entries[partition]
            entry.state = INFLIGHT
            entry.taken_at = now
            taken.append((partition, entry.epoch))
        next_due = None
        if not taken:
            # Items of entries promoted early (an ack released the lease) are stale: a pop
            # told to re-check at their time would look for nothing.
            wheel = ring.wheel
            while wheel and not self._live(ring, wheel[0]):
                heapq.heappop(wheel)
            next_due = wheel[0][0] if wheel else None
        return Take(needs_seed, taken, next_due)

    def take_sized(self, queue: str, group: str, ask: Ask, extra: int,
                   now: float | None = None) -> SizedTake:
        """Pop autopilot's sizing of a wildcard pop, then `take` of its partitions plus
        `extra` candidates: one turn of the actor for both."""
        now = self.clock() if now is None else now
        ring = self._rings.get(queue, {}).get(group)
        ready = 0
        if ring is not None:
            self._promote_due(ring, now)
            ready = len(ring.ready)
        decision = self.pilot.decide(queue, group, ask, ready, now)
        return SizedTake(decision, self.take(queue, group, decision.partitions + extra, now))

    def check_in(
        self,
        queue: str,
        group: str,
        verdicts: Sequence[tuple[str, int, str, Any]],
        now: float | None = None,
        took: tuple[list[str], int, float | None, bool] | None = None,
    ) -> bool:
        """One verdict per taken candidate: (partition, epoch_taken, verdict, extra).

        Entries no longer INFLIGHT (a mark, promotion or reseed got there
        first) are left alone. Returns True if any entry went back to READY.
        `took`: what an autopilot pop's claim took (partitions, messages, lease
        seconds or None when auto-acked, whether it used its whole batch), for
        the autopilot (`Autopilot.took`).
        """
        if took is not None:
            self.pilot.took(queue, group, *took, now=now)
        for taken in verdicts:
            if taken[2] not in _VERDICTS:
                raise ValueError(f"unknown hot-list verdict {taken[2]!r}")
        ring = self._rings.get(queue, {}).get(group)
        if ring is None:
            return False  # queue forgotten meanwhile
        now = self.clock() if now is None else now
        readied = False
        for partition, epoch_taken, verdict, extra in verdicts:
            entry = ring.entries.get(partition)
            if entry is None or entry.state != INFLIGHT:
                continue
            if verdict == TOOK:
                entry.backoff = 0.0
                self._to_wheel(ring, partition, entry, now + (extra or 0.0) + LEASE_PADDING_S)
            elif verdict == LEASED:
                # Never cleared: the lease holder may fail to ack.
                if extra is None:
                    due = now + DEFER_MAX_S
                else:
                    due = extra + LEASE_PADDING_S
                entry.backoff = _doubled(entry.backoff, LEASED_REVISIT_MIN_S,
                                         LEASE_REVISIT_CAP_S)
                self._to_wheel(ring, partition, entry, min(due, now + entry.backoff))
            elif verdict == DEFERRED:
                if extra is None:
                    entry.backoff = _doubled(entry.backoff, DEFER_MIN_S, DEFER_MAX_S)
                    delay = entry.backoff
                else:
                    delay = max(float(extra), 0.0)
                self._to_wheel(ring, partition, entry, now + delay)
            elif verdict == EMPTY and entry.epoch == epoch_taken:
                del ring.entries[partition]  # cleared: IDLE
            else:
                # TOOK_AUTOACK, REQUEUE, or EMPTY after a racing push.
                if verdict == TOOK_AUTOACK:
                    entry.backoff = 0.0
                self._make_ready(ring, partition, entry)
                readied = True
        return readied

    # --- pop autopilot (its state lives here: actors/autopilot.py) ---------

    def size(self, queue: str, group: str, ask: Ask) -> Decision:
        """Pop autopilot's sizing of a pop that takes no candidates from a ring
        (partition route, namespace/task discovery)."""
        return self.pilot.decide(queue, group, ask, 0)

    def pilot_took(self, queue: str, group: str, partitions: list[str], messages: int,
                   lease_s: float | None, full: bool) -> None:
        self.pilot.took(queue, group, partitions, messages, lease_s, full)

    def wait_ms(self, queue: str | None) -> int:
        return self.pilot.wait_ms(queue)

    def ack_released(self, queue: str, group: str, partition: str) -> bool:
        """An ack released the group's lease on (queue, partition).

        A WHEEL entry is promoted to READY now (True); an
        INFLIGHT one gets its epoch bumped so an "empty" verdict keeps it.
        """
        self.pilot.released(queue, group, partition)
        ring = self._rings.get(queue, {}).get(group)
        if ring is None:
            return False
        entry = ring.entries.get(partition)
        if entry is None:
            return False
        if entry.state == WHEEL:
            self._make_ready(ring, partition, entry)
            return True
        if entry.state == INFLIGHT:
            entry.epoch += 1
        return False

    # --- seeding ----------------------------------------------------------

    def seed(
        self, queue: str, group: str, partitions: Iterable[str], now: float | None = None
    ) -> bool:
        """Cold start / reseed from a PostgreSQL scan of the group's pending partitions.

        IDLE partitions become READY; INFLIGHT entries stranded for longer
        than `stranded_after_s` become READY whether listed or not (their pop
        vanished); READY and WHEEL entries keep their state. Resets the
        group's reseed clock. True if anything became READY (or, on the cold
        seed, if the ring has READY entries at all).
        """
        now = self.clock() if now is None else now
        ring = self._ring(queue, group)
        cold = ring.seeded_at is None
        readied = False
        for partition in partitions:
            if partition not in ring.entries:
                entry = ring.entries[partition] = _Entry()
                self._make_ready(ring, partition, entry)
                readied = True
        for partition, entry in ring.entries.items():
            if entry.state == INFLIGHT and now - entry.taken_at >= self.stranded_after_s:
                entry.epoch += 1  # a late check-in of the vanished pop sees a race
                self._make_ready(ring, partition, entry)
                readied = True
        ring.seeded_at = now
        ring.seed_claimed_until = float("-inf")
        return readied or (cold and bool(ring.ready))

    def seed_aborted(self, queue: str, group: str) -> None:
        """The scan asked for by `needs_seed` failed: ask the next taker instead."""
        ring = self._rings.get(queue, {}).get(group)
        if ring is not None:
            ring.seed_claimed_until = float("-inf")

    def reconcile(self, at: float | None = None) -> int:
        """The database is reachable again (after an outage or a failover): every ring is
        set right now, not at its reseed floor or after `stranded_after_s`.

        Entries INFLIGHT since `at` or earlier go back to READY (with their epoch bumped,
        as a reseed does with stranded ones): a pop that took them while the database was
        gone may still be waiting on a dead connection, and nothing but a late check-in
        would give them back. WHEEL entries become READY too: the leases and delays they
        wait on were read before the outage, and PostgreSQL re-decides each on its next
        claim (a lease still held costs one ``leased`` verdict). Every seeded ring reseeds
        on its next take, which finds what was pushed (or merged from the spool) while
        the marks could not be trusted. Returns how many entries became READY."""
        at = self.clock() if at is None else at
        readied = 0
        for groups in self._rings.values():
            for ring in groups.values():
                for partition, entry in ring.entries.items():
                    if entry.state == INFLIGHT and entry.taken_at <= at:
                        entry.epoch += 1
                    elif entry.state != WHEEL:
                        continue
                    self._make_ready(ring, partition, entry)
                    readied += 1
                ring.wheel.clear()  # every WHEEL entry is READY now: its items are stale
                if ring.seeded_at is not None:
                    ring.seeded_at = float("-inf")
                ring.seed_claimed_until = float("-inf")
        return readied

    # --- housekeeping -----------------------------------------------------

    def forget_queue(self, queue: str) -> None:
        """The queue was deleted: drop its rings and queued dirty hints."""
        self._rings.pop(queue, None)
        self.pilot.forget_queue(queue)
        for key in [key for key in self._dirty if key[0] == queue]:
            del self._dirty[key]

    def stats(self) -> dict[str, int]:
        counts = {"rings": 0, "ready": 0, "wheel": 0, "inflight": 0}
        for groups in self._rings.values():
            for ring in groups.values():
                counts["rings"] += 1
                counts["ready"] += len(ring.ready)
                for entry in ring.entries.values():
                    if entry.state == WHEEL:
                        counts["wheel"] += 1
                    elif entry.state == INFLIGHT:
                        counts["inflight"] += 1
        return counts

    # --- internals --------------------------------------------------------

    def _drop_idle_rings(self, now: float) -> None:
        """Forget rings not taken from for idle_ring_s (checked at most every 60 s)."""
        self._next_idle_sweep = now + min(60.0, self.idle_ring_s)
        for queue in list(self._rings):
            groups = self._rings[queue]
            for group in [g for g, r in groups.items() if now - r.last_take > self.idle_ring_s]:
                del groups[group]
            if not groups:
                del self._rings[queue]

    def _ring(self, queue: str, group: str) -> _Ring:
        groups = self._rings.setdefault(queue, {})
        ring = groups.get(group)
        if ring is None:
            jitter = self._rng.uniform(0, self.jitter_s) if self.jitter_s > 0 else 0.0
            ring = groups[group] = _Ring(jitter)
        return ring

    @staticmethod
    def _make_ready(ring: _Ring, partition: str, entry: _Entry) -> None:
        """Append to the ring tail (from any state; a READY entry moves to the tail)."""
        entry.state = READY
        entry.wheel_seq = -1
        ring.ready[partition] = None
        ring.ready.move_to_end(partition)

    def _to_wheel(self, ring: _Ring, partition: str, entry: _Entry, due: float) -> None:
        ring.ready.pop(partition, None)
        self._wheel_seq += 1
        entry.state = WHEEL
        entry.due = due
        entry.wheel_seq = self._wheel_seq
        heapq.heappush(ring.wheel, (due, self._wheel_seq, partition))
        # Promoted-early entries leave stale heap items behind: compact when
        # they dominate.
        if len(ring.wheel) > 64 and len(ring.wheel) > 2 * len(ring.entries):
            ring.wheel = [item for item in ring.wheel if self._live(ring, item)]
            heapq.heapify(ring.wheel)

    @staticmethod
    def _live(ring: _Ring, item: tuple[float, int, str]) -> bool:
        entry = ring.entries.get(item[2])
        return entry is not None and entry.state == WHEEL and entry.wheel_seq == item[1]

    def _promote_due(self, ring: _Ring, now: float) -> None:
        wheel = ring.wheel
        while wheel and wheel[0][0] <= now:
            item = heapq.heappop(wheel)
            if self._live(ring, item):
                self._make_ready(ring, item[2], ring.entries[item[2]])
