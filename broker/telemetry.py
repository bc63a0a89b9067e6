"""Process-wide counters the metrics collector and /metrics read.

Plain integers on purpose: one event loop writes them, readers take a
snapshot. Routes bump them; nothing here does I/O.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


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
    # latency samples are recorded by the HTTP layer into prometheus histograms; this
    # keeps only the running totals the collector writes per minute
    request_seconds_total: float = 0.0
    # waiting pops (wait=true) being served right now: parked, or mid re-check
    long_polls_in_flight: int = 0
    # pop work: claim_queries (queen.pop_messages statements issued), and from
    # long_poll: attempts, timer_rechecks, shared_rechecks (a timer re-check
    # answered by another parked pop's check of the same cohort)
    pops: Counter = field(default_factory=Counter)

    def observe(self, route: str, seconds: float) -> None:
        self.request_seconds_total += seconds
        for hook in self.latency_hooks:
            hook(route, seconds)

    latency_hooks: list = field(default_factory=list)

    def snapshot(self) -> dict:
        return {"uptime_s": round(time.time() - self.started_at, 3),
                "requests": dict(self.requests), "errors": dict(self.errors),
                "messages": dict(self.messages), "stream_cycles": dict(self.stream_cycles),
                "pops": dict(self.pops),
                "request_seconds_total": round(self.request_seconds_total, 6)}


telemetry = Telemetry()
