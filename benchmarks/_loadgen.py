"""The load generators and small helpers the benchmarks share (the bench_*.py and scale_*.py
modules run.py registers): HTTP push and pop+ack phases and their raw-asyncpg baselines, one
benchmark's PostgreSQL + broker (``Env``), percentiles and table formatting.

``CLIENT`` picks the HTTP load generator (``raw``: _harness.RawHTTPClient, ``httpx``); run.py
sets it from ``--client`` through ``set_client``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx

from _harness import Broker, Database, RawHTTPClient, start_database

PAD = "x" * 64  # payload padding: ~100-byte JSON payloads


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "+-" + "-+-".join("-" * w for w in widths) + "-+"

    def fmt(r: list[str]) -> str:
        # first column left-aligned (labels), the rest right-aligned (numbers)
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(r, widths))) + " |"
    return "\n".join([line, fmt(cells[0]), line, *(fmt(r) for r in cells[1:]), line])


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, math.ceil(p / 100 * len(ordered)) - 1)
    return ordered[k]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def payload_json(partition: int, seq: int) -> str:
    return json.dumps({"p": partition, "seq": seq, "pad": PAD}, separators=(",", ":"))


CLIENT = "httpx"  # set from --client


def set_client(name: str) -> None:
    global CLIENT
    CLIENT = name


def http_client(url: str, concurrency: int) -> httpx.AsyncClient | RawHTTPClient:
    if CLIENT == "raw":
        return RawHTTPClient(url, max_connections=concurrency * 2 + 4)
    limits = httpx.Limits(max_connections=concurrency * 2 + 4,
                          max_keepalive_connections=concurrency * 2 + 4)
    return httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0)


async def client_ceiling(url: str, concurrency: int, seconds: float = 1.5) -> float:
    """GET /health requests/s the load generator manages at this concurrency: the ceiling
    any HTTP benchmark of this run can reach with this client on this machine."""
    done = 0
    async with http_client(url, concurrency) as client:
        await client.get("/health")
        deadline = time.perf_counter() + seconds

        async def worker(_: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await client.get("/health")
                done += 1
        elapsed = await run_workers(concurrency, worker)
    return done / elapsed


async def run_workers(concurrency: int, worker: Callable[[int], Awaitable[None]]) -> float:
    """Run ``concurrency`` workers to completion; returns the elapsed wall time in seconds."""
    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return time.perf_counter() - start


class Phase:
    """Counts of one timed phase; ``rate`` is completed messages per second."""

    def __init__(self, label: str, target: int) -> None:
        self.label = label
        self.target = target
        self.done = 0
        self.requests = 0
        self.errors = 0
        self.empty = 0
        self.elapsed = 0.0
        self.first_error: str | None = None
        self.latencies_ms: list[float] = []  # per request (http_push only)
        self.broker: dict | None = None       # _harness.BrokerMeter figures of the phase

    def error(self, text: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = text[:300]

    @property
    def rate(self) -> float | None:
        return self.done / self.elapsed if self.elapsed > 0 and self.done else None

    @property
    def truncated(self) -> bool:
        return self.done < self.target

    def as_dict(self) -> dict:
        return {"label": self.label, "target": self.target, "done": self.done,
                "requests": self.requests, "errors": self.errors, "empty_polls": self.empty,
                "elapsed_s": round(self.elapsed, 4), "msgs_per_s": self.rate,
                "truncated_by_time_cap": self.truncated, "first_error": self.first_error,
                "broker": self.broker,
                "request_ms": {"p50": percentile(self.latencies_ms, 50),
                               "p99": percentile(self.latencies_ms, 99)}}


RAW_TABLE = """
DROP TABLE IF EXISTS bench_raw;
CREATE TABLE bench_raw (
    id             uuid PRIMARY KEY,
    partition_id   uuid,
    seq            bigint,
    transaction_id text,
    payload        jsonb,
    created_at     timestamptz DEFAULT now(),
    UNIQUE (partition_id, transaction_id)
);
"""

RAW_INSERT_ONE = ("INSERT INTO bench_raw (id, partition_id, seq, transaction_id, payload) "
                  "VALUES ($1, $2, $3, $4, $5::jsonb)")
RAW_INSERT_MANY = ("INSERT INTO bench_raw (id, partition_id, seq, transaction_id, payload) "
                   "SELECT i, p, s, t, d::jsonb "
                   "FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::text[], $5::text[]) "
                   "AS u(i, p, s, t, d)")
RAW_POP_SELECT = ("SELECT id, partition_id, seq, transaction_id, payload FROM bench_raw "
                  "LIMIT $1 FOR UPDATE SKIP LOCKED")
RAW_POP_DELETE = "DELETE FROM bench_raw WHERE id = ANY($1::uuid[])"


class Rows:
    """N messages over P partitions.  Sent in chunks of ``batch``: chunk k goes to partition
    k % P (at batch 1 that is message i -> partition i % P)."""

    def __init__(self, n: int, partitions: int) -> None:
        self.n = n
        self.partitions = partitions
        self.partition_ids = [uuid.uuid4() for _ in range(partitions)]
        self.txids = [str(uuid.uuid4()) for _ in range(n)]
        self.payloads = [payload_json(i % partitions, i // partitions) for i in range(n)]

    def chunks(self, batch: int) -> list[range]:
        return [range(s, min(s + batch, self.n)) for s in range(0, self.n, batch)]

    def push_body(self, queue: str, chunk: range, batch: int) -> bytes:
        # One request targets one partition, like a producer keyed by partition.
        part = f"p{(chunk.start // batch) % self.partitions}"
        items = ",".join(
            f'{{"queue":"{queue}","partition":"{part}","transactionId":"{self.txids[i]}",'
            f'"payload":{self.payloads[i]}}}' for i in chunk)
        return ('{"items":[' + items + "]}").encode()

    def raw_args(self, chunk: range, batch: int) -> tuple[list, list, list, list, list]:
        p = self.partition_ids[(chunk.start // batch) % self.partitions]
        return ([uuid.uuid4() for _ in chunk], [p] * len(chunk),
                [i // self.partitions for i in chunk], [self.txids[i] for i in chunk],
                [self.payloads[i] for i in chunk])


# ----------------------------------------------------------------------------------------------
# phases shared by push and pop
# ----------------------------------------------------------------------------------------------

JSON_HEADERS = {"content-type": "application/json"}


async def ack_completed(client: Any, messages: list[dict], group: str | None = None) -> Any:
    """``POST /api/v1/ack/batch`` marking every popped message of ``messages`` completed
    under its lease (in ``group`` when given); the response."""
    body: dict[str, Any] = {"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"], "status": "completed"} for m in messages]}
    if group is not None:
        body["consumerGroup"] = group
    return await client.post("/api/v1/ack/batch", headers=JSON_HEADERS, content=json.dumps(body))


async def http_push(url: str, queue: str, rows: Rows, batch: int, concurrency: int,
                    cap_s: float, label: str, accepted: str = "queued") -> Phase:
    """Push ``rows`` in chunks of ``batch``; an item counts as done when its answer's status
    is ``accepted`` (``buffered`` for pushes meant for the spool)."""
    chunks = rows.chunks(batch)
    bodies = [rows.push_body(queue, c, batch) for c in chunks]  # built before the clock starts
    phase = Phase(label, rows.n)
    it = iter(zip(chunks, bodies))
    async with http_client(url, concurrency) as client:
        deadline = time.perf_counter() + cap_s

        async def worker(_: int) -> None:
            for chunk, body in it:
                if time.perf_counter() > deadline:
                    return
                try:
                    t = time.perf_counter()
                    r = await client.post("/api/v1/push", content=body, headers=JSON_HEADERS)
                    phase.latencies_ms.append((time.perf_counter() - t) * 1000)
                    phase.requests += 1
                    if r.status_code not in (200, 201):
                        phase.error(f"HTTP {r.status_code}: {r.text}")
                        continue
                    done = sum(1 for x in r.json() if x.get("status") == accepted)
                    phase.done += done
                    if done != len(chunk):
                        phase.error(f"{len(chunk) - done} items not {accepted}: {r.text}")
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    phase.error(repr(exc))

        phase.elapsed = await run_workers(concurrency, worker)
    return phase


async def raw_push(pool: asyncpg.Pool, rows: Rows, batch: int, concurrency: int,
                   cap_s: float, label: str) -> Phase:
    chunks = rows.chunks(batch)
    args = [rows.raw_args(c, batch) for c in chunks]
    phase = Phase(label, rows.n)
    it = iter(zip(chunks, args))
    deadline = time.perf_counter() + cap_s

    async def worker(_: int) -> None:
        async with pool.acquire() as con:
            for chunk, a in it:
                if time.perf_counter() > deadline:
                    return
                try:
                    if batch == 1:
                        await con.execute(RAW_INSERT_ONE, a[0][0], a[1][0], a[2][0], a[3][0],
                                          a[4][0])
                    else:
                        await con.execute(RAW_INSERT_MANY, *a)
                    phase.requests += 1
                    phase.done += len(chunk)
                except asyncpg.PostgresError as exc:
                    phase.error(repr(exc))

    phase.elapsed = await run_workers(concurrency, worker)
    return phase


async def http_pop_ack(url: str, queue: str, n: int, batch: int, concurrency: int,
                       cap_s: float, label: str) -> Phase:
    phase = Phase(label, n)
    path = f"/api/v1/pop/queue/{queue}?batch={batch}&wait=false"
    async with http_client(url, concurrency) as client:
        deadline = time.perf_counter() + cap_s

        async def worker(_: int) -> None:
            while phase.done < n and time.perf_counter() < deadline:
                try:
                    r = await client.get(path)
                    phase.requests += 1
                    if r.status_code not in (200, 204):
                        phase.error(f"pop HTTP {r.status_code}: {r.text}")
                        continue
                    body = r.json() if r.content else {}
                    messages = body.get("messages") or []
                    if not messages:
                        # every partition with messages is leased by another worker
                        phase.empty += 1
                        await asyncio.sleep(0.002)
                        continue
                    r = await ack_completed(client, messages)
                    phase.requests += 1
                    if r.status_code != 200:
                        phase.error(f"ack HTTP {r.status_code}: {r.text}")
                        continue
                    ok = sum(1 for x in r.json() if x.get("success"))
                    phase.done += ok
                    if ok != len(messages):
                        phase.error(f"{len(messages) - ok} acks refused: {r.text}")
                except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                    phase.error(repr(exc))

        phase.elapsed = await run_workers(concurrency, worker)
    return phase


async def raw_pop_ack(pool: asyncpg.Pool, n: int, batch: int, concurrency: int,
                      cap_s: float, label: str) -> Phase:
    phase = Phase(label, n)
    deadline = time.perf_counter() + cap_s

    async def worker(_: int) -> None:
        async with pool.acquire() as con:
            while phase.done < n and time.perf_counter() < deadline:
                try:
                    async with con.transaction():
                        rows = await con.fetch(RAW_POP_SELECT, batch)
                        if rows:
                            await con.execute(RAW_POP_DELETE, [r["id"] for r in rows])
                    phase.requests += 1
                    if not rows:
                        phase.empty += 1
                        await asyncio.sleep(0.002)
                        continue
                    phase.done += len(rows)
                except asyncpg.PostgresError as exc:
                    phase.error(repr(exc))

    phase.elapsed = await run_workers(concurrency, worker)
    return phase


# ----------------------------------------------------------------------------------------------
# the benchmarks
# ----------------------------------------------------------------------------------------------

class Env:
    """One benchmark's PostgreSQL + broker (+ an asyncpg pool for the baseline)."""

    def __init__(self, broker_env: dict[str, str] | None = None) -> None:
        self.broker_env = broker_env or {}
        self.db: Database | None = None
        self.broker: Broker | None = None

    def __enter__(self) -> Env:
        t = time.perf_counter()
        self.db = start_database()
        try:
            self.broker = Broker(self.db, **self.broker_env)
        except Exception:
            self.db.stop()
            raise
        log(f"{self.db.kind} PostgreSQL on {self.db.host}:{self.db.port}, broker on "
            f"{self.broker.url} (started in {time.perf_counter() - t:.1f}s)")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.broker is not None:
            self.broker.stop()
        if self.db is not None:
            self.db.stop()

    async def pool(self, size: int) -> asyncpg.Pool:
        return await asyncpg.create_pool(self.db.dsn, min_size=size, max_size=size)


async def warm_up(env: Env, args: argparse.Namespace) -> dict[str, float]:
    """Warm the broker (pool connections, queue caches) off the clock, then measure what each
    load generator can do against it (GET /health req/s): the ceiling of any HTTP figure."""
    rows = Rows(min(500, args.partitions * 20), args.partitions)
    await http_push(env.broker.url, f"bench-warmup-{uuid.uuid4().hex[:8]}", rows, 1,
                    args.concurrency, 30, "warm-up")
    global CLIENT
    chosen, ceilings = CLIENT, {}
    for CLIENT in ("httpx", "raw"):
        ceilings[CLIENT] = await client_ceiling(env.broker.url, args.concurrency)
    CLIENT = chosen
    log("client ceiling (C={}, GET /health): {}".format(
        args.concurrency, ", ".join(f"{k} {fmt_rate(v)} req/s" for k, v in ceilings.items())))
    return ceilings


def check_phases(phases: list[Phase], failures: list[str]) -> None:
    for p in phases:
        if p.errors:
            failures.append(f"{p.label}: {p.errors} errors (first: {p.first_error})")
        if p.truncated:
            log(f"note: {p.label} hit the time cap after {p.done}/{p.target} messages")


def throughput_rows(results: list[dict]) -> list[list[Any]]:
    return [[f"batch {r['batch']}", r["messages"], fmt_rate(r["broker_msgs_per_s"]),
             fmt_rate(r["raw_msgs_per_s"]), fmt_ratio(r["ratio"]),
             fmt_ms(r["broker"]["broker_cpu_ms_per_1000"]), f"{r['broker']['broker_peak_rss_mb']:.0f}"]
            for r in results]


THROUGHPUT_HEADERS = ["messages", "broker msg/s", "raw msg/s", "broker/raw",
                      "broker CPU ms/1k msgs", "broker peak RSS MB"]


def throughput_summary_rows(name: str, what: str, res: dict) -> list[list[str]]:
    """run.py's summary rows of ``push`` or ``pop`` (``what``: push, pop+ack): the load
    generator's ceiling, then broker against raw per batch size."""
    c = res["client_ceiling_req_per_s"]
    ceiling = [[f"{name}: load generator ceiling, GET /health",
                f"{fmt_rate(c[res['client']])} req/s ({res['client']})",
                f"httpx: {fmt_rate(c['httpx'])} req/s", ""]]
    return ceiling + [[f"{name}: {what} batch {r['batch']}",
                       f"{fmt_rate(r['broker_msgs_per_s'])} msg/s, "
                       f"{fmt_ms(r['broker']['broker_cpu_ms_per_1000'])} ms CPU/1k",
                       f"{fmt_rate(r['raw_msgs_per_s'])} msg/s", fmt_ratio(r["ratio"])]
                      for r in res["results"]]


def broker_summary(phases: list[Phase]) -> dict:
    """The broker figures of several rounds of one measurement: median CPU per 1,000
    messages, largest RSS and peak RSS."""
    figs = [p.broker for p in phases if p.broker]
    per = [f["broker_cpu_ms_per_1000"] for f in figs if f["broker_cpu_ms_per_1000"] is not None]
    return {"broker_cpu_ms_per_1000": median(per),
            "broker_rss_mb": max((f["broker_rss_mb"] for f in figs), default=0.0),
            "broker_peak_rss_mb": max((f["broker_peak_rss_mb"] for f in figs), default=0.0)}


def latency_summary(phases: list[Phase]) -> dict:
    """Median over rounds of the per-request p50 and p99 (ms)."""
    p50 = [p.as_dict()["request_ms"]["p50"] for p in phases if p.latencies_ms]
    p99 = [p.as_dict()["request_ms"]["p99"] for p in phases if p.latencies_ms]
    return {"p50": median(p50), "p99": median(p99)}

