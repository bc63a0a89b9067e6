"""Process-wide counters, meters and histograms the metrics collector and /metrics read.

Plain integers on purpose: one event loop writes them, readers take a
snapshot. Routes bump them; nothing here does I/O. The state the metrics
routes show and cannot keep themselves lives here too (they only read and
render): the request and streams-cycle latency histograms (prometheus-client,
registered in no registry: /metrics/prometheus adds them to the one it renders),
the per-second rate meters of /metrics, and the process's own figures (CPU
percent is measured between two readings).
"""
from __future__ import annotations

import os
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil
from prometheus_client import Histogram

QUEUE_COUNTERS = ("push_requests", "push_messages", "pop_requests", "pop_messages", "pop_empty",
                  "ack_requests", "ack_success", "ack_failed", "transactions", "lag_count",
                  "lag_sum_ms")
"""Per-queue counters the collector writes to queen.queue_metrics (column names)."""

PROCESSED_KEYS = ("acked_completed", "acked_success", "dlq")
"""``messages`` counters that count a message as processed (completed or dead-lettered)."""


def request_duration_histogram() -> Histogram:
    """HTTP request latency by route (``queen_http_request_duration_seconds``)."""
    return Histogram(
        "queen_http_request_duration_seconds", "HTTP request latency by route",
        ["route"], registry=None,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))


def cycle_duration_histogram() -> Histogram:
    """Committed streams cycles' statement time (``queen_stream_cycle_duration_seconds``)."""
    return Histogram(
        "queen_stream_cycle_duration_seconds",
        "Committed streams cycles on this broker: time of the one cycle statement, pool wait "
        "included", registry=None,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))


def autopilot_batch_histogram() -> Histogram:
    """The batch of every pop that left it to autopilot (``queen_pop_autopilot_batch``)."""
    return Histogram(
        "queen_pop_autopilot_batch",
        "Message budget pop autopilot chose for a pop that left batch unset",
        registry=None, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000))


class RateMeter:
    """Per-second rate of a growing counter over about the last ``window`` seconds,
    from samples taken whenever it is read (lifetime average until a sample is
    at least a second old)."""

    def __init__(self, window: float = 60.0):
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def rate(self, value: float, started_at: float) -> float:
        """The rate now of a counter at ``value`` that started counting at ``started_at``
        (wall-clock seconds: the lifetime average's start)."""
        now = time.monotonic()
        if not self.samples or now - self.samples[-1][0] >= 1.0:
            self.samples.append((now, value))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        t0, v0 = self.samples[0]
        if now - t0 < 1.0:
            uptime = max(time.time() - started_at, 1e-3)
            return round(value / uptime, 3)
        return round((value - v0) / (now - t0), 3)


class ProcessMeter:
    """This process's CPU, memory and threads (psutil). ``cpu_percent`` is the use since
    the previous reading, so one meter per process keeps the previous reading."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())

    def figures(self) -> dict[str, float]:
        """{} when psutil cannot read the process."""
        try:
            cpu = self._process.cpu_times()
            mem = self._process.memory_info()
            return {"cpu_user": cpu.user, "cpu_system": cpu.system, "rss": mem.rss,
                    "vms": mem.vms, "threads": self._process.num_threads(),
                    "cpu_percent": self._process.cpu_percent(None)}
        except psutil.Error:  # pragma: no cover - the process reads itself
            return {}


@dataclass
class Telemetry:
    started_at: float = field(default_factory=time.time)
    # requests by route name, and errors (status >= 500) by route name
    requests: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    # messages: pushed (queued), buffered (spooled), duplicate, popped, acked, failed, dlq
    messages: Counter = field(default_factory=Counter)
    # push items refused by reason (max_size: the queue's depth would pass its maxSize)
    push_refused: Counter = field(default_factory=Counter)
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
    # pop work: claim_queries (queen.pop_messages_v5 statements issued), and from
    # long_poll: attempts, timer_rechecks, shared_rechecks (a timer re-check
    # answered by another parked pop's check of the same cohort)
    pops: Counter = field(default_factory=Counter)
    # ephemeral requests passed on to their queue's owner: forwarded, unreachable (503); and
    # the changes of the brokers alive this broker saw (members), which move queues' owners
    ephemeral_forwards: Counter = field(default_factory=Counter)
    # spool holds (queen.spool_backlog rows) this broker removed: expired (the retention job,
    # a spool silent for FILE_BUFFER_ORDER_FORGET_MS), released (the operator's route)
    spool_holds_ended: Counter = field(default_factory=Counter)
    # pops that engaged autopilot, by the knob the broker chose (batch, partitions)
    autopilot: Counter = field(default_factory=Counter)
    autopilot_batch: Histogram = field(default_factory=autopilot_batch_histogram)
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
    # latency histograms (rendered by /metrics/prometheus)
    request_duration: Histogram = field(default_factory=request_duration_histogram)
    # request_duration's child per route, looked up once (labels() takes a lock and builds
    # a key on every call); routes are the app's route names and "unrouted": a fixed set
    route_durations: dict[str, Any] = field(default_factory=dict)
    cycle_duration: Histogram = field(default_factory=cycle_duration_histogram)
    # /metrics' rates: requests, messages pushed, messages processed (per second)
    requests_rate: RateMeter = field(default_factory=RateMeter)
    pushed_rate: RateMeter = field(default_factory=RateMeter)
    processed_rate: RateMeter = field(default_factory=RateMeter)
    process: ProcessMeter = field(default_factory=ProcessMeter)

    def observe(self, route: str, seconds: float) -> None:
        self.request_seconds_total += seconds
        child = self.route_durations.get(route)
        if child is None:
            child = self.route_durations[route] = self.request_duration.labels(route)
        child.observe(seconds)

    def stream_cycle_committed(self, seconds: float) -> None:
        """A committed cycle and how long its statement took (pool wait included)."""
        self.stream_cycles["committed"] += 1
        self.cycle_duration.observe(seconds)

    def autopilot_decided(self, batch_chosen: bool, partitions_chosen: bool,
                          batch: int) -> None:
        """A pop sized by autopilot: which knobs it chose, and the batch it chose."""
        if batch_chosen:
            self.autopilot["batch"] += 1
            self.autopilot_batch.observe(batch)
        if partitions_chosen:
            self.autopilot["partitions"] += 1

    def count(self, queue: str | None, name: str, n: float = 1) -> None:
        """Bump the per-queue counter ``name`` (and the worker-wide one)."""
        if not n:
            return
        self.ops[name] += n
        if queue is not None:
            self.queues.setdefault(queue, defaultdict(float))[name] += n

    def delivered(self, queue: str, created_us: Iterable[int]) -> None:
        """Messages of ``queue`` handed out by a pop: count and lag (now − createdAt);
        ``created_us``: their creation times in microseconds since the Unix epoch."""
        now_us = time.time_ns() // 1000
        lags = [max(0.0, (now_us - c) / 1000) for c in created_us]
        self.count(queue, "pop_messages", len(lags))
        self.count(queue, "lag_count", len(lags))
        self.count(queue, "lag_sum_ms", sum(lags))
        if lags:
            self.lag_max_ms[queue] = max(self.lag_max_ms.get(queue, 0.0), max(lags))

    def pushed_total(self) -> int:
        """Messages this broker accepted (written or spooled)."""
        return self.messages.get("queued", 0) + self.messages.get("buffered", 0)

    def processed_total(self) -> int:
        """Messages this broker saw acknowledged (completed or dead-lettered)."""
        return sum(self.messages.get(k, 0) for k in PROCESSED_KEYS)

    def rates(self, total_requests: float) -> dict[str, float]:
        """Per-second rates now (each reading is a sample of its meter): ``requests``
        (of ``total_requests``), ``pushed`` and ``processed`` messages."""
        return {"requests": self.requests_rate.rate(total_requests, self.started_at),
                "pushed": self.pushed_rate.rate(self.pushed_total(), self.started_at),
                "processed": self.processed_rate.rate(self.processed_total(), self.started_at)}

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
                "push_refused": {"max_size": 0, **self.push_refused},
                "pops": dict(self.pops), "autopilot": dict(self.autopilot), "ops": dict(self.ops), "locks": dict(self.locks),
                "ephemeral_forwards": dict(self.ephemeral_forwards),
                "spool_holds_ended": {"expired": 0, "released": 0, **self.spool_holds_ended},
                "request_seconds_total": round(self.request_seconds_total, 6)}


telemetry = Telemetry()
