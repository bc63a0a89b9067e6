"""Second half of stats_scale.py: two broker processes on the loaded database.

Starts two brokers (``STATS_INTERVAL_MS=1000``, meshed) on the scratch database
that stats_scale.py loaded, watches their stats jobs through
``GET /api/v1/system/jobs`` (every cycle: ran or skipped, duration), and checks
the operator routes against count(*) SQL on that data set:

  /api/v1/status, /api/v1/status/queues, /api/v1/status/queues/{q},
  /api/v1/resources/overview, /api/v1/consumer-groups,
  /api/v1/consumer-groups/{g}, /api/v1/consumer-groups/lagging,
  /api/v1/dlq?queue=&limit=&offset=, /api/v1/resources/queues/{q}/depth,
  /metrics/prometheus (parsed with prometheus_client's text parser)

once on the bulk-loaded data (round 1), then again (round 2) after pushes,
pops, acks (some dead-lettered, some left under a live lease) made through
HTTP on both brokers while their stats jobs run, and after a stats cycle that
started once the last write was answered. Each route is called on both
brokers and timed.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from _harness import Broker, Database, start_brokers

QUEUE_MODE = "__QUEUE_MODE__"
SLOW_MS = 2000.0
CYCLE_LIMIT_MS = 1000.0
JSON_HEADERS = {"Content-Type": "application/json"}

# Where each route's time goes (for the findings of slow routes).
WHERE = {
    "status": "broker/http/routes/ops/status.py:status -> broker/store/ops.py:status "
              "(ops_sql MESSAGE_TOTALS_FROM_STATS, INGEST_SERIES, LEASES, DLQ_SUMMARY, DLQ_TOP_ERRORS)",
    "status/queues": "broker/http/routes/ops/status.py:status_queues -> ops.queues_status "
                     "(ops_sql.QUEUES_FROM_STATS)",
    "status/queues/{q}": "broker/http/routes/ops/status.py:status_queue -> ops.queue_status "
                         "(ops_sql.QUEUE_PARTITIONS_LIVE: live count(*) per partition)",
    "resources/overview": "broker/http/routes/ops/resources.py:overview -> ops.overview "
                          "(ops_sql.CURSOR_ROWS over every cursor row)",
    "consumer-groups": "broker/http/routes/ops/consumer_groups.py:list_groups -> ops.consumer_groups "
                       "(ops_sql.CURSOR_ROWS over every cursor row)",
    "consumer-groups/{g}": "broker/http/routes/ops/consumer_groups.py:get_group -> ops.cursor_rows "
                           "(ops_sql.CURSOR_ROWS, group filter)",
    "consumer-groups/lagging": "broker/http/routes/ops/consumer_groups.py:lagging -> ops.cursor_rows "
                               "(ops_sql.CURSOR_ROWS, min lag filter)",
    "dlq": "broker/http/routes/admin.py:dlq -> Store.dlq (sql.DLQ_COUNT, sql.DLQ_PAGE)",
    "resources/queues/{q}/depth": "broker/http/routes/ops/resources.py:depth -> ops.queue_depth "
                                  "(ops_sql.QUEUE_DEPTH)",
    "metrics/prometheus": "broker/http/routes/ops/metrics.py:metrics_prometheus -> "
                          "ops.metrics_snapshot (QUEUE_STATS_ROWS, DLQ_BY_QUEUE, LIVE_LEASE_COUNT)",
}


# ---------------------------------------------------------------------------
# count(*) references
# ---------------------------------------------------------------------------

PARTITION_REF = """
WITH eff AS (
    SELECT p.id, q.name AS queue, p.name, p.last_seq,
           (SELECT l.cursor_seq FROM queen.log_consumers l
            WHERE l.partition_id = p.id AND l.consumer_group = '__QUEUE_MODE__') AS qm_cursor,
           coalesce((SELECT l.cursor_seq FROM queen.log_consumers l
                     WHERE l.partition_id = p.id AND l.consumer_group = '__QUEUE_MODE__'),
                    (SELECT min(l.cursor_seq) FROM queen.log_consumers l
                     WHERE l.partition_id = p.id), 0) AS cur
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
)
SELECT e.id::text AS pid, e.queue, e.name, e.last_seq, e.qm_cursor,
       (SELECT count(*) FROM queen.messages m WHERE m.partition_id = e.id) AS total,
       (SELECT count(*) FROM queen.messages m WHERE m.partition_id = e.id AND m.seq > e.cur) AS pending,
       (SELECT count(DISTINCT m.id) FROM queen.messages m
        JOIN queen.log_consumers l ON l.partition_id = m.partition_id
         AND l.lease_expires_at > now() AND m.seq > l.cursor_seq AND m.seq <= l.lease_last_seq
        WHERE m.partition_id = e.id) AS processing,
       (SELECT count(*) FROM queen.dead_letter_queue d WHERE d.partition_id = e.id) AS dead
FROM eff e
"""

CURSOR_REF = """
SELECT l.consumer_group AS grp, q.name AS queue, p.name AS partition, p.id::text AS pid,
       p.last_seq, l.cursor_seq,
       (SELECT count(*) FROM queen.messages m
        WHERE m.partition_id = p.id AND m.seq > l.cursor_seq) AS lag,
       coalesce(l.lease_expires_at > now(), false) AS lease_active,
       coalesce((SELECT m.created_at FROM queen.messages m
                 WHERE m.partition_id = p.id AND m.seq > l.cursor_seq
                 ORDER BY m.seq LIMIT 1) < now() - make_interval(secs => $1), false) AS lagging
FROM queen.log_consumers l
JOIN queen.partitions p ON p.id = l.partition_id
JOIN queen.queues q ON q.id = p.queue_id
"""

DLQ_REF_COUNT = """
SELECT count(*) FROM queen.dead_letter_queue d
JOIN queen.partitions p ON p.id = d.partition_id JOIN queen.queues q ON q.id = p.queue_id
WHERE ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR d.consumer_group = $2)
"""

DLQ_REF_PAGE = """
SELECT d.id::text AS id, q.name AS queue, d.consumer_group FROM queen.dead_letter_queue d
JOIN queen.partitions p ON p.id = d.partition_id JOIN queen.queues q ON q.id = p.queue_id
WHERE ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR d.consumer_group = $2)
ORDER BY d.failed_at DESC, d.id LIMIT $3 OFFSET $4
"""

LAGGING_SECONDS = 3600
FIGS = ("total", "pending", "processing", "completed", "deadLetter")


async def reference(conn: asyncpg.Connection) -> dict:
    """Everything the routes should show, from count(*) over the base tables,
    read in one REPEATABLE READ snapshot."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        parts = {}
        for r in await conn.fetch(PARTITION_REF):
            parts[r["pid"]] = {"queue": r["queue"], "name": r["name"], "last_seq": r["last_seq"],
                               "qm_cursor": r["qm_cursor"], "total": r["total"],
                               "pending": r["pending"], "processing": r["processing"],
                               "completed": r["total"] - r["pending"], "deadLetter": r["dead"]}
        cursors = [dict(r) for r in await conn.fetch(CURSOR_REF, float(LAGGING_SECONDS))]
        dlq_by_queue = {r["queue"]: r["n"] for r in await conn.fetch("""
            SELECT q.name AS queue, count(*) AS n FROM queen.dead_letter_queue d
            JOIN queen.partitions p ON p.id = d.partition_id
            JOIN queen.queues q ON q.id = p.queue_id GROUP BY q.name""")}
        catalog = dict(await conn.fetchrow("""
            SELECT (SELECT count(*) FROM queen.queues) AS queues,
                   (SELECT count(*) FROM queen.partitions) AS partitions,
                   (SELECT count(DISTINCT namespace) FROM queen.queues WHERE namespace <> '')
                       AS namespaces,
                   (SELECT count(DISTINCT task) FROM queen.queues WHERE task <> '') AS tasks"""))
        live_leases = await conn.fetchval("""
            SELECT count(*) FROM queen.log_consumers
            WHERE lease_id IS NOT NULL AND lease_expires_at > now()""")
        dlq_total = await conn.fetchval("SELECT count(*) FROM queen.dead_letter_queue")
        messages = await conn.fetchval("SELECT count(*) FROM queen.messages")
    queues: dict[str, dict] = {}
    for p in parts.values():
        acc = queues.setdefault(p["queue"], {**dict.fromkeys(FIGS, 0), "partitions": 0})
        acc["partitions"] += 1
        for k in FIGS:
            acc[k] += p[k]
    system = {k: sum(q[k] for q in queues.values()) for k in FIGS}
    return {"parts": parts, "queues": queues, "system": system, "cursors": cursors,
            "dlq_by_queue": dlq_by_queue, "dlq_total": dlq_total, "catalog": catalog,
            "live_leases": live_leases, "messages": messages}


def summary(values: list[float]) -> dict:
    """Same shape as broker/store/ops.py:_summary."""
    if not values:
        return {"avg": 0, "median": 0, "min": 0, "max": 0}
    values = sorted(values)
    n = len(values)
    median = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return {"avg": round(sum(values) / n, 3), "median": round(median, 3),
            "min": round(values[0], 3), "max": round(values[-1], 3)}


# ---------------------------------------------------------------------------
# route checks
# ---------------------------------------------------------------------------

@dataclass
class RouteResult:
    round: str
    route: str
    broker: int
    calls: int = 0
    ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    note: str = ""


class Checker:
    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self.results: list[RouteResult] = []

    async def get(self, res: RouteResult, path: str) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            r = await self.clients[res.broker].get(path)
        except httpx.HTTPError as exc:
            res.ms.append((time.perf_counter() - started) * 1000)
            res.calls += 1
            res.problems.append(f"{path}: {type(exc).__name__}: {exc}")
            return None
        res.ms.append((time.perf_counter() - started) * 1000)
        res.calls += 1
        if r.status_code != 200:
            res.problems.append(f"{path}: HTTP {r.status_code} {r.text[:200]}")
            return None
        return r

    @staticmethod
    def cmp(res: RouteResult, what: str, got: Any, want: Any) -> None:
        if got != want:
            res.problems.append(f"{what}: route {got!r} != SQL {want!r}")

    async def run_round(self, label: str, ref: dict, queues: list[str],
                        groups: list[str]) -> None:
        for b in range(len(self.clients)):
            for name, fn in (("status", self.status), ("status/queues", self.status_queues),
                             ("status/queues/{q}", self.status_queue),
                             ("resources/overview", self.overview),
                             ("consumer-groups", self.consumer_groups),
                             ("consumer-groups/{g}", self.consumer_group),
                             ("consumer-groups/lagging", self.lagging),
                             ("dlq", self.dlq),
                             ("resources/queues/{q}/depth", self.depth),
                             ("metrics/prometheus", self.prometheus)):
                res = RouteResult(label, name, b)
                try:
                    await fn(res, ref, queues, groups)
                except Exception as exc:  # a malformed answer is a finding, not a crash
                    res.problems.append(f"{type(exc).__name__}: {exc}")
                self.results.append(res)

    # -- /api/v1/status ------------------------------------------------------
    async def status(self, res, ref, _queues, _groups):
        r = await self.get(res, "/api/v1/status")
        if r is None:
            return
        j = r.json()
        self.cmp(res, "messages", {k: j["messages"][k] for k in FIGS}, ref["system"])
        self.cmp(res, "queues", j["queues"], ref["catalog"]["queues"])
        self.cmp(res, "leases.active", j["leases"]["active"], ref["live_leases"])
        self.cmp(res, "deadLetterQueue.totalMessages", j["deadLetterQueue"]["totalMessages"],
                 ref["dlq_total"])
        if not isinstance(j.get("statsAge"), (int, float)):
            res.problems.append(f"statsAge {j.get('statsAge')!r}: stats table not used")

    # -- /api/v1/status/queues -------------------------------------------------
    async def status_queues(self, res, ref, _queues, _groups):
        r = await self.get(res, "/api/v1/status/queues?limit=1000")
        if r is None:
            return
        j = r.json()
        self.cmp(res, "pagination.total", j["pagination"]["total"], ref["catalog"]["queues"])
        got = {q["name"]: q for q in j["queues"]}
        self.cmp(res, "queue names", sorted(got), sorted(ref["queues"]))
        for name, want in ref["queues"].items():
            q = got.get(name)
            if q is None:
                continue
            self.cmp(res, f"{name} messages", {k: q["messages"][k] for k in FIGS},
                     {k: want[k] for k in FIGS})
            self.cmp(res, f"{name} partitions", q["partitions"], want["partitions"])

    # -- /api/v1/status/queues/{q} ---------------------------------------------
    async def status_queue(self, res, ref, queues, _groups):
        for name in queues:
            r = await self.get(res, f"/api/v1/status/queues/{name}")
            if r is None:
                continue
            j = r.json()
            want = ref["queues"][name]
            self.cmp(res, f"{name} totals", j["totals"], {k: want[k] for k in FIGS})
            got = {p["id"]: p for p in j["partitions"]}
            mine = {pid: p for pid, p in ref["parts"].items() if p["queue"] == name}
            self.cmp(res, f"{name} partition ids", sorted(got), sorted(mine))
            for pid, p in mine.items():
                g = got.get(pid)
                if g is None:
                    continue
                self.cmp(res, f"{name}/{p['name']} messages", g["messages"],
                         {k: p[k] for k in FIGS})
                self.cmp(res, f"{name}/{p['name']} lastSeq", g["lastSeq"], p["last_seq"])
                self.cmp(res, f"{name}/{p['name']} cursor", g["cursor"]["position"],
                         p["qm_cursor"])

    # -- /api/v1/resources/overview ---------------------------------------------
    async def overview(self, res, ref, _queues, _groups):
        r = await self.get(res, "/api/v1/resources/overview")
        if r is None:
            return
        j = r.json()
        for k in ("queues", "partitions", "namespaces", "tasks"):
            self.cmp(res, k, j[k], ref["catalog"][k])
        self.cmp(res, "messages", {k: j["messages"][k] for k in FIGS}, ref["system"])
        self.cmp(res, "lag.offset", j["lag"]["offset"],
                 summary([float(c["lag"]) for c in ref["cursors"]]))

    # -- /api/v1/consumer-groups -------------------------------------------------
    async def consumer_groups(self, res, ref, _queues, _groups):
        r = await self.get(res, "/api/v1/consumer-groups")
        if r is None:
            return
        want: dict[tuple[str, str], dict] = {}
        for c in ref["cursors"]:
            w = want.setdefault((c["grp"], c["queue"]), {"members": 0, "totalLag": 0,
                                                         "partitionsWithLag": 0,
                                                         "activeLeases": 0})
            w["members"] += 1
            w["totalLag"] += c["lag"]
            w["partitionsWithLag"] += int(c["lag"] > 0)
            w["activeLeases"] += int(c["lease_active"])
        got = {(g["name"], g["queueName"]): {k: g[k] for k in ("members", "totalLag",
                                                                "partitionsWithLag",
                                                                "activeLeases")}
               for g in r.json()}
        self.cmp(res, "(group, queue) entries", sorted(got), sorted(want))
        for key, w in want.items():
            if key in got:
                self.cmp(res, f"{key[0]}@{key[1]}", got[key], w)

    # -- /api/v1/consumer-groups/{g} -----------------------------------------------
    async def consumer_group(self, res, ref, _queues, groups):
        for grp in groups:
            r = await self.get(res, f"/api/v1/consumer-groups/{grp}")
            if r is None:
                continue
            got = {}
            for queue, body in r.json().items():
                for p in body["partitions"]:
                    got[p["partitionId"]] = (queue, p["offsetLag"], p["cursor"], p["lastSeq"],
                                             p["leaseActive"])
            want = {c["pid"]: (c["queue"], c["lag"], c["cursor_seq"], c["last_seq"],
                               c["lease_active"]) for c in ref["cursors"] if c["grp"] == grp}
            self.cmp(res, f"{grp} partitions", sorted(got), sorted(want))
            bad = [(pid, got[pid], w) for pid, w in want.items() if pid in got and got[pid] != w]
            if bad:
                res.problems.append(f"{grp}: {len(bad)} partition(s) differ "
                                    f"(queue, offsetLag, cursor, lastSeq, leaseActive), "
                                    f"e.g. route {bad[0][1]} != SQL {bad[0][2]}")

    # -- /api/v1/consumer-groups/lagging ---------------------------------------------
    async def lagging(self, res, ref, _queues, _groups):
        r = await self.get(res, f"/api/v1/consumer-groups/lagging?minLagSeconds={LAGGING_SECONDS}")
        if r is None:
            return
        got = {(x["consumer_group"], x["partition_id"]): x["offset_lag"] for x in r.json()}
        want = {(c["grp"], c["pid"]): c["lag"] for c in ref["cursors"] if c["lagging"]}
        self.cmp(res, "lagging rows", len(got), len(want))
        missing = set(want) - set(got)
        extra = set(got) - set(want)
        if missing or extra:
            res.problems.append(f"lagging set: {len(missing)} missing, {len(extra)} unexpected")
        bad = [k for k in want if k in got and got[k] != want[k]]
        if bad:
            res.problems.append(f"{len(bad)} offset_lag(s) differ, e.g. {bad[0]}: "
                                f"route {got[bad[0]]} != SQL {want[bad[0]]}")

    # -- /api/v1/dlq ---------------------------------------------------------------
    async def dlq(self, res, ref, queues, _groups):
        conn: asyncpg.Connection = ref["conn"]
        cases = [(None, None, 25, 0), (queues[0], None, 50, 10), (queues[1], "g1", 10, 3),
                 (queues[2], None, 1000, 0)]
        for queue, grp, limit, offset in cases:
            qs = f"limit={limit}&offset={offset}"
            if queue:
                qs += f"&queue={queue}"
            if grp:
                qs += f"&consumerGroup={grp}"
            r = await self.get(res, f"/api/v1/dlq?{qs}")
            if r is None:
                continue
            j = r.json()
            total = await conn.fetchval(DLQ_REF_COUNT, queue, grp)
            page = await conn.fetch(DLQ_REF_PAGE, queue, grp, limit, offset)
            self.cmp(res, f"dlq?{qs} total", j["total"], total)
            self.cmp(res, f"dlq?{qs} page ids", [m["id"] for m in j["messages"]],
                     [p["id"] for p in page])
            self.cmp(res, f"dlq?{qs} page queues", [m["queue"] for m in j["messages"]],
                     [p["queue"] for p in page])

    # -- /api/v1/resources/queues/{q}/depth ----------------------------------------------
    async def depth(self, res, ref, queues, groups):
        for name in queues:
            r = await self.get(res, f"/api/v1/resources/queues/{name}/depth")
            if r is None:
                continue
            j = r.json()
            want = {p["name"]: p["pending"] for p in ref["parts"].values() if p["queue"] == name}
            got = {p["partition"]: p["pending"] for p in j["partitions"]}
            self.cmp(res, f"{name} depth per partition", got, want)
            self.cmp(res, f"{name} pending", j["pending"], sum(want.values()))
        name, grp = queues[0], groups[0]
        r = await self.get(res, f"/api/v1/resources/queues/{name}/depth?group={grp}")
        if r is not None:
            got = {p["partition"]: p["pending"] for p in r.json()["partitions"]}
            want = {c["partition"]: c["lag"] for c in ref["cursors"]
                    if c["queue"] == name and c["grp"] == grp}
            self.cmp(res, f"{name} depth?group={grp}", got, want)

    # -- /metrics/prometheus --------------------------------------------------------
    async def prometheus(self, res, ref, _queues, _groups):
        r = await self.get(res, "/metrics/prometheus")
        if r is None:
            return
        ctype = r.headers.get("content-type", "")
        if not ctype.startswith("text/plain"):
            res.problems.append(f"content-type {ctype!r}")
        families = list(text_string_to_metric_families(r.text))  # raises when malformed
        seen: set = set()
        samples: dict[str, dict[tuple, float]] = {}
        for fam in families:
            if fam.type == "unknown":
                res.problems.append(f"family {fam.name} has no TYPE")
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in seen:
                    res.problems.append(f"duplicate sample {key}")
                seen.add(key)
                samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        pending = {dict(k)["queue"]: v for k, v in samples.get("queen_queue_pending", {}).items()}
        processing = {dict(k)["queue"]: v
                      for k, v in samples.get("queen_queue_processing", {}).items()}
        self.cmp(res, "queen_queue_pending", pending,
                 {q: float(w["pending"]) for q, w in ref["queues"].items()})
        self.cmp(res, "queen_queue_processing", processing,
                 {q: float(w["processing"]) for q, w in ref["queues"].items()})
        self.cmp(res, "queen_dlq_depth", samples.get("queen_dlq_depth", {}).get(()),
                 float(ref["dlq_total"]))
        self.cmp(res, "queen_dlq_depth_by_queue",
                 {dict(k)["queue"]: v for k, v in samples.get("queen_dlq_depth_by_queue",
                                                               {}).items()},
                 {q: float(n) for q, n in ref["dlq_by_queue"].items()})
        self.cmp(res, "queen_leases_active", samples.get("queen_leases_active", {}).get(()),
                 float(ref["live_leases"]))
        self.cmp(res, "queen_database_up", samples.get("queen_database_up", {}).get(()), 1.0)
        res.note = f"{len(families)} families, {len(seen)} samples parsed"


# ---------------------------------------------------------------------------
# stats job watching
# ---------------------------------------------------------------------------

class CycleWatch:
    """Polls GET /api/v1/system/jobs on every broker; records each stats cycle
    (the job answers stats() between cycles, so lastStartedAt/lastResult belong
    to the same, finished cycle)."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self.cycles: list[dict[float, dict]] = [{} for _ in clients]
        self.last: list[dict | None] = [None for _ in clients]
        self.poll_errors = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def poll_once(self) -> None:
        for i, c in enumerate(self.clients):
            try:
                j = (await c.get("/api/v1/system/jobs", timeout=10)).json()["stats"]
            except Exception:
                self.poll_errors += 1
                continue
            self.last[i] = j
            if j.get("lastStartedAt") and j.get("lastResult"):
                self.cycles[i][j["lastStartedAt"]] = {
                    "broker": i, "start": j["lastStartedAt"], **j["lastResult"]}

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self.poll_once()
            try:
                await asyncio.wait_for(self._stop.wait(), 0.15)
            except TimeoutError:
                pass

    async def wait_for_cycle_after(self, t: float, timeout: float = 15.0) -> dict | None:
        """The first stats cycle (on any broker) that ran (not skipped) and started after ``t``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self.poll_once()
            done = [c for cs in self.cycles for c in cs.values()
                    if c["start"] > t and not c.get("skipped") and "error" not in c]
            if done:
                return min(done, key=lambda c: c["start"])
            await asyncio.sleep(0.1)
        return None

    def all_cycles(self) -> list[dict]:
        return sorted((c for cs in self.cycles for c in cs.values()), key=lambda c: c["start"])


def overlapping_runs(cycles: list[dict]) -> int:
    """Pairs of cycles that ran (took the lock) on different brokers with
    overlapping [start, start + duration] windows (0 = provably never two at once)."""
    runs = [c for c in cycles if not c.get("skipped") and "error" not in c]
    n = 0
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if a["broker"] != b["broker"] and \
                    a["start"] < b["start"] + b["durationMs"] / 1000 and \
                    b["start"] < a["start"] + a["durationMs"] / 1000:
                n += 1
    return n


# ---------------------------------------------------------------------------
# HTTP traffic
# ---------------------------------------------------------------------------

@dataclass
class Traffic:
    pushed: int = 0
    push_requests: int = 0
    popped: int = 0
    acked: int = 0
    dead_lettered: int = 0
    left_leased: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def timed(self, kind: str, ms: float) -> None:
        self.latencies.setdefault(kind, []).append(ms)


async def traffic(clients: list[httpx.AsyncClient], seconds: float, queues: list[str],
                  new_partition_queue: str) -> Traffic:
    """Pushes on both brokers, queue-mode pops (some batches left under their
    lease), g1 pops with one dead-lettering ack per batch, and a new group g3;
    bounded by ``seconds`` and by a request count."""
    t = Traffic()
    deadline = time.monotonic() + seconds
    run = uuid.uuid4().hex[:6]

    async def call(kind: str, client, method: str, path: str, body: Any = None):
        started = time.perf_counter()
        if method == "GET":
            r = await client.get(path)
        else:
            r = await client.post(path, content=json.dumps(body), headers=JSON_HEADERS)
        t.timed(kind, (time.perf_counter() - started) * 1000)
        if r.status_code not in (200, 201):
            t.errors.append(f"{method} {path}: HTTP {r.status_code} {r.text[:200]}")
            return None
        return r.json()

    async def pusher(b: int) -> None:
        for i in range(60):
            if time.monotonic() > deadline:
                return
            if i % 5 == 4:
                queue, part = new_partition_queue, "http-new"
            else:
                queue, part = queues[(i + b) % len(queues)], f"p{1 + (i * 3 + b) % 10}"
            items = [{"queue": queue, "partition": part, "payload": {"b": b, "i": i, "k": k},
                      "transactionId": f"http-{run}-{b}-{i}-{k}"} for k in range(10)]
            out = await call("push", clients[b], "POST", "/api/v1/push", {"items": items})
            t.push_requests += 1
            if out is not None:
                bad = [x for x in out if x.get("status") != "queued"]
                if bad:
                    t.errors.append(f"push: {bad[0]}")
                t.pushed += len(out) - len(bad)
            await asyncio.sleep(0.02)

    async def popper(b: int, queue: str, group: str | None, dlq_last: bool,
                     leave_every: int) -> None:
        for i in range(40):
            if time.monotonic() > deadline:
                return
            qs = "batch=10&wait=false" + (f"&consumerGroup={group}" if group else "")
            out = await call("pop", clients[b], "GET", f"/api/v1/pop/queue/{queue}?{qs}")
            msgs = (out or {}).get("messages") or []
            t.popped += len(msgs)
            if not msgs:
                await asyncio.sleep(0.05)
                continue
            if leave_every and i % leave_every == leave_every - 1:
                t.left_leased += len(msgs)   # stays "processing" under a live lease
                continue
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"} for m in msgs]
            if dlq_last:
                acks[-1].update(status="dlq", error="bench-http")
            body = {"acknowledgments": acks}
            if group:
                body["consumerGroup"] = group
            # ack through the other broker half of the time
            res = await call("ack", clients[(b + i) % len(clients)], "POST", "/api/v1/ack/batch",
                             body)
            if res is not None:
                failed = [x for x in res if not x.get("success")]
                if failed:
                    t.errors.append(f"ack: {failed[0]}")
                t.acked += len(res) - len(failed)
                t.dead_lettered += sum(1 for x in res if x.get("dlq"))
            await asyncio.sleep(0.03)

    await asyncio.gather(
        pusher(0), pusher(1),
        popper(1, queues[1], None, dlq_last=False, leave_every=4),
        popper(0, queues[2], "g1", dlq_last=True, leave_every=0),
        popper(1, queues[3], "g3", dlq_last=False, leave_every=5))
    return t


# ---------------------------------------------------------------------------
# the phase
# ---------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run_brokers_phase(database: Database, conn: asyncpg.Connection, verify,
                            settle_seconds: float, traffic_seconds: float) -> bool:
    """The two-broker half of stats_scale.py. Prints its tables; True when all is well."""
    failed = False
    findings: list[str] = []
    print("\nstarting two brokers (STATS_INTERVAL_MS=1000, meshed) on the loaded database ...",
          flush=True)
    started = time.perf_counter()
    brokers: list[Broker] = await asyncio.to_thread(
        start_brokers, database, 2, True, STATS_INTERVAL_MS="1000")
    print(f"brokers up in {time.perf_counter() - started:.1f} s: "
          + ", ".join(b.url for b in brokers), flush=True)
    clients = [httpx.AsyncClient(base_url=b.url, timeout=60) for b in brokers]
    watch = CycleWatch(clients)
    checker = Checker(clients)
    queue_names = [r["name"] for r in await conn.fetch(
        "SELECT name FROM queen.queues ORDER BY created_at, name")]
    queue_names.sort(key=lambda n: int(n.rsplit("q", 1)[1]) if n.rsplit("q", 1)[1].isdigit() else 0)
    groups = ["g1", "g2", QUEUE_MODE, "g3"]
    traffic_queues = queue_names[:5]
    new_partition_queue = queue_names[-1]
    try:
        watch.start()
        await asyncio.sleep(settle_seconds)       # a few periodic cycles on each broker
        t_static = time.time()
        cycle = await watch.wait_for_cycle_after(t_static - settle_seconds)
        if cycle is None:
            failed = True
            print("  NO stats cycle ran on either broker during the settle period")

        async def check_round(label: str) -> None:
            nonlocal failed
            problems = await verify(conn)
            print(f"  [{label}] queen.stats vs count(*): "
                  + ("exact" if not problems else f"{len(problems)} MISMATCH(ES): {problems[:3]}"),
                  flush=True)
            if problems:
                failed = True
                findings.append(f"{label}: queen.stats != count(*): {problems[:3]}")
            ref = await reference(conn)
            ref["conn"] = conn
            print(f"  [{label}] reference: {ref['messages']:,} messages, "
                  f"{ref['catalog']['partitions']} partitions, {len(ref['cursors'])} cursor rows, "
                  f"{ref['live_leases']} live leases, {ref['dlq_total']} DLQ rows", flush=True)
            await checker.run_round(label, ref, queue_names, groups)

        await check_round("round 1: bulk data")

        print(f"  HTTP traffic on both brokers for up to {traffic_seconds:.0f} s ...", flush=True)
        tr = await traffic(clients, traffic_seconds, traffic_queues, new_partition_queue)
        t_written = time.time()
        print(f"  traffic: {tr.pushed} pushed ({tr.push_requests} requests), {tr.popped} popped, "
              f"{tr.acked} acked ({tr.dead_lettered} dead-lettered), {tr.left_leased} left "
              f"under a live lease, {len(tr.errors)} error(s)", flush=True)
        for kind, values in sorted(tr.latencies.items()):
            print(f"    {kind:<5} n={len(values):<4} p50 {_pct(values, .5):7.1f} ms  "
                  f"p95 {_pct(values, .95):7.1f} ms  max {max(values):7.1f} ms")
        if tr.errors:
            failed = True
            findings.append(f"HTTP traffic errors: {tr.errors[:3]}")
        cycle = await watch.wait_for_cycle_after(t_written)
        if cycle is None:
            failed = True
            findings.append("no stats cycle ran after the HTTP traffic within 15 s")
        else:
            print(f"  next cycle after the last write: broker {cycle['broker']}, "
                  f"{cycle['durationMs']:.1f} ms, {cycle.get('recounted')} partition(s) "
                  f"recounted", flush=True)
        await check_round("round 2: after HTTP traffic")

        # A forced full recount through the route (the periodic job does one every
        # 360 cycles), retried while the other broker holds the lock.
        full = None
        for _ in range(10):
            r = await clients[0].post("/api/v1/stats/refresh", content='{"full": true}',
                                      headers=JSON_HEADERS)
            body = r.json()
            if r.status_code == 200 and not body.get("skipped"):
                full = body
                break
            await asyncio.sleep(0.2)
        if full is None:
            failed = True
            findings.append("POST /api/v1/stats/refresh {full:true} never ran (always skipped)")
        else:
            problems = await verify(conn)
            ok = not problems and full["durationMs"] < CYCLE_LIMIT_MS
            failed = failed or not ok
            print(f"  forced full recount via POST /api/v1/stats/refresh on broker 0: "
                  f"{full['durationMs']:.1f} ms, stats "
                  + ("exact" if not problems else f"MISMATCH {problems[:2]}"), flush=True)
            if full["durationMs"] >= CYCLE_LIMIT_MS:
                findings.append(f"forced full stats cycle took {full['durationMs']:.0f} ms (>= 1 s)")
        # Lock probe: a full refresh forced on both brokers at the same moment; the
        # transaction lock 737002 must let exactly one of two overlapping cycles run.
        probes = []
        for _ in range(3):
            answers = await asyncio.gather(*(
                c.post("/api/v1/stats/refresh", content='{"full": true}', headers=JSON_HEADERS)
                for c in clients))
            probes.append(["skipped" if a.json().get("skipped") else
                           f"ran {a.json().get('durationMs', 0):.0f} ms" for a in answers])
            await asyncio.sleep(0.3)
        print("  simultaneous forced full refresh on both brokers (broker 0 | broker 1): "
              + "; ".join(" | ".join(p) for p in probes), flush=True)
        await asyncio.sleep(1.5)
        await watch.poll_once()
    finally:
        await watch.stop()
        for c in clients:
            await c.aclose()
        for b in brokers:
            b.stop()

    # -- stats cycles -------------------------------------------------------------
    cycles = watch.all_cycles()
    print("\nstats job on each broker (GET /api/v1/system/jobs; interval 1000 ms)")
    print(f"  {'broker':<8}{'cycles':>7}{'ran':>6}{'skipped':>9}{'failed':>8}{'full':>6}"
          f"{'recounted':>11}   ran-cycle ms (seen): n / p50 / max")
    for i, last in enumerate(watch.last):
        if last is None:
            print(f"  bench-{i}  (no answer)")
            failed = True
            continue
        runs = [c["durationMs"] for c in cycles if c["broker"] == i and not c.get("skipped")
                and "error" not in c]
        print(f"  bench-{i:<2}{last['cycles']:>7}{last['ran']:>6}{last['skipped']:>9}"
              f"{last['failures']:>8}{last['fullCycles']:>6}{last['partitionsRecounted']:>11}   "
              f"{len(runs)} / {statistics.median(runs) if runs else 0:.1f} / "
              f"{max(runs) if runs else 0:.1f}")
        if last["failures"]:
            failed = True
            findings.append(f"bench-{i}: {last['failures']} failed stats cycle(s): "
                            f"{last['lastError']}")
    ran = [c for c in cycles if not c.get("skipped") and "error" not in c]
    slow_cycles = [c for c in ran if c["durationMs"] >= CYCLE_LIMIT_MS]
    overlaps = overlapping_runs(cycles)
    print(f"  cycles seen: {len(cycles)} ({len(ran)} ran, {len(cycles) - len(ran)} skipped); "
          f"max ran-cycle {max((c['durationMs'] for c in ran), default=0):.1f} ms "
          f"(limit {CYCLE_LIMIT_MS:.0f} ms); ran cycles overlapping across brokers: {overlaps}")
    if slow_cycles:
        failed = True
        findings.append(f"{len(slow_cycles)} stats cycle(s) >= 1 s: "
                        f"{[round(c['durationMs']) for c in slow_cycles][:5]}")
    if overlaps:
        findings.append(f"{overlaps} pair(s) of ran cycles overlapped in time across brokers "
                        f"(the advisory lock should make that impossible)")
        failed = True

    # -- route table ----------------------------------------------------------------
    print("\noperator routes vs count(*) SQL (each route on both brokers)")
    print(f"  {'round':<28}{'route':<30}{'broker':>7}{'calls':>6}{'max ms':>9}{'sum ms':>9}  result")
    for res in checker.results:
        mx = max(res.ms) if res.ms else 0.0
        verdict = "ok" if not res.problems else f"MISMATCH ({len(res.problems)})"
        slow = "  SLOW" if mx > SLOW_MS else ""
        note = res.note
        print(f"  {res.round[:27]:<28}{res.route:<30}{res.broker:>7}{res.calls:>6}{mx:>9.1f}"
              f"{sum(res.ms):>9.1f}  {verdict}{slow}" + (f"  [{note}]" if note else ""))
        if res.problems:
            failed = True
            for p in res.problems[:4]:
                print(f"      - {p}")
            if len(res.problems) > 4:
                print(f"      ... {len(res.problems) - 4} more")
    slow_routes: dict[str, float] = {}
    for res in checker.results:
        for ms in res.ms:
            if ms > SLOW_MS:
                slow_routes[res.route] = max(slow_routes.get(res.route, 0.0), ms)
    for route, ms in sorted(slow_routes.items()):
        findings.append(f"slow route {route}: up to {ms:.0f} ms (> {SLOW_MS:.0f} ms) in "
                        f"{WHERE.get(route, '?')}")
    print("\nfindings:" if findings else "\nfindings: none")
    for f in findings:
        print(f"  - {f}")
    return not failed
