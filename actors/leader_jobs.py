"""Background jobs (docs/behaviour.md §7).

Three actors, each with its own cadence, measured from cycle start (sleep =
max(0, interval - elapsed)):

* :class:`RetentionJob` (``RETENTION_INTERVAL``): gated by the **session**
  advisory lock 737001, taken with ``pg_try_advisory_lock`` on one dedicated
  pooled connection; every step is an autocommitting statement on that
  connection; the lock is released on that connection before it goes back to
  the pool, on every exit path, and a connection whose unlock failed is
  terminated, never handed back to the pool (broker/store/jobs.py
  ``retention_lock``).
* :class:`StatsJob` (``STATS_INTERVAL_MS``): gated by the **transaction**
  advisory lock 737002; one transaction per cycle, the COMMIT releases it.
  Refreshes ``queen.stats`` incrementally (what is recounted, and why that is
  exact: broker/store/jobs_sql.py).
* :class:`MetricsCollector` (``METRICS_FLUSH_MS``): not gated; this replica's
  own ``system_metrics`` and ``worker_metrics`` rows.

A replica that cannot take a lock skips the cycle and tries again next time:
there is no leader, only whoever holds the lock right now. The two locks are
distinct, so retention and stats never wait for each other.

Each cycle goes through the actor's inbox (``run_once``), so a cycle never
interleaves with ``stats()`` or a forced run, and ``stop()`` (processed like any
message) always finds the actor between cycles: a stop never cuts a retention
cycle short with the lock held. If the actor task itself is cancelled mid-cycle
(loop shutdown) the cycle's ``finally`` still unlocks, or terminates the
connection. A failing cycle logs a warning (identical failures at most once per
``WARN_EVERY_S``) and the loop goes on; nothing here ever kills the actor.

The connections, the locks and every statement are the store's
(broker/store/jobs.py, SQL in jobs_sql.py): this module decides what runs and
when, and counts. It never imports Sanic.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psutil
from loguru import logger
from pykka import ActorDeadError

from actors.metric_minutes import Minute, MinuteBook, leaf_tree
from actors.periodic import PeriodicActor, cancel_and_wait
from broker.core.telemetry import QUEUE_COUNTERS, telemetry
from broker.store import jobs
from broker.store.health import is_outage

WARN_EVERY_S = 30.0
"""A failure identical to the previous one is logged as a warning at most this often."""

UNLOCK_TIMEOUT_S = jobs.UNLOCK_TIMEOUT_S
"""Longest wait for the retention lock's unlock; past it the connection is terminated."""

STATS_FULL_RECOUNT_EVERY = 360
"""A stats replica recounts every partition once per this many of its cycles (a
safety net: the incremental refresh is exact by construction)."""

LAG_SAMPLE_S = 0.25
"""Event-loop lag sampling period of the metrics collector."""

STOP_FLUSH_TIMEOUT_S = 2.0
"""Longest wait for the collector's last flush when it stops."""


class PeriodicJob(PeriodicActor):
    """Runs ``_cycle()`` every ``interval_ms`` through the inbox; counts and logs.

    Subclasses implement ``_cycle(**options) -> dict`` (``{"skipped": bool, ...}``;
    raising means the cycle failed) and ``_describe(result) -> str``.
    """

    job_name = "job"

    def __init__(self, interval_ms: int, first_delay_s: float | None = None) -> None:
        super().__init__()
        self._interval = interval_ms / 1000
        self._first_delay = self._interval if first_delay_s is None else first_delay_s
        self._proxy: Any = None
        self.cycles = 0            # run_once calls (periodic and forced)
        self.ran = 0               # cycles that did the work
        self.skipped = 0           # cycles that found the lock taken
        self.failures = 0          # cycles that raised
        self.last_error: str | None = None
        self.last_result: dict | None = None
        self.last_started_at: float | None = None
        self.last_duration_ms: float | None = None
        self._last_warning: tuple[str, float] | None = None
        self._suppressed = 0

    # -- lifecycle -----------------------------------------------------------
    def on_start(self) -> None:
        self._proxy = self.actor_ref.proxy()
        self.loop_name = f"job-{self.job_name}"
        super().on_start()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        await self._pause(self._first_delay)
        while True:
            started = loop.time()
            try:
                await self._proxy.run_once(periodic=True)
            except ActorDeadError:
                return
            except Exception:  # run_once swallows cycle errors; this guards its own bugs
                logger.opt(exception=True).warning("{}: cycle crashed", self.job_name)
            self.passed.fire()
            await self._pause(max(0.0, self._interval - (loop.time() - started)))

    # -- the cycle -----------------------------------------------------------
    async def run_once(self, **options: Any) -> dict:
        """One cycle now; never raises for a failing cycle (see ``"error"``)."""
        self.cycles += 1
        self.last_started_at = time.time()
        started = time.perf_counter()
        try:
            result = await self._cycle(**options)
        except Exception as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            result = {"skipped": False, "error": self.last_error}
            if is_outage(exc):  # the store's DatabaseHealth tells the outage, once
                logger.debug("{}: cycle failed: {}", self.job_name, self.last_error)
            else:
                self._warn(self.last_error)
        else:
            if result.get("skipped"):
                self.skipped += 1
            else:
                self.ran += 1
                if self._last_warning is not None:
                    logger.info("{}: cycles succeed again", self.job_name)
                    self._last_warning, self._suppressed = None, 0
        result["durationMs"] = round((time.perf_counter() - started) * 1000, 3)
        self.last_duration_ms = result["durationMs"]
        self.last_result = result
        if "error" not in result:
            logger.debug("{}: {} ({:.1f} ms)", self.job_name,
                         "skipped: lock held elsewhere" if result.get("skipped")
                         else self._describe(result), result["durationMs"])
        return result

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        last = self._last_warning
        if last is not None and last[0] == message and now - last[1] < WARN_EVERY_S:
            self._suppressed += 1
            logger.debug("{}: cycle failed: {}", self.job_name, message)
            return
        extra = f" ({self._suppressed} identical failure(s) not logged)" if self._suppressed else ""
        logger.warning("{}: cycle failed: {}{}", self.job_name, message, extra)
        self._last_warning, self._suppressed = (message, now), 0

    async def _cycle(self, **options: Any) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _describe(self, result: dict) -> str:
        return "done"

    def stats(self) -> dict:
        return {"job": self.job_name, "intervalMs": round(self._interval * 1000),
                "cycles": self.cycles, "ran": self.ran, "skipped": self.skipped,
                "failures": self.failures, "lastError": self.last_error,
                "lastStartedAt": self.last_started_at, "lastDurationMs": self.last_duration_ms,
                "lastResult": self.last_result}


# ---------------------------------------------------------------------------
# Retention (lock 737001)
# ---------------------------------------------------------------------------

class RetentionJob(PeriodicJob):
    """The retention and eviction sweep (docs/behaviour.md §7.1)."""

    job_name = "retention"

    def __init__(self, store: Any, *, interval_ms: int, batch_size: int,
                 partition_cleanup_days: int, metrics_retention_days: int,
                 acquire_timeout_s: float = 5.0, first_delay_s: float | None = None,
                 spool_forget_ms: int = 0, spool_wait_ms: int = 30_000) -> None:
        super().__init__(interval_ms, first_delay_s)
        self._store = store
        self._batch = batch_size
        self._cleanup_days = partition_cleanup_days
        self._metrics_days = metrics_retention_days
        self._acquire_timeout = acquire_timeout_s
        self._spool_forget_ms = spool_forget_ms  # FILE_BUFFER_ORDER_FORGET_MS; 0: never
        self._spool_wait_ms = spool_wait_ms      # FILE_BUFFER_ORDER_WAIT_MS
        # Monotonic time since which every cycle reached the database (None: the last one
        # failed). Spools are judged silent only after FILE_BUFFER_ORDER_WAIT_MS of it: after
        # an outage no spool could beat, and each live one beats again within that time.
        self._reached_since: float | None = None
        self.spools_forgotten = 0              # spools whose rows this job removed
        self.deleted: Counter = Counter()        # by retention type, since start
        self.partitions_dropped = 0
        self.purged: Counter = Counter()         # by table, since start
        self.lock_ends = jobs.SessionLockCounters()

    @property
    def unlock_not_held(self) -> int:
        """Unlocks that answered false (the lock was not held by the session)."""
        return self.lock_ends.unlock_not_held

    @property
    def connections_discarded(self) -> int:
        """Unlocks that failed: the connection was terminated, not given back."""
        return self.lock_ends.connections_discarded

    @property
    def sessions_lost(self) -> int:
        """Cycles whose connection closed under them (the lock went with the session)."""
        return self.lock_ends.sessions_lost

    async def _cycle(self, **_options: Any) -> dict:
        try:
            async with jobs.retention_lock(self._store, batch=self._batch,
                                           acquire_timeout_s=self._acquire_timeout,
                                           counters=self.lock_ends,
                                           unlock_timeout_s=UNLOCK_TIMEOUT_S) as session:
                if self._reached_since is None:
                    self._reached_since = time.monotonic()
                if session is None:
                    return {"skipped": True}
                return await self._sweep(session)
        except Exception:
            self._reached_since = None
            raise

    async def _sweep(self, session: jobs.RetentionSession) -> dict:
        deleted: dict[str, int] = {}
        for kind in jobs.RETENTION_KINDS:
            per_partition = await session.delete_messages(kind)
            await session.record_history(kind, per_partition)
            deleted[kind] = sum(per_partition.values())
            self.deleted[kind] += deleted[kind]
        dropped = await session.delete_inactive_partitions(self._cleanup_days)
        self.partitions_dropped += dropped
        purged: dict[str, int] = {}
        for table in jobs.METRICS_TABLES:
            purged[table] = await session.purge_metrics(table, self._metrics_days)
            self.purged[table] += purged[table]
        kv_purged = await session.purge_dead_kv()
        self.purged["kv"] += kv_purged
        return {"skipped": False, "deleted": deleted, "partitionsDropped": dropped,
                "purged": purged, "kvPurged": kv_purged,
                "spoolsForgotten": await self._forget_spools(session)}

    async def _forget_spools(self, session: jobs.RetentionSession) -> list[str]:
        """Remove the holds of spools silent for FILE_BUFFER_ORDER_FORGET_MS (docs/behaviour.md
        §5.8): past FILE_BUFFER_ORDER_WAIT_MS they no longer hold back a broker that has beaten
        that long, but they would again, for that long, each time a broker starts beating
        (at its start, or when its spool fills after a pause). A spool that comes back
        registers anew; its late pushes land with a counted order exception, as they would
        have anyway."""
        if not self._spool_forget_ms or self._reached_since is None:
            return []
        if time.monotonic() - self._reached_since < self._spool_wait_ms / 1000:
            return []
        forgotten = await session.forget_silent_spools(self._spool_forget_ms)
        for spool, partitions in forgotten:
            logger.warning("retention: spool {} was silent for more than {} ms "
                           "(FILE_BUFFER_ORDER_FORGET_MS); its holds on {} partition(s) are "
                           "removed", spool, self._spool_forget_ms, partitions)
            telemetry.spool_holds_ended["expired"] += partitions
        self.spools_forgotten += len(forgotten)
        return [spool for spool, _ in forgotten]

    def _describe(self, result: dict) -> str:
        d = result["deleted"]
        return (f"deleted retention={d['retention']} completed={d['completed_retention']} "
                f"max_wait={d['max_wait_time_eviction']}, partitions dropped="
                f"{result['partitionsDropped']}, metrics purged={sum(result['purged'].values())}")

    def stats(self) -> dict:
        return {**super().stats(), "lockId": jobs.RETENTION_LOCK_ID,
                "deleted": dict(self.deleted), "partitionsDropped": self.partitions_dropped,
                "purged": dict(self.purged), "unlockNotHeld": self.unlock_not_held,
                "connectionsDiscarded": self.connections_discarded,
                "sessionsLost": self.sessions_lost, "spoolsForgotten": self.spools_forgotten}


# ---------------------------------------------------------------------------
# Stats (lock 737002)
# ---------------------------------------------------------------------------

class StatsJob(PeriodicJob):
    """The statistics reconciler (docs/behaviour.md §7.2)."""

    job_name = "stats"

    def __init__(self, store: Any, *, interval_ms: int,
                 full_every: int = STATS_FULL_RECOUNT_EVERY,
                 first_delay_s: float | None = None) -> None:
        super().__init__(interval_ms, first_delay_s)
        self._store = store
        self._full_every = full_every
        self._since_full = 0
        self.partitions_recounted = 0
        self.full_cycles = 0

    async def _cycle(self, full: bool = False, periodic: bool = False, **_options: Any) -> dict:
        full = bool(full) or self._since_full + 1 >= self._full_every
        # The lock only keeps two cycles from overlapping; a replica whose timer fires
        # right after another replica's cycle would redo the same work. A periodic cycle
        # skips when the stats are that fresh.
        cycle = await jobs.refresh_stats(
            self._store, full=full,
            fresh_within_s=self._interval / 2 if periodic and not full else None)
        if cycle.outcome == "busy":
            return {"skipped": True}
        if cycle.outcome == "fresh":
            return {"skipped": True, "fresh": True}
        self._since_full = 0 if full else self._since_full + 1
        self.full_cycles += int(full)
        self.partitions_recounted += cycle.recounted
        return {"skipped": False, "full": full, "recounted": cycle.recounted,
                "dirtyMarks": cycle.dirty_marks, "orphansRemoved": cycle.orphans_removed,
                "rowsWritten": cycle.rows_written}

    def _describe(self, result: dict) -> str:
        return (f"{'full' if result['full'] else 'incremental'} refresh, "
                f"{result['recounted']} partition(s) recounted, "
                f"{result['orphansRemoved']} orphan row(s) removed")

    def stats(self) -> dict:
        return {**super().stats(), "lockId": jobs.STATS_LOCK_ID,
                "partitionsRecounted": self.partitions_recounted,
                "fullCycles": self.full_cycles}


# ---------------------------------------------------------------------------
# Metrics (ungated)
# ---------------------------------------------------------------------------

def flatten_counters(snapshot: dict) -> dict[str, float]:
    """Telemetry snapshot -> flat ``{name: number}`` of monotonically growing counters."""
    requests, errors, messages = (snapshot.get(k) or {} for k in ("requests", "errors", "messages"))
    out: dict[str, float] = {
        "requests_total": sum(requests.values()),
        "errors_total": sum(errors.values()),
        "request_seconds_total": snapshot.get("request_seconds_total", 0.0),
    }
    out.update({f"requests.{k}": v for k, v in requests.items()})
    out.update({f"errors.{k}": v for k, v in errors.items()})
    out.update({f"messages.{k}": v for k, v in messages.items()})
    out.update({f"ops.{k}": v for k, v in (snapshot.get("ops") or {}).items()})
    return out


def counter_deltas(current: dict[str, float], previous: dict[str, float]) -> dict[str, float]:
    """What grew since ``previous`` (floats rounded to microseconds)."""
    out = {}
    for key, value in current.items():
        delta = value - previous.get(key, 0)
        if delta:
            out[key] = round(delta, 6) if isinstance(delta, float) else delta
    return out


SAMPLE_EVERY = 4
"""Lag ticks per gauge sample (one sample a second)."""


class MetricsCollector(PeriodicJob):
    """Writes this replica's system_metrics, worker_metrics and queue_metrics rows
    and the lifetime summary (docs/behaviour.md §7.3). Gauges are sampled once a
    second into per-minute leaves (actors/metric_minutes.py); counters are the
    telemetry's growth since the last successful flush."""

    job_name = "metrics"

    def __init__(self, store: Any, *, interval_ms: int, telemetry: Any,
                 gauges: Callable[[], dict], port: int, worker_id: str, server_id: str,
                 hostname: str | None = None, first_delay_s: float | None = None) -> None:
        super().__init__(interval_ms, first_delay_s)
        self._store = store
        self._telemetry = telemetry
        self._gauges = gauges
        self._port = port
        self._worker_id = worker_id
        self._server_id = server_id
        self._hostname = hostname or socket.gethostname()
        self._pid = os.getpid()
        self._process = psutil.Process(self._pid)
        self._flushed: dict[str, float] = {}   # counters as of the last successful flush
        self._flushed_queues: dict[str, dict[str, float]] = {}
        self._book = MinuteBook()
        self._lag_task: asyncio.Task | None = None
        self._lag_last_ms = 0.0
        self._lag_max_ms = 0.0
        self._cpu_at: tuple[float, float, float] | None = None  # (wall, user, system)
        self.flushes = 0

    def on_start(self) -> None:
        super().on_start()
        self._process.cpu_percent(None)  # the first call only primes the measurement
        self._lag_task = asyncio.get_running_loop().create_task(self._sample_lag(),
                                                                name="job-metrics-lag")

    async def on_stop(self) -> None:  # type: ignore[override]  # see AsyncioActor.on_stop
        await cancel_and_wait(self._lag_task)
        await super().on_stop()
        try:  # the counters since the last flush, best effort
            await asyncio.wait_for(self._cycle(), STOP_FLUSH_TIMEOUT_S)
        except Exception as exc:
            logger.debug("metrics: last flush at stop failed: {}", exc)

    async def _sample_lag(self) -> None:
        # Plain numbers written on the actor's own loop; read by _cycle.
        loop = asyncio.get_running_loop()
        ticks: list[float] = []
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_SAMPLE_S)
            lag = max(0.0, loop.time() - before - LAG_SAMPLE_S) * 1000
            self._lag_last_ms = lag
            self._lag_max_ms = max(self._lag_max_ms, lag)
            ticks.append(lag)
            if len(ticks) >= SAMPLE_EVERY:
                try:
                    self._sample(sum(ticks) / len(ticks), max(ticks))
                except Exception as exc:  # a sample is never worth the sampler
                    logger.debug("metrics: sample failed: {}", exc)
                ticks = []

    def _cpu(self) -> tuple[float | None, float | None]:
        """CPU use since the previous sample, as percent of one core times 100."""
        times = self._process.cpu_times()
        now = time.monotonic()
        previous, self._cpu_at = self._cpu_at, (now, times.user, times.system)
        if previous is None or now <= previous[0]:
            return None, None
        wall = now - previous[0]
        return ((times.user - previous[1]) / wall * 10_000,
                (times.system - previous[2]) / wall * 10_000)

    def _sample(self, lag_avg: float, lag_max: float) -> None:
        g = self._read_gauges()
        size, idle, most = g.get("db_pool_size"), g.get("db_pool_idle"), g.get("db_pool_max")
        active = size - idle if isinstance(size, int) and isinstance(idle, int) else None
        free = most - active if isinstance(most, int) and active is not None else None
        user, system = self._cpu()
        mem = self._process.memory_info()
        t = self._telemetry
        self._book.sample(datetime.now(UTC), {
            "event_loop_lag_ms": lag_avg, "event_loop_lag_max_ms": lag_max,
            "cpu_user_us": user, "cpu_system_us": system,
            "rss_bytes": mem.rss, "virtual_bytes": mem.vms,
            "pool_size": size, "pool_idle": idle, "pool_active": active, "pool_max": most,
            "free_slots": free, "db_waiting": t.db_waiting, "long_polls": t.long_polls_in_flight,
        }, dict(t.long_polls_by_queue))

    def _read_gauges(self) -> dict:
        try:
            return dict(self._gauges() or {})
        except Exception as exc:
            logger.debug("metrics: gauges unavailable: {}", exc)
            return {}

    def _shared_state(self, g: dict) -> dict:
        """The mesh's figures in the reference's shared_state shape (None: not measured)."""
        mesh = g.get("mesh")
        if not isinstance(mesh, dict):
            return {"shared_state": {"enabled": False}}
        return {"shared_state": {
            "enabled": True,
            "server_health": {"alive": mesh.get("servers_alive"), "dead": mesh.get("servers_dead")},
            "transport": {"sent": mesh.get("messages_sent"),
                          "received": mesh.get("messages_received"),
                          "dropped": mesh.get("messages_dropped")}}}

    @staticmethod
    def _minute_gauges(minute: Minute) -> dict:
        def pick(name: str, what: str) -> float | None:
            leaf = minute.leaves.get(name)
            if leaf is None or not leaf.count:
                return None
            value = {"avg": leaf.total / leaf.count, "min": leaf.low, "max": leaf.high}[what]
            return round(value, 3) if value is not None else None
        return {"event_loop_lag_avg_ms": pick("event_loop_lag_ms", "avg"),
                "event_loop_lag_max_ms": pick("event_loop_lag_max_ms", "max"),
                "free_slots_avg": pick("free_slots", "avg"),
                "free_slots_min": pick("free_slots", "min"),
                "db_pool_size": pick("pool_size", "max"),
                "job_queue_avg": pick("db_waiting", "avg"),
                "job_queue_max": pick("db_waiting", "max"),
                "backoff_max": pick("long_polls", "max")}

    def _queue_rows(self, minute: Minute, deltas: dict[str, dict[str, float]],
                    lag_max: dict[str, float]) -> list[list]:
        """Columns for UPSERT_QUEUE_METRICS: one entry per queue with figures."""
        names = sorted(set(deltas) | set(minute.parked))
        columns: list[list] = [names]
        for counter in QUEUE_COUNTERS:
            columns.append([deltas.get(q, {}).get(counter, 0) for q in names])
        columns.append([lag_max.get(q, 0.0) for q in names])
        parked = [minute.parked.get(q) for q in names]
        columns.append([round(p.total / p.count, 3) if p and p.count else None for p in parked])
        columns.append([int(p.high) if p and p.high is not None else None for p in parked])
        return columns

    async def _cycle(self, **_options: Any) -> dict:
        now = datetime.now(UTC)
        bucket = now.replace(second=0, microsecond=0)
        g = self._read_gauges()
        if bucket not in self._book.minutes:  # no sample yet this minute (first flush)
            self._sample(self._lag_last_ms, self._lag_max_ms)
        current = flatten_counters(self._telemetry.snapshot())
        counters = counter_deltas(current, self._flushed)
        queues_now = {q: dict(c) for q, c in self._telemetry.queues.items()}
        queue_deltas = {q: d for q, c in queues_now.items()
                        if (d := counter_deltas(c, self._flushed_queues.get(q, {})))}
        lag_max = dict(self._telemetry.lag_max_ms)
        static = {"pid": self._pid, "server_id": self._server_id,
                  "uptime_seconds": round(time.time() - self._telemetry.started_at, 3),
                  "maintenance_mode": g.get("maintenance_mode"),
                  "pop_maintenance_mode": g.get("pop_maintenance_mode")}
        size, idle = g.get("db_pool_size"), g.get("db_pool_idle")
        mem = self._process.memory_info()
        instant = {  # this flush's own readings, on the current minute's row
            "cpu_percent": self._process.cpu_percent(None),
            "memory_rss_bytes": mem.rss, "memory_vms_bytes": mem.vms,
            "db_pool_size": size, "db_pool_idle": idle,
            "db_pool_active": size - idle if isinstance(size, int) and isinstance(idle, int)
            else None, "db_pool_max": g.get("db_pool_max"),
            "event_loop_lag_ms": round(self._lag_last_ms, 3),
            "event_loop_lag_max_ms": round(self._lag_max_ms, 3), "mesh": g.get("mesh")}
        minutes = []
        for at, minute in sorted(self._book.minutes.items()):
            is_now = at == bucket
            minutes.append(jobs.MinuteRows(
                at=at, samples=minute.samples,
                system={**leaf_tree(minute, self._shared_state(g)), **static,
                        **(instant if is_now else {})},
                counters=counters if is_now else {}, gauges=self._minute_gauges(minute),
                queue_columns=self._queue_rows(minute, queue_deltas if is_now else {},
                                               lag_max if is_now else {})))
        # All rows or none (one transaction): deltas never double-count.
        await jobs.write_metrics(self._store, hostname=self._hostname, port=self._port,
                                 worker_id=self._worker_id, pid=self._pid, minutes=minutes,
                                 summary=counters)
        # Only now: a failed flush carries its deltas over to the next one.
        self._book.written(now)
        self._flushed, self._flushed_queues = current, queues_now
        for queue, value in lag_max.items():
            if self._telemetry.lag_max_ms.get(queue) == value:
                del self._telemetry.lag_max_ms[queue]
        self._lag_max_ms = 0.0
        self.flushes += 1
        return {"skipped": False, "bucket": bucket.isoformat(), "counters": len(counters)}

    def _describe(self, result: dict) -> str:
        return f"flushed bucket {result['bucket']} ({result['counters']} counter(s) grew)"

    def stats(self) -> dict:
        return {**super().stats(), "hostname": self._hostname, "port": self._port,
                "workerId": self._worker_id, "pid": self._pid, "flushes": self.flushes,
                "eventLoopLagMs": round(self._lag_last_ms, 3)}


async def start_jobs(*, store: Any, settings: Any, telemetry: Any,
                     gauges: Callable[[], dict]) -> dict:
    """Start the three job actors; returns their proxies by name. They are
    stopped by ``runtime.stop_all()`` at shutdown."""
    acquire_timeout = max(settings.db_connection_timeout / 1000, 1.0)
    retention = RetentionJob.start(
        store, interval_ms=settings.retention_interval,
        batch_size=settings.retention_batch_size,
        partition_cleanup_days=settings.partition_cleanup_days,
        metrics_retention_days=settings.metrics_retention_days,
        acquire_timeout_s=acquire_timeout,
        spool_forget_ms=settings.file_buffer_order_forget_ms,
        spool_wait_ms=settings.file_buffer_order_wait_ms)
    stats = StatsJob.start(store, interval_ms=settings.stats_interval_ms)
    metrics = MetricsCollector.start(
        store, interval_ms=settings.metrics_flush_ms, telemetry=telemetry, gauges=gauges,
        port=settings.port, worker_id=settings.worker_id, server_id=settings.queen_server_id)
    logger.info("jobs: retention every {} ms (lock {}), stats every {} ms (lock {}), "
                "metrics every {} ms", settings.retention_interval, jobs.RETENTION_LOCK_ID,
                settings.stats_interval_ms, jobs.STATS_LOCK_ID, settings.metrics_flush_ms)
    return {"retention": retention.proxy(), "stats": stats.proxy(), "metrics": metrics.proxy()}
