"""Process-wide counters the metrics collector and /metrics read.

Plain integers on purpose: one event loop writes them, readers take a
snapshot. Routes bump them; nothing here does I/O.
"""
from __future__ import annotations

import datetime as dt
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

QUEUE_COUNTERS = ("push_requests", "push_messages", "pop_requests", "pop_messages", "pop_empty",
                  "ack_requests", "ack_success", "ack_failed", "transactions", "lag_count",
                  "lag_sum_ms")
"""Per-queue counters the collector writes to queen.queue_metrics (column names)."""


@dataclass
class Telemetry:
    started_at: float = field(default_factory=time.time)
    # requests by route name, and errors (status >= 500) by route name
    requests: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    # messages: pushed (queued), buffered (spooled), duplicate, popped, acked, failed, dlq
    messages: Counter = field(default_factory=Counter)
    # streams cycles by outcome: committed, rolled_back, replayed (already acknowledged)
    stream_cycles: Counter = field(default_factory=Counter)
    # lock operations by "op:outcome" (acquire:acquired, acquire:already, acquire:refused,
    # renew:renewed, renew:refused, release:released, release:refused)
    locks: Counter = field(default_factory=Counter)
    # latency samples are recorded by the HTTP layer into prometheus histograms; this
    # keeps only the running totals the collector writes per minute
    request_seconds_total: float = 0.0
    # waiting pops (wait=true) being served right now: parked, or mid re-check
    long_polls_in_flight: int = 0
    # pop work: claim_queries (queen.pop_messages statements issued), and from
    # long_poll: attempts, timer_rechecks, shared_rechecks (a timer re-check
    # answered by another parked pop's check of the same cohort)
    pops: Counter = field(default_factory=Counter)
    # the same per queue (pops naming a queue), for the parked figures
    long_polls_by_queue: Counter = field(default_factory=Counter)
    # per queue: QUEUE_COUNTERS, growing; lag maxima since the collector's last flush
    queues: dict[str, defaultdict[str, float]] = field(default_factory=dict)
    lag_max_ms: dict[str, float] = field(default_factory=dict)
    # worker-wide: the QUEUE_COUNTERS summed, plus db_errors (errors about the
    # database, not about a request's values)
    ops: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    # requests waiting for a pooled database connection right now
    db_waiting: int = 0

    def observe(self, route: str, seconds: float) -> None:
        self.request_seconds_total += seconds
        for hook in self.latency_hooks:
            hook(route, seconds)

    latency_hooks: list = field(default_factory=list)

    def stream_cycle_committed(self, seconds: float) -> None:
        """A committed cycle and how long its statement took (pool wait included)."""
        self.stream_cycles["committed"] += 1
        for hook in self.cycle_hooks:
            hook(seconds)

    cycle_hooks: list = field(default_factory=list)

    def count(self, queue: str | None, name: str, n: float = 1) -> None:
        """Bump the per-queue counter ``name`` (and the worker-wide one)."""
        if not n:
            return
        self.ops[name] += n
        if queue is not None:
            self.queues.setdefault(queue, defaultdict(float))[name] += n

    def delivered(self, queue: str, created: Iterable[dt.datetime]) -> None:
        """Messages of ``queue`` handed out by a pop: count and lag (now − createdAt)."""
        now = dt.datetime.now(dt.UTC)
        lags = [max(0.0, (now - c).total_seconds() * 1000) for c in created]
        self.count(queue, "pop_messages", len(lags))
        self.count(queue, "lag_count", len(lags))
        self.count(queue, "lag_sum_ms", sum(lags))
        if lags:
            self.lag_max_ms[queue] = max(self.lag_max_ms.get(queue, 0.0), max(lags))

    def throughput_totals(self) -> dict[str, int]:
        """Messages pushed (written or spooled), popped and acknowledged (any ack this
        broker applied: completed, failed, retried or dead-lettered) since start."""
        m = self.messages
        return {"pushed": m.get("queued", 0) + m.get("buffered", 0),
                "popped": m.get("popped", 0),
                "acked": sum(v for k, v in m.items() if k.startswith("acked_")) + m.get("dlq", 0)}

    def snapshot(self) -> dict:
        return {"uptime_s": round(time.time() - self.started_at, 3),
                "requests": dict(self.requests), "errors": dict(self.errors),
                "messages": dict(self.messages), "stream_cycles": dict(self.stream_cycles),
                "pops": dict(self.pops), "ops": dict(self.ops), "locks": dict(self.locks),
                "request_seconds_total": round(self.request_seconds_total, 6)}


telemetry = Telemetry()
