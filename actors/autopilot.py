"""Pop autopilot: the broker sizes a pop whose client left ``batch`` or ``partitions`` unset
(docs/wire-contract.md §5.8; the 2.6 client's queen/utils/autopilot.py is the contract).

Where the state lives, and why here. One :class:`Autopilot` (a plain object, no task of its
own) belongs to the hot-list's state (actors/hotlist.py, ``HotList.pilot``), so the
``HotList`` task is its only writer. Every signal it works from already reaches that
actor: the ready partitions of a (queue, group) are its ring; committed pushes arrive as
``mark`` (local and the peers' hints: the arrival rate); a wildcard pop's verdicts come back
through ``check_in`` (what a lease took, and the queue's lease time); a released lease is
``ack_released`` (when the consumer finished). And a wildcard pop already makes one call on
that actor per attempt (``take``): ``take_sized`` decides and takes in the same turn, so
autopilot adds no message hop to the common pop. A separate actor would have needed a second
hop per pop and a copy of every one of those signals; a plain object in a service would
have been state outside an actor, which this house does not keep.

THE RULE. Only a knob the client left unset is chosen; a pinned one is used as it is and
never "adjusted". For the unset ones, per (queue, group):

- ``partitions`` = the group's fair share of the ready partitions: ceil(ready / (1 + pops of
  the group holding a lease now)), at least 1, at most ``batch`` (a partition per message of
  the budget at most) and ``MAX_PARTITIONS``. ``ready`` = the ring's READY entries after the
  due ones are promoted; 0 (cold or drained ring) gives 1: PostgreSQL scans.
- ``batch`` = a target that starts at ``START_BATCH`` and doubles after a pop that filled
  its budget, once the group's pace is known (never before: a pop that knows nothing about
  its consumers does not grow), and falls back to what the pace allows. Capped by
  ``MAX_BATCH`` and, once a pace is known, by what a consumer can finish within its lease:
  ``pace x leaseTime x SAFETY``, at least 1. A pop with ``autoAck`` has no lease to overrun:
  only the target and ``MAX_BATCH`` bound it.
- ``pace`` (messages a consumer of the group finishes per second of lease): a lease that
  took n messages at t0 and was released by an ack at t1 gives n / (t1 - t0); a lease that
  was not released within leaseTime (its consumer was too slow, or died) gives n / elapsed
  when noticed (at the next decision, or when the partition is taken again). A slower sample
  replaces the estimate at once, a faster one moves it a third of the way (slow to trust,
  quick to back off). Acks that go through another broker are not heard here: such a lease
  counts as finished when its partition is taken again (n / elapsed, a conservative sample).
- ``waitMs`` (advice to a pop that did not wait): 0 when messages came back; when it came
  back empty, the expected time to the next push of the queue, 1000 / (pushes per second),
  bounded to ``WAIT_MIN_MS``..``WAIT_MAX_MS`` (50..1000); no push seen recently gives
  ``WAIT_MAX_MS``. Pushes per second: commits marked in the hot-list (local and the peers'
  hints, one per pushed partition per commit), an exponentially weighted rate over
  ``RATE_WINDOW_S``.
- Not used: the age of the oldest ready message (the ring keeps partition names, not message
  times; reading it would cost a query per pop).

A (queue, group) nobody popped with autopilot for ``IDLE_S`` is forgotten (its next pop
starts again from ``START_BATCH``).
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["Ask", "Autopilot", "Decision", "START_BATCH"]

START_BATCH = 4          # the first batch of a (queue, group) with no pace known
MAX_BATCH = 1000         # autopilot's own ceiling (MAX_POP_BATCH bounds a pinned batch)
MAX_PARTITIONS = 32      # autopilot's own ceiling (MAX_POP_PARTITIONS bounds a pinned one)
SAFETY = 0.5             # of what the pace says a consumer finishes within its lease
WAIT_MIN_MS = 50
WAIT_MAX_MS = 1000
RATE_WINDOW_S = 5.0      # the arrival rate's time constant
IDLE_S = 600.0           # a group's sizing state is dropped after this long unused
MAX_OUTSTANDING = 1024   # leases remembered per group (the oldest are dropped first)


class Ask(NamedTuple):
    """What the client pinned: a value, or None for "the broker chooses"."""
    batch: int | None
    partitions: int | None
    auto_ack: bool = False


class Decision(NamedTuple):
    """What one pop is sized with. ``batch_chosen`` / ``partitions_chosen``: which knob the
    controller filled (the others are the client's)."""
    batch: int
    partitions: int
    batch_chosen: bool
    partitions_chosen: bool


class _Lease(NamedTuple):
    started: float
    messages: int
    partitions: list[str]


class _Group:
    __slots__ = ("holders", "lease_s", "leases", "pace", "target", "used_at")

    def __init__(self, now: float) -> None:
        self.target = START_BATCH
        self.pace: float | None = None        # messages per second per consumer
        self.lease_s: float | None = None     # the queue's leaseTime, from a claim
        # partition -> the lease a pop took on it (a lease may span several partitions)
        self.leases: OrderedDict[str, _Lease] = OrderedDict()
        self.holders = 0  # leases (pops) in self.leases
        self.used_at = now


class _Rate:
    __slots__ = ("at", "count", "rate")

    def __init__(self, now: float) -> None:
        self.at = now
        self.count = 0
        self.rate = 0.0


class Autopilot:
    """Sizing state of every (queue, group) popped with autopilot on this broker."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._groups: dict[tuple[str, str], _Group] = {}
        self._rates: dict[str, _Rate] = {}
        self._next_sweep = float("-inf")

    # --- signals ----------------------------------------------------------------------

    def pushed(self, queue: str, n: int = 1, now: float | None = None) -> None:
        """``n`` commits to partitions of ``queue`` (the arrival rate)."""
        now = self.clock() if now is None else now
        r = self._rates.get(queue)
        if r is None:
            r = self._rates[queue] = _Rate(now)
        self._fold(r, now)
        r.count += n

    def took(self, queue: str, group: str, partitions: Iterable[str], messages: int,
             lease_s: float | None, full: bool, now: float | None = None) -> None:
        """A pop's claim took ``messages`` on ``partitions`` under one lease of ``lease_s``
        (None: auto-acked); ``full``: it used its whole batch."""
        if messages <= 0:
            return
        now = self.clock() if now is None else now
        g = self._group(queue, group, now)
        if full and g.pace is not None:
            g.target = min(g.target * 2, MAX_BATCH)
        if lease_s is None:
            return
        g.lease_s = lease_s
        names = list(partitions)
        for p in names:
            old = g.leases.get(p)
            if old is not None:  # the previous lease ended unheard (another broker's ack)
                self._finished(g, old, now)
        lease = _Lease(now, messages, names)
        for p in names:
            g.leases[p] = lease
        g.holders += 1
        while len(g.leases) > MAX_OUTSTANDING:
            self._drop(g, next(iter(g.leases.values())))

    def released(self, queue: str, group: str, partition: str,
                 now: float | None = None) -> None:
        """An ack released the group's lease on ``partition``: its consumer finished."""
        g = self._groups.get((queue, group))
        if g is None:
            return
        lease = g.leases.get(partition)
        if lease is not None:
            self._finished(g, lease, self.clock() if now is None else now)

    def forget_queue(self, queue: str) -> None:
        self._rates.pop(queue, None)
        for key in [k for k in self._groups if k[0] == queue]:
            del self._groups[key]

    # --- decisions --------------------------------------------------------------------

    def decide(self, queue: str, group: str, ask: Ask, ready: int,
               now: float | None = None) -> Decision:
        """Size one pop of (queue, group) with ``ready`` partitions in its ring."""
        now = self.clock() if now is None else now
        if now >= self._next_sweep:
            self._sweep(now)
        g = self._group(queue, group, now)
        self._expire(g, now)
        if ask.batch is not None:
            batch, batch_chosen = ask.batch, False
        else:
            batch, batch_chosen = g.target, True
            if g.pace is not None and g.lease_s is not None and not ask.auto_ack:
                allowed = max(1, int(g.pace * g.lease_s * SAFETY))
                if allowed < batch:
                    batch = g.target = allowed
        if ask.partitions is not None:
            return Decision(batch, ask.partitions, batch_chosen, False)
        share = math.ceil(ready / (1 + g.holders)) if ready > 0 else 1
        return Decision(batch, max(1, min(share, batch, MAX_PARTITIONS)), batch_chosen, True)

    def wait_ms(self, queue: str | None, now: float | None = None) -> int:
        """Advice to an empty pop that did not wait: the expected wait for the next push."""
        r = self._rates.get(queue) if queue is not None else None
        if r is None:
            return WAIT_MAX_MS
        self._fold(r, self.clock() if now is None else now)
        if r.rate <= 0:
            return WAIT_MAX_MS
        return int(min(WAIT_MAX_MS, max(WAIT_MIN_MS, 1000.0 / r.rate)))

    def stats(self) -> dict[str, int]:
        return {"groups": len(self._groups),
                "leases": sum(len(g.leases) for g in self._groups.values())}

    # --- internals --------------------------------------------------------------------

    def _group(self, queue: str, group: str, now: float) -> _Group:
        g = self._groups.get((queue, group))
        if g is None:
            g = self._groups[(queue, group)] = _Group(now)
        g.used_at = now
        return g

    @staticmethod
    def _drop(g: _Group, lease: _Lease) -> None:
        """Forget a lease: all its partitions (they finish together)."""
        for p in lease.partitions:
            if g.leases.get(p) is lease:
                del g.leases[p]
        g.holders -= 1

    def _finished(self, g: _Group, lease: _Lease, now: float) -> None:
        """A lease ended (released, or noticed over): one pace sample per lease."""
        self._drop(g, lease)
        sample = lease.messages / max(now - lease.started, 1e-3)
        if g.pace is None or sample < g.pace:
            g.pace = sample
        else:
            g.pace += (sample - g.pace) / 3

    def _expire(self, g: _Group, now: float) -> None:
        """Leases older than leaseTime: their consumer did not finish in time."""
        if g.lease_s is None:
            return
        while g.leases:
            lease = next(iter(g.leases.values()))
            if now - lease.started <= g.lease_s:
                break
            self._finished(g, lease, now)

    @staticmethod
    def _fold(r: _Rate, now: float) -> None:
        dt = now - r.at
        if dt < 0.25:
            return
        weight = 1.0 - math.exp(-dt / RATE_WINDOW_S)
        r.rate += (r.count / dt - r.rate) * weight
        r.count, r.at = 0, now

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + 60.0
        for key in [k for k, g in self._groups.items() if now - g.used_at > IDLE_S]:
            del self._groups[key]
        for queue in [q for q, r in self._rates.items() if now - r.at > IDLE_S]:
            del self._rates[queue]
