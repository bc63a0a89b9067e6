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
    # latency samples are recorded by the HTTP layer into prometheus histograms; this
    # keeps only the running totals the collector writes per minute
    request_seconds_total: float = 0.0
    # waiting pops (wait=true) being served right now: parked, or mid re-check
    long_polls_in_flight: int = 0

    def observe(self, route: str, seconds: float) -> None:
        self.request_seconds_total += seconds
        for hook in self.latency_hooks:
            hook(route, seconds)

    latency_hooks: list = field(default_factory=list)

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
                "messages": dict(self.messages),
                "request_seconds_total": round(self.request_seconds_total, 6)}


telemetry = Telemetry()
