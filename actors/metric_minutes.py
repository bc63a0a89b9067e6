"""Per-minute aggregates of sampled gauges, for the metrics collector.

The collector samples this process once a second (event-loop lag, CPU, memory,
pool, waiting requests, parked long polls per queue) and flushes every
``METRICS_FLUSH_MS``. A flush writes every minute it holds samples of, in full,
so a minute is never split between flushes and a minute that ended between two
flushes is still written (the rows of a minute are replaced on upsert, never
added to). A minute is dropped once a flush after its end succeeded.

Each gauge is kept as a leaf ``{avg, min, max, last}`` (the storage format of
queen.system_metrics, see broker/store/migrations/0003_ops_shapes.sql). Plain
numbers, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class Leaf:
    total: float = 0.0
    count: int = 0
    low: float | None = None
    high: float | None = None
    last: float | None = None

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1
        self.low = value if self.low is None else min(self.low, value)
        self.high = value if self.high is None else max(self.high, value)
        self.last = value

    def as_json(self, digits: int = 3) -> dict:
        if not self.count:
            return {"avg": None, "min": None, "max": None, "last": None}
        return {"avg": round(self.total / self.count, digits), "min": self.low,
                "max": self.high, "last": self.last}


@dataclass
class Minute:
    """The samples of one minute: named leaves, per-queue parked leaves."""
    samples: int = 0
    leaves: dict[str, Leaf] = field(default_factory=dict)
    parked: dict[str, Leaf] = field(default_factory=dict)

    def leaf(self, name: str) -> Leaf:
        return self.leaves.setdefault(name, Leaf())


class MinuteBook:
    """Samples grouped by the minute they were taken in."""

    def __init__(self) -> None:
        self.minutes: dict[datetime, Minute] = {}

    def sample(self, at: datetime, values: dict[str, float | None],
               parked: dict[str, int]) -> None:
        """One sample: gauge values (None = not measured, left out) and the long
        polls parked per queue (a queue absent from ``parked`` had none)."""
        minute = self.minutes.setdefault(at.replace(second=0, microsecond=0), Minute())
        minute.samples += 1
        for name, value in values.items():
            if value is not None:
                minute.leaf(name).add(float(value))
        for queue in set(parked) | set(minute.parked):
            leaf = minute.parked.get(queue)
            if leaf is None:
                # parked on no earlier sample of this minute: those count as zeros
                leaf = minute.parked[queue] = Leaf(count=minute.samples - 1, low=0.0,
                                                   high=0.0, last=0.0)
            leaf.add(float(parked.get(queue, 0)))

    def written(self, current: datetime) -> None:
        """A flush succeeded at ``current``: minutes before its minute are final."""
        bucket = current.replace(second=0, microsecond=0)
        for at in [m for m in self.minutes if m < bucket]:
            del self.minutes[at]


def leaf_tree(minute: Minute, extra: dict | None = None) -> dict:
    """The system_metrics JSON of a minute, in the reference's nesting (absent
    leaves are all-null: not measured)."""
    def lf(name: str, digits: int = 3) -> dict:
        leaf = minute.leaves.get(name)
        return leaf.as_json(digits) if leaf else Leaf().as_json()
    tree = {
        "cpu": {"user_us": lf("cpu_user_us", 1), "system_us": lf("cpu_system_us", 1)},
        "memory": {"rss_bytes": lf("rss_bytes", 0), "virtual_bytes": lf("virtual_bytes", 0)},
        "database": {"pool_size": lf("pool_size"), "pool_idle": lf("pool_idle"),
                     "pool_active": lf("pool_active")},
        "threadpool": {"db": {"pool_size": lf("pool_max"), "queue_size": lf("db_waiting")},
                       "system": {"pool_size": Leaf().as_json(), "queue_size": Leaf().as_json()}},
        "registries": {"response": lf("requests_in_flight")},
        "event_loop": {"lag_ms": lf("event_loop_lag_ms"),
                       "lag_max_ms": lf("event_loop_lag_max_ms")},
        "long_polls": lf("long_polls"),
    }
    if extra:
        tree.update(extra)
    return tree
