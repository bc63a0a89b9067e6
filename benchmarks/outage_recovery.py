#!/usr/bin/env python3
"""Recovery of a three-broker cluster after a PostgreSQL outage while traffic continues:
whether the staged drain gets every broker back to `queued` within twice the outage and
delivers what was pushed after the return within 15 s (docs/spool-drain.md).

    .venv/bin/python benchmarks/outage_recovery.py                       # stop10,stop60,failover
    .venv/bin/python benchmarks/outage_recovery.py --scenarios stop3 --rate 100   # a smoke run
    .venv/bin/python benchmarks/outage_recovery.py --json /tmp/recovery.json --logs-dir /tmp/logs

Each scenario gets a fresh embedded PostgreSQL (for ``failover``: a primary and a synchronous
streaming standby, as tests/ha/test_pg_failover.py's ``pg_pair`` builds them) and three fresh
``python -m broker`` processes on loopback (_harness.start_brokers: own FILE_BUFFER_DIR,
QUEEN_SERVER_ID bench-0..2, no mesh), with DB_CONNECTION_TIMEOUT=500 and
FILE_BUFFER_SETTLE_MS=2300.

Load: ``--producers`` (24) sequential producers, producer *i* owns partition ``k<i>`` and sends
one message per request (waiting for the answer), its *n*-th message to broker *(i+n) % 3*,
transactionId ``k<i>-<n>``, paced so that together they aim at ``--rate`` msg/s (a producer that
falls behind sends at once, without bursting to catch up; the achieved rate is reported).
One consumer group reads every partition through wildcard long polls (``--consumers`` of them,
spread over the brokers, ``--pop-batch`` messages a pop) and acks each batch, for the whole run;
so do the groups of ``--extra-groups`` (default: two groups of three consumers at batch 10, the
way users consume), each from its own cursor.  ``GET /health`` of each broker
is polled every 0.2 s (``spool.pendingCount``, ``spool.staging.stagedEvents``,
``spool.staging.mergeRatePerSecond``, ``spool.staging.mergedEvents``).

Scenarios (``--scenarios``): ``stop<S>``: 10 s of load, PostgreSQL crash-stopped
(``pg_ctl stop -m immediate``) for S s, started again, max(20, 2 S) s more load; ``failover``:
10 s of load, the primary crash-stopped, the standby promoted 0.3 s later, 30 s more load.
Then the producers stop and the benchmark waits (at most ``--drain-max-s``) until the group
has received every acknowledged push and every broker reports an empty spool and staging.

Reported per scenario: achieved msg/s; answers per status; the time from PostgreSQL's return
(``pg_ctl start`` or ``promote`` returned) until pushes answer ``queued`` again (the send time
of the earliest push after which no push answered ``buffered``); the drain (peak staged events,
peak summed merge rate, time until spools and staging are empty, events merged per second);
delivery latency (receive time - answer time) for pushes sent during the outage and in the
10 s after the return; lost, duplicated, order violations; ``spool.orderExceptions``; what the
brokers logged. Per group (``_recovery_report.group_figures``): deliveries per second and
messages per pop before, during and after the outage; per-partition starvation (the longest
time a partition holding acknowledged, undelivered pushes went without a pop of the group);
delivery latency of pushes sent in the 10 s after the return; lost, duplicated, out of order.  Exit status 1 when anything acknowledged is lost, duplicated, out of order or
not delivered, or the drain did not finish.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402

from _harness import (  # noqa: E402
    STORED_IN_SEQ_ORDER,
    Broker,
    Database,
    RawHTTPClient,
    free_port,
    start_brokers,
)
from _loadgen import JSON_HEADERS, PAD, fmt_ms, log, table  # noqa: E402
from _recovery_report import (  # noqa: E402
    ACKED,
    analyse,
    fmt_n,
    fmt_s,
    group_figures,
    print_scenario,
    summarise_log,
)

NB = 3
GROUP = "g"
CLEANUP: list = []  # what to undo, last first, also when a run fails half-way


def run_cleanup() -> None:
    while CLEANUP:
        fn = CLEANUP.pop()
        try:
            fn()
        except BaseException as exc:  # (keep undoing the rest)
            log(f"cleanup: {exc!r}")


def sql(dsn: str, statement: str) -> Any:
    async def one() -> Any:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            return await conn.fetchval(statement)
        finally:
            await conn.close()
    return asyncio.run(one())


# ----------------------------------------------------------------------------------------------
# PostgreSQL and brokers of one scenario
# ----------------------------------------------------------------------------------------------

class Setup:
    """The server(s) and brokers of one scenario; ``outage()`` stops and brings PostgreSQL
    back, ``close()`` undoes everything (and summarises the brokers' logs first)."""

    def __init__(self, kind: str, args: argparse.Namespace) -> None:
        from broker.store.embedded_pg import EmbeddedPostgres
        self.kind, self.args = kind, args
        self.root = Path(tempfile.mkdtemp(prefix="qbench-recovery", dir="/tmp"))
        self.brokers: list[Broker] = []
        self.logs: list[dict] = []
        self.standby = None
        CLEANUP.append(self.close)
        self.primary = EmbeddedPostgres(self.root / "primary", port=free_port())
        self.primary.start()
        env = {"DB_CONNECTION_TIMEOUT": str(args.db_timeout_ms),
               "FILE_BUFFER_SETTLE_MS": str(args.settle_ms), "LOG_LEVEL": args.log_level}
        if kind == "failover":
            # as tests/ha/test_pg_failover.py's pg_pair: a synchronous streaming standby
            self.standby = EmbeddedPostgres(self.root / "standby", port=free_port())
            self.standby.clone_from(self.primary)
            self.standby.start()
            # after the clone, so that the promoted standby does not wait for a standby itself
            sql(self.primary.dsn, "ALTER SYSTEM SET synchronous_standby_names = '*'")
            sql(self.primary.dsn, "SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while sql(self.primary.dsn, "SELECT sync_state FROM pg_stat_replication") != "sync":
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby did not replicate synchronously in 30 s")
                time.sleep(0.2)
            env["PG_HOST"] = (f"127.0.0.1:{self.primary.port},"
                              f"127.0.0.1:{self.standby.port}")
        self.db = Database(self.primary.host, self.primary.port, "postgres", "postgres",
                           "postgres", embedded=self.primary)
        self.brokers = start_brokers(self.db, NB, mesh=False, **env)

    @property
    def final_dsn(self) -> str:
        """Where the messages are after the scenario (the promoted standby after a failover)."""
        return (self.standby or self.primary).dsn

    def describe(self) -> str:
        pg = (f"primary 127.0.0.1:{self.primary.port} + sync standby "
              f"127.0.0.1:{self.standby.port}" if self.standby
              else f"embedded PostgreSQL 127.0.0.1:{self.primary.port}")
        return f"{pg}; brokers {', '.join(b.url for b in self.brokers)}"

    async def outage(self, down_s: float, marks: dict[str, float]) -> None:
        marks["outage"] = time.perf_counter()
        if self.kind == "failover":
            log("killing the primary (pg_ctl stop -m immediate)")
            await asyncio.to_thread(self.primary.stop, "immediate")
            marks["pg_stopped"] = time.perf_counter()
            await asyncio.sleep(self.args.promote_delay_s)
            log("promoting the standby")
            marks["return_call"] = time.perf_counter()
            await asyncio.to_thread(self.standby.promote)
        else:
            log(f"stopping PostgreSQL (pg_ctl stop -m immediate) for {down_s:g} s")
            await self.db.stop_server()
            marks["pg_stopped"] = time.perf_counter()
            await asyncio.sleep(max(0.0, marks["outage"] + down_s - time.perf_counter()))
            log("starting PostgreSQL again")
            marks["return_call"] = time.perf_counter()
            await self.db.start_server()
        marks["return"] = time.perf_counter()
        log(f"PostgreSQL back ({marks['return'] - marks['return_call']:.2f} s for "
            f"{'promote' if self.kind == 'failover' else 'pg_ctl start'})")

    def close(self) -> None:
        if self.close in CLEANUP:
            CLEANUP.remove(self.close)
        for b in self.brokers:
            if b.proc.poll() is None:
                b.proc.terminate()
        for i, b in enumerate(self.brokers):
            try:
                b.proc.wait(10)
            except Exception:
                b.proc.kill()
            try:
                self.logs.append(summarise_log(b.log(), i))
                if self.args.logs_dir:
                    dest = Path(self.args.logs_dir)
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy(b.log_path, dest / f"{self.args.current}-bench-{i}.log")
                    if i == 0:
                        for pg in (self.primary, self.standby):
                            if pg is not None and (pg.data_dir / "postgres.log").exists():
                                shutil.copy(pg.data_dir / "postgres.log", dest /
                                            f"{self.args.current}-{pg.data_dir.name}.log")
            except OSError as exc:
                log(f"broker {i} log: {exc!r}")
            b.stop()
        for pg in (self.standby, self.primary):
            if pg is not None:
                try:
                    pg.stop(mode="immediate")
                except Exception as exc:
                    log(f"stopping PostgreSQL: {exc!r}")
        shutil.rmtree(self.root, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# the load
# ----------------------------------------------------------------------------------------------

async def push_one(client: RawHTTPClient, body: str, timeout: float,
                   first_errors: dict[str, str]) -> str:
    """queued / buffered / duplicate / failed, or http_<code> / conn_error / timeout."""
    try:
        r = await asyncio.wait_for(
            client.post("/api/v1/push", content=body, headers=JSON_HEADERS), timeout)
    except TimeoutError:
        return "timeout"
    except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
        first_errors.setdefault("push conn_error", repr(exc)[:200])
        return "conn_error"
    if r.status_code in (200, 201):
        try:
            status = r.json()[0].get("status")
        except (ValueError, LookupError, AttributeError, TypeError):
            status = None
        if status in ("queued", "buffered", "duplicate", "failed"):
            return status
    first_errors.setdefault(f"push HTTP {r.status_code}", r.text[:200])
    return f"http_{r.status_code}"


def spool_figures(spool: dict | None) -> tuple | None:
    """(pendingCount, stagedEvents, mergeRatePerSecond, mergedEvents, orderExceptions)."""
    if not isinstance(spool, dict):
        return None
    st = spool.get("staging") or {}
    return (spool.get("pendingCount"), st.get("stagedEvents"), st.get("mergeRatePerSecond"),
            st.get("mergedEvents"), spool.get("orderExceptions"))


async def measure(setup: Setup, kind: str, down_s: float, args: argparse.Namespace) -> dict:
    urls = [b.url for b in setup.brokers]
    queue = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    P = args.producers
    interval = P / args.rate
    pushes: list[list[tuple[float, float, str, int]]] = [[] for _ in range(P)]
    # per group: tx -> receive times; partition -> tx in received order; every pop that
    # brought messages: (receive time, partition, messages)
    # (--consumers 0: the extra groups alone; the first of them then stands for "the group"
    # in the figures that speak of one)
    layout = [(GROUP, args.consumers, args.pop_batch)] * bool(args.consumers) + [
        (f"g{i + 1}", c, b) for i, (c, b) in enumerate(args.extra_groups)]
    first_group = layout[0][0]
    recv_by: dict[str, dict[str, list[float]]] = {g: defaultdict(list) for g, _, _ in layout}
    order_by: dict[str, dict[str, list[str]]] = {g: defaultdict(list) for g, _, _ in layout}
    pops_by: dict[str, list[tuple[float, str, int]]] = {g: [] for g, _, _ in layout}
    recv, recv_order = recv_by[first_group], order_by[first_group]
    failed_ack: set[str] = set()
    leases_seen: set[str] = set()                             # leaseIds pops handed out
    cstats: Counter = Counter()
    first_errors: dict[str, str] = {}
    health: list[tuple[float, list[tuple | None]]] = []
    marks: dict[str, float] = {}
    stop_producers, stop_consumers, stop_health = (asyncio.Event(), asyncio.Event(),
                                                   asyncio.Event())

    async def producer(k: int) -> None:
        clients = [RawHTTPClient(u, 1) for u in urls]
        n, nxt = 0, time.perf_counter() + k * interval / P
        try:
            while not stop_producers.is_set():
                wait = nxt - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                    if stop_producers.is_set():
                        break
                b = (k + n) % NB
                body = json.dumps({"items": [{
                    "queue": queue, "partition": f"k{k}", "transactionId": f"k{k}-{n}",
                    "payload": {"k": k, "n": n, "pad": PAD}}]})
                t_send = time.perf_counter()
                status = await push_one(clients[b], body, args.request_timeout, first_errors)
                t_answer = time.perf_counter()
                pushes[k].append((t_send, t_answer, status, b))
                n += 1
                nxt += interval
                if nxt < t_answer - interval:  # behind: go on from now, no burst
                    nxt = t_answer
        finally:
            for c in clients:
                await c.aclose()

    async def ack(client: RawHTTPClient, messages: list[dict], group: str) -> bool:
        body = json.dumps({"acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"} for m in messages],
            "consumerGroup": group})
        # retried until it is taken (a client honouring Retry-After): an ack given up while
        # PostgreSQL is down would leave the partition leased, so blocked for this group,
        # until the lease expires; given up only once the consumers are told to stop
        while True:
            try:
                r = await asyncio.wait_for(
                    client.post("/api/v1/ack/batch", content=body, headers=JSON_HEADERS), 15)
                if r.status_code == 200:
                    return True
                cstats[f"ack HTTP {r.status_code}"] += 1
                first_errors.setdefault(f"ack HTTP {r.status_code}", r.text[:200])
                if r.status_code != 503:
                    return False
            except (TimeoutError, OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
                cstats[f"ack {type(exc).__name__}"] += 1
            if stop_consumers.is_set():
                return False
            await asyncio.sleep(0.2)  # the same ack again: the lease is still ours

    async def consumer(group: str, c: int, batch: int) -> None:
        client = RawHTTPClient(urls[c % NB], 1)
        path = (f"/api/v1/pop/queue/{queue}?consumerGroup={group}&batch={batch}"
                f"&wait=true&timeout=1000")
        recv, recv_order, pops = recv_by[group], order_by[group], pops_by[group]
        try:
            while not stop_consumers.is_set():
                try:
                    r = await asyncio.wait_for(client.get(path), 15)
                except (TimeoutError, OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
                    cstats[f"pop {type(exc).__name__}"] += 1
                    await asyncio.sleep(0.2)
                    continue
                t = time.perf_counter()
                if r.status_code == 204:
                    continue
                if r.status_code != 200:
                    cstats[f"pop HTTP {r.status_code}"] += 1
                    if r.status_code not in (404, 503):
                        first_errors.setdefault(f"pop HTTP {r.status_code}", r.text[:200])
                    await asyncio.sleep(0.2)
                    continue
                messages = r.json().get("messages") or []
                if not messages:
                    continue
                cstats["pops with messages"] += 1
                pops.append((t, messages[0]["partition"], len(messages)))
                for m in messages:
                    leases_seen.add(m.get("leaseId"))
                    recv[m["transactionId"]].append(t)
                    recv_order[m["partition"]].append(m["transactionId"])
                if not await ack(client, messages, group):
                    cstats["acks failed"] += 1
                    failed_ack.update(m["transactionId"] for m in messages)
        finally:
            await client.aclose()

    async def poll_health() -> None:
        clients = [RawHTTPClient(u, 1) for u in urls]

        async def one(c: RawHTTPClient) -> tuple | None:
            try:
                r = await asyncio.wait_for(c.get("/health"), 3)
                return spool_figures(r.json().get("spool"))
            except (TimeoutError, OSError, ValueError, AttributeError, RuntimeError,
                    asyncio.IncompleteReadError):
                return None
        try:
            while not stop_health.is_set():
                t0 = time.perf_counter()
                health.append((t0, list(await asyncio.gather(*(one(c) for c in clients)))))
                await asyncio.sleep(max(0.0, t0 + args.health_interval_s - time.perf_counter()))
        finally:
            for c in clients:
                await c.aclose()

    async def sleep_until(t: float) -> None:
        await asyncio.sleep(max(0.0, t - time.perf_counter()))

    load_start = os.getloadavg()
    consumers = [asyncio.create_task(consumer(g, c + offset, batch))
                 for offset, (g, n, batch) in zip(
                     [sum(n for _, n, _ in layout[:i]) for i in range(len(layout))], layout,
                     strict=True)
                 for c in range(n)]
    poller = asyncio.create_task(poll_health())
    marks["start"] = time.perf_counter()
    producers = [asyncio.create_task(producer(k)) for k in range(P)]
    tasks = [*consumers, poller, *producers]
    try:
        await sleep_until(marks["start"] + args.before_s)
        await setup.outage(down_s, marks)
        after_s = args.failover_after_s if kind == "failover" else max(20.0, 2 * down_s)
        await sleep_until(marks["return"] + after_s)
        stop_producers.set()
        marks["stop"] = time.perf_counter()
        _, pending = await asyncio.wait(producers, timeout=args.request_timeout + 5)
        for x in pending:
            x.cancel()
        marks["producers_stopped"] = time.perf_counter()
        acked = {f"k{k}-{n}" for k in range(P) for n, p in enumerate(pushes[k])
                 if p[2] in ACKED}
        log(f"producers stopped ({sum(map(len, pushes))} pushes, {len(acked)} acknowledged); "
            f"draining (at most {args.drain_max_s:g} s)")
        drained, last_note = False, 0.0
        deadline = time.perf_counter() + args.drain_max_s
        while time.perf_counter() < deadline:
            missing = sum(len(acked - r.keys()) for r in recv_by.values())
            t_h, spools = health[-1] if health else (0.0, [None])
            empty = t_h > marks["producers_stopped"] and all(
                s is not None and s[0] == 0 and s[1] == 0 for s in spools)
            if not missing and empty:
                drained = True
                break
            if time.perf_counter() - last_note > 15:
                last_note = time.perf_counter()
                log(f"  {missing} acknowledged pushes not received yet; spools/staging "
                    f"{[None if s is None else (s[0], s[1]) for s in spools]}")
            await asyncio.sleep(0.2)
        marks["drained"] = time.perf_counter()
        log(f"{'drained' if drained else 'NOT drained'} after "
            f"{marks['drained'] - marks['producers_stopped']:.1f} s")
        await asyncio.sleep(1.0)  # a last poll round: anything delivered twice shows up
    finally:
        stop_producers.set()
        stop_consumers.set()
        await asyncio.wait(consumers, timeout=20)
        stop_health.set()
        await asyncio.wait([poller], timeout=10)
        for x in tasks:
            x.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    final = health[-1][1] if health else [None] * NB

    conn = await asyncpg.connect(setup.final_dsn, timeout=10)
    try:
        rows = await conn.fetch(STORED_IN_SEQ_ORDER, queue)
        # the group's cursor and lease on every partition; a lease no pop handed to a
        # consumer holds its partition back until it expires
        leases = [dict(r) | {"lease_seen_by_a_consumer": str(r["lease_id"]) in leases_seen}
                  for r in await conn.fetch(
            "SELECT p.name AS partition, lc.cursor_seq, lc.lease_id, lc.lease_acquired_at, "
            "lc.lease_expires_at, lc.lease_last_seq, lc.batch_size, now() AS db_now "
            "FROM queen.log_consumers lc JOIN queen.partitions p ON p.id = lc.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 "
            "AND lc.consumer_group = $2 AND lc.lease_id IS NOT NULL ORDER BY p.name",
            queue, first_group)]
        leftovers = {
            "staged": await conn.fetchval("SELECT count(*) FROM queen.staged"),
            "spool_backlog": await conn.fetchval("SELECT count(*) FROM queen.spool_backlog")}
    finally:
        await conn.close()
    res = analyse(kind, down_s, args, queue, pushes, recv, recv_order, failed_ack, cstats,
                  first_errors, health, final, marks, rows, leftovers, drained,
                  load_start, os.getloadavg())
    res["groups"] = group_figures(layout, pushes, recv_by, order_by, pops_by, failed_ack,
                                  rows, marks)
    res["failures"] += [f"group {g['group']}: {f}" for g in res["groups"] for f in g["failures"]]
    wall = time.time() - time.perf_counter()  # perf_counter -> wall clock
    res["marks_wall"] = {k: time.strftime("%H:%M:%S", time.localtime(v + wall))
                         + f".{int((v + wall) % 1 * 1000):03d}" for k, v in marks.items()}
    res["leases_held_at_end"] = [{k: str(v) for k, v in r.items()} for r in leases]
    return res


def parse_scenario(s: str) -> tuple[str, float]:
    s = s.strip()
    if s == "failover":
        return "failover", 0.0
    m = re.fullmatch(r"stop(\d+(\.\d+)?)", s)
    if not m:
        raise argparse.ArgumentTypeError(f"unknown scenario {s!r} (stop<seconds> or failover)")
    return "stop", float(m.group(1))


def parse_groups(s: str) -> list[tuple[int, int]]:
    out = []
    for part in filter(None, (p.strip() for p in s.split(","))):
        m = re.fullmatch(r"(\d+)x(\d+)", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise argparse.ArgumentTypeError(f"a group is CONSUMERSxBATCH, not {part!r}")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="stop10,stop60,failover",
                    help="comma-separated: stop<S> (PostgreSQL down S s) and failover")
    ap.add_argument("--rate", type=float, default=1000, help="target msg/s, all producers")
    # 24: sixteen sequential producers top out near 900 msg/s on a 2-core machine (a push's
    # round trip is ~16 ms under this load), short of the 1,000 msg/s the scenario asks for
    ap.add_argument("--producers", type=int, default=24)
    ap.add_argument("--consumers", type=int, default=6,
                    help="long-polling consumers of the first group, spread over the brokers "
                         "(0: no such group, only --extra-groups)")
    ap.add_argument("--pop-batch", type=int, default=100)
    ap.add_argument("--extra-groups", default="3x10,3x10", type=parse_groups,
                    help="more consumer groups, each CONSUMERSxBATCH (comma-separated; '' none)")
    ap.add_argument("--before-s", type=float, default=10.0, help="normal load before the outage")
    ap.add_argument("--failover-after-s", type=float, default=30.0)
    ap.add_argument("--promote-delay-s", type=float, default=0.3)
    ap.add_argument("--drain-max-s", type=float, default=180.0)
    ap.add_argument("--request-timeout", type=float, default=30.0, help="client timeout of a push")
    ap.add_argument("--health-interval-s", type=float, default=0.2)
    ap.add_argument("--db-timeout-ms", type=int, default=500, help="DB_CONNECTION_TIMEOUT")
    ap.add_argument("--settle-ms", type=int, default=2300, help="FILE_BUFFER_SETTLE_MS")
    ap.add_argument("--log-level", default="WARNING", help="the brokers' LOG_LEVEL")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    ap.add_argument("--logs-dir", help="copy each broker's log here before its temp dir goes")
    args = ap.parse_args(argv)
    try:
        args.plan = [parse_scenario(s) for s in args.scenarios.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    if args.rate <= 0 or args.producers < 1 or args.consumers < 0:
        ap.error("--rate and --producers must be positive, --consumers not negative")
    if not args.consumers and not args.extra_groups:
        ap.error("no consumer group: --consumers 0 needs --extra-groups")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get("PG_HOST"):
        log("this benchmark stops PostgreSQL: it needs the embedded one (unset PG_HOST)")
        return 2
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on SIGTERM too
    load_start = os.getloadavg()
    results: list[dict] = []
    try:
        for kind, down_s in args.plan:
            args.current = kind if kind == "failover" else f"stop{down_s:g}"
            log(f"=== {args.current}: setting up (load average {os.getloadavg()[0]:.2f})")
            t = time.perf_counter()
            setup = Setup(kind, args)
            log(f"{setup.describe()} (started in {time.perf_counter() - t:.1f} s)")
            try:
                res = asyncio.run(measure(setup, kind, down_s, args))
            finally:
                setup.close()
            res["broker_logs"] = setup.logs
            results.append(res)
            print()
            print_scenario(res)
            print()
    finally:
        run_cleanup()
    load_end = os.getloadavg()
    if len(results) > 1:
        rows = [[r["scenario"], fmt_n(r["achieved_rate"]), fmt_s(r["back_to_queued_s"]),
                 fmt_s(r["drain"]["empty_s_after_return"]),
                 fmt_n(r["drain"]["merge_rate_peak_sum_per_s"]),
                 fmt_ms(r["delivery_latency"]["during the outage"]["p99_ms"]),
                 fmt_ms(r["delivery_latency"]["first 10 s after the return"]["p99_ms"]),
                 f"{r['lost']}/{r['duplicated_stored'] + r['duplicated_received']}/"
                 f"{r['order_violations_stored'] + r['order_violations_received']}",
                 "n/a" if r["order_exceptions"] is None else r["order_exceptions"]]
                for r in results]
        print(table(["scenario", "msg/s", "back to queued s", "empty s", "peak merge/s",
                     "outage p99 ms", "after p99 ms", "lost/dup/order", "orderExc"], rows))
    print(f"load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load_start)}, "
          f"at end {'/'.join(f'{x:.2f}' for x in load_end)}; {os.cpu_count()} CPUs")
    doc = {"benchmark": "outage_recovery", "argv": sys.argv[1:],
           "args": {k: v for k, v in vars(args).items() if k not in ("plan", "current")},
           "load_avg_start": load_start, "load_avg_end": load_end, "cpus": os.cpu_count(),
           "results": results}
    if args.json == "-":
        print(json.dumps(doc, indent=1, default=str))
    elif args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        print(f"results: {args.json}")
    failed = [f"{r['scenario']}: {f}" for r in results for f in r["failures"]]
    for f in failed:
        print(f"FAILED {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
