"""StagingMerger: moves staged pushes (queen.staged) into the queues, on every broker.

Spools upload their files into queen.staged when PostgreSQL is back, and a direct
push to a partition that still has staged or spooled pushes is staged too
(docs/spool-drain.md). This actor runs the merge: one batch per call, each its
own transaction. Every broker runs one; the merge function takes a transaction
advisory lock, so one merges at a time and the others' calls return nothing.

When it runs: at once when told (``kick``: an upload or a staged push on this
broker), every ``busy_s`` while staged rows remain (a batch the lock or a
spool's hold left empty is retried that soon), and every ``idle_s`` otherwise
(staged rows another broker made). Between batches it reads the staged count,
so ``stats`` can show the rate and the expected time to empty.

The merge and the count are injected, so this actor knows asyncio and nothing of
SQL or HTTP. It logs one line when a drain starts (staged rows seen after none)
and one when it ends, with counts and duration. A drain ends once staging has stayed
empty for ``END_AFTER_S``: a spool uploading its files one after the other (staging
empties between two of them) is one drain, not one per file.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from loguru import logger

from actors.periodic import PeriodicActor
from broker.store.health import is_outage

WARN_EVERY_S = 30.0
RATE_WINDOW_S = 10.0  # the merge rate shown is over this much recent time
END_AFTER_S = 1.0  # staging empty this long: the drain has ended


class Batch(Protocol):
    merged: int
    duplicates: int
    late: int
    late_pairs: dict[tuple[str, str], int]


# One merge batch of at most this many rows (the service's queen.merge_staged call).
Merge = Callable[[int], Awaitable[Batch]]
# The staged rows and partitions left (a count read between batches).
Staged = Callable[[], Awaitable[tuple[int, int]]]


class StagingMerger(PeriodicActor):
    loop_name = "staging-merger"

    def __init__(self, merge: Merge, staged: Staged, *, batch: int,
                 busy_s: float = 0.02, idle_s: float = 0.5) -> None:
        super().__init__()
        self._merge = merge
        self._staged = staged
        self._batch = max(1, batch)
        self._busy_s = busy_s
        self._idle_s = idle_s
        self.staged_events = 0
        self.staged_partitions = 0
        self.merged = 0
        self.duplicates = 0
        self.order_exceptions = 0
        self.late_pairs: Counter = Counter()  # bounded: the partitions with the most
        self.batches = 0
        self.failures = 0
        self.last_error: str | None = None
        self._last_warning = 0.0
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic, rows taken) per batch
        # the drain in progress: (monotonic start, merged, duplicates, late, staged) at its start
        self._drain: tuple[float, int, int, int, int] | None = None
        self._emptied: float | None = None  # when staging was last seen empty in a drain
        self.last_drain: dict[str, Any] | None = None

    def kick(self) -> None:
        """Staged rows were added here: merge now, not at the next idle poll."""
        self.wake()

    def rate(self) -> float:
        """Rows taken out of staging per second over the last RATE_WINDOW_S (this broker's
        batches only: another broker may be the one merging)."""
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > RATE_WINDOW_S:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = max(now - self._recent[0][0], 1.0)
        return sum(n for _, n in self._recent) / span

    def stats(self) -> dict[str, Any]:
        rate = self.rate()
        eta = (round(self.staged_events / rate, 1) if rate > 0 and self.staged_events
               else (0.0 if not self.staged_events else None))
        return {
            "stagedEvents": self.staged_events,
            "stagedPartitions": self.staged_partitions,
            "mergedEvents": self.merged,
            "duplicatesDropped": self.duplicates,
            "batches": self.batches,
            "mergeRatePerSecond": round(rate, 1),
            "etaSeconds": eta,
            "draining": self._drain is not None,
            "lastDrain": self.last_drain,
            "orderExceptions": self.order_exceptions,
            "orderExceptionPartitions": [
                {"queue": q, "partition": p, "count": n}
                for (q, p), n in self.late_pairs.most_common(20)],
            "failures": self.failures,
            "lastError": self.last_error,
        }

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if is_outage(exc):  # the store's DatabaseHealth tells the outage
            logger.debug("staging merge: {}", self.last_error)
        elif time.monotonic() - self._last_warning > WARN_EVERY_S:
            self._last_warning = time.monotonic()
            logger.warning("staging merge: {}", self.last_error)

    async def _count(self) -> bool:
        """Read the staged count; False when PostgreSQL could not tell."""
        try:
            self.staged_events, self.staged_partitions = await self._staged()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(exc)
            return False
        return True

    def _drain_started(self) -> None:
        self._drain = (time.monotonic(), self.merged, self.duplicates, self.order_exceptions,
                       self.staged_events)
        logger.info("staging: drain started: {} event(s) staged so far, in {} partition(s)",
                    self.staged_events, self.staged_partitions)

    def _drain_ended(self) -> None:
        assert self._drain is not None
        since, merged, duplicates, late, at_start = self._drain
        self._drain = None
        # One drain takes in what is staged while it runs (the spool uploads file after
        # file), and other brokers merge too: the end line says how its count relates to
        # the start line's.
        taken = self.merged - merged + self.duplicates - duplicates
        if taken > at_start:
            how = f"{at_start} staged when it started, {taken - at_start} more while it ran"
        elif taken < at_start:
            how = f"of {at_start} staged when it started; other brokers merged the rest"
        else:
            how = "all staged when it started"
        took = (self._emptied or time.monotonic()) - since  # to when staging emptied
        self.last_drain = {"mergedEvents": self.merged - merged,
                           "duplicatesDropped": self.duplicates - duplicates,
                           "orderExceptions": self.order_exceptions - late,
                           "seconds": round(took, 3)}
        logger.info("staging: drain ended: {} event(s) taken here ({}): {} merged, {} "
                    "duplicate(s) dropped; {} order exception(s), {:.1f} s", taken, how,
                    self.merged - merged, self.duplicates - duplicates,
                    self.order_exceptions - late, took)

    async def _merge_batch(self) -> int:
        """One batch; the rows it took out of staging (0: nothing was eligible here)."""
        try:
            batch = await self._merge(self._batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(exc)
            return 0
        taken = batch.merged + batch.duplicates
        if taken:
            self.batches += 1
            self.merged += batch.merged
            self.duplicates += batch.duplicates
            self._recent.append((time.monotonic(), taken))
        if batch.late:
            self.order_exceptions += batch.late
            for pair, n in batch.late_pairs.items():
                if pair in self.late_pairs or len(self.late_pairs) < 1000:
                    self.late_pairs[pair] += n
            logger.warning("staging: {} order exception(s): pushes merged after pushes accepted "
                           "later to the same partition (a spool registered too late, or its "
                           "broker was taken for dead)", batch.late)
        return taken

    async def _loop(self) -> None:
        empty = 0  # batches in a row that found nothing eligible
        while True:
            pause = self._idle_s
            if await self._count():
                if self.staged_events and self._drain is None:
                    self._drain_started()
                if self.staged_events:
                    self._emptied = None
                    taken = await self._merge_batch()
                    if taken:
                        empty = 0
                        self.passed.fire()
                        continue  # more may be eligible: count again and go on
                    # Held by a spool, merged elsewhere, or settling: look again soon,
                    # backing off (a held batch scans the staged rows it skips).
                    pause = min(self._idle_s, self._busy_s * (2 ** min(empty, 10)))
                    empty += 1
                elif self._drain is not None:
                    now = time.monotonic()
                    if self._emptied is None:
                        self._emptied = now
                    if now - self._emptied >= END_AFTER_S:
                        self._drain_ended()
                        self._emptied = None
                    else:
                        pause = min(pause, END_AFTER_S)
            self.passed.fire()
            if self._wake.is_set():  # kicked while it worked: no backoff for what comes
                empty = 0
            await self._pause(pause)
