"""Coalesces wakes received over the mesh, per queue.

A wake frame wakes, per cohort of pops parked on its queue (actors/pop_waiters.py),
one pop per partition it names, and each woken pop runs a claim query.
Unthrottled, a peer (or anyone holding the secret) sending 20 frames a second
naming 64 partitions each costs over 1,000 queries a second per cohort.
The gate passes the first remote wake of a queue at once (a real push is
seen without delay) and folds every further one that arrives within
WINDOW_S into a single wake at the end of the window, so a queue's parked
pops are woken by the mesh at most 1 / WINDOW_S times a second, whatever the
frame rate. No wake is lost, only delayed by at most WINDOW_S; local pushes
do not pass through the gate.

Memory is bounded: pending partition hints are capped per queue, and at most
MAX_QUEUES queues are tracked (queues whose window ended are forgotten when
room is needed); a wake for a further queue while all of them are inside
their window is dropped (the parked pops' re-check timer still finds the
message).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

__all__ = ["WakeGate"]

WINDOW_S = 0.25
MAX_QUEUES = 10_000
MAX_PENDING_PARTITIONS = 64  # a woken pop keeps no more hints (HINTS_PER_WAITER)

Pair = tuple[str, "str | None"]


class WakeGate:
    def __init__(self, wake: Callable[[list[Pair]], None], window_s: float = WINDOW_S,
                 max_queues: int = MAX_QUEUES, clock: Callable[[], float] = time.monotonic):
        self._wake = wake
        self.window_s = window_s
        self.max_queues = max_queues
        self._clock = clock
        self._open_until: dict[str, float] = {}  # queue -> end of its window
        # queue -> partitions to hint at the window's end (None: queue-level wake)
        self._pending: dict[str, dict[str | None, None]] = {}
        self._flusher: asyncio.TimerHandle | None = None
        self.passed = 0     # wakes handed on at once
        self.coalesced = 0  # wakes folded into a later one
        self.dropped = 0    # wakes for queues beyond max_queues

    def offer(self, pairs: Iterable[Pair]) -> None:
        now = self._clock()
        now_pairs: list[Pair] = []
        for queue, partition in pairs:
            until = self._open_until.get(queue)
            if until is not None and until > now:
                pending = self._pending.setdefault(queue, {})
                if len(pending) < MAX_PENDING_PARTITIONS:
                    pending[partition] = None
                self.coalesced += 1
                self._schedule(until - now)
                continue
            if until is None and len(self._open_until) >= self.max_queues:
                self._expire(now)
                if len(self._open_until) >= self.max_queues:
                    self.dropped += 1
                    continue
            self._open_until[queue] = now + self.window_s
            now_pairs.append((queue, partition))
        if now_pairs:
            self.passed += len({q for q, _ in now_pairs})
            self._wake(now_pairs)

    def _schedule(self, delay: float) -> None:
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().call_later(max(delay, 0.0), self._flush)

    def _expire(self, now: float) -> None:
        for queue in [q for q, until in self._open_until.items()
                      if until <= now and q not in self._pending]:
            del self._open_until[queue]

    def _flush(self) -> None:
        self._flusher = None
        now = self._clock()
        due = [q for q in self._pending if self._open_until.get(q, 0.0) <= now]
        pairs: list[Pair] = []
        for queue in due:
            pairs.extend((queue, p) for p in self._pending.pop(queue))
            self._open_until[queue] = now + self.window_s  # the trailing wake opens a window
        self._expire(now)
        if self._pending:
            soonest = min(self._open_until[q] for q in self._pending)
            self._schedule(soonest - now)
        if pairs:
            self._wake(pairs)

    def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None

    def stats(self) -> dict[str, int]:
        """`pending_queues`: queues whose folded wake is still to come (at the end of their
        window): 0 means every wake received so far has reached the parked pops."""
        return {"passed": self.passed, "coalesced": self.coalesced, "dropped": self.dropped,
                "tracked_queues": len(self._open_until), "pending_queues": len(self._pending)}
