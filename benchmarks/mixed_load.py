#!/usr/bin/env python3
"""The highest push rate two consumer groups keep pace with, on three meshed brokers, and what
it costs in CPU (brokers, PostgreSQL, load generator); optionally for two revisions in one run.

    .venv/bin/python benchmarks/mixed_load.py                          # this checkout, search
    .venv/bin/python benchmarks/mixed_load.py --rev main               # main's brokers beside
    .venv/bin/python benchmarks/mixed_load.py --rev main --rates 300,300 --window-s 30
    .venv/bin/python benchmarks/mixed_load.py --rates 300 --profile-dir /tmp/prof   # py-spy
    .venv/bin/python benchmarks/mixed_load.py --rates 300 --pg-statements           # SQL

The load: ``--producers`` (32) sequential producers push one message per request (waiting for
the answer), producer *i* to partition ``k<i % --partitions>``, its *n*-th request to broker
*(i+n) % 3* (round-robin), paced together to the offered rate (a producer that falls behind
sends at once, without bursting to catch up). Two consumer groups (``--groups``, default
``3x10,3x10``: three consumers at batch 10 each) long-poll the queue
(``GET /api/v1/pop/queue/{q}?consumerGroup=g&batch=10&wait=true&timeout=1000``), consumer *c*
on broker *c % 3*, and ack each batch (``POST /api/v1/ack/batch``) on the broker that popped it.
The brokers are ``_harness.start_brokers(db, 3, mesh=True)`` (QUEEN_SERVER_ID bench-0..2, each
the others' mesh peer), ``LOG_LEVEL=WARNING``, defaults otherwise.

A probe is one offered rate on a fresh queue: consumers start, producers start, ``--warmup-s``
unmeasured, then the measured ``--window-s`` (60), then producers stop and the consumers get at
most ``--drain-s`` to receive the window's pushes. A probe **keeps pace** when, for both groups,
the delivery latency (push answered -> the pop carrying it received) of the window's pushes has
p99 < ``--p99-ms`` (1,000; a push not delivered by the end of the drain counts as late), the
backlog (answered pushes not yet delivered to the group) grew by at most max(50, 0.5 s of the
offered rate) over the window, and the producers achieved at least ``--min-achieved`` (0.95) of
the offered rate with every push ``queued``.

Search (without ``--rates``): from ``--start-rate``, up by ``--step`` (x1.3) while probes keep
pace, down while they do not, then bisection (geometric mean) between the highest passing and
the lowest failing rate until they are within ``--precision`` (8 %) or ``--budget-s`` (600) of
one revision's probing is spent (a probe that would end after it is not started). With
``--rates`` each listed rate is probed once, no search.

``--rev REV`` (repeatable): the brokers of REV (run from a temporary ``git worktree``) are
measured in the same run as this checkout's (the working tree, uncommitted changes included).
Every revision gets its own fresh PostgreSQL and three brokers, all up at once (the idle ones
cost each other little); the probes take turns, one per revision at a time, the order
alternating, so a change in the machine's load (other people's processes) hits the
revisions alike. The search runs per revision, each from its own last probe; ``--budget-s``
is per revision. ``--rounds N`` repeats the whole measurement with fresh clusters.

Reported per probe and for the found rate: achieved push msg/s; per group deliveries/s, p50 /
p99 delivery latency, backlog growth, messages per pop (mean over pops that brought messages,
and the empty long polls); CPU seconds over the window of the three brokers (from /proc), of
PostgreSQL (the postmaster, its live children and its reaped children, from /proc) and of this
load generator (getrusage), their share of the machine's busy CPU (the rest is other
processes), broker CPU per pushed message (a push, its two deliveries and their acks) and per
HTTP request (pushes, pops, acks: it moves less with messages per pop, so it is the figure to
compare at a fixed rate), mesh frames sent, claim queries and pops woken per second (the
brokers' ``/health``). ``--profile-dir`` records the brokers with py-spy during each probe and
prints the top frames; ``--pg-statements`` prints pg_stat_statements over each window.
``--json PATH`` writes everything. Exit status 1 when a probe saw HTTP or connection errors
other than at start-up, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _mixed_parts import (  # noqa: E402
    CpuMeter,
    pg_statements,
    postmaster_pid,
    start_py_spy,
    stop_py_spy,
)
from profile_broker import print_summary  # noqa: E402

from _harness import (  # noqa: E402
    ROOT,
    Broker,
    Database,
    RawHTTPClient,
    drop_worktree,
    enable_pg_statements,
    start_brokers,
    start_database,
    worktree,
)
from _loadgen import JSON_HEADERS, PAD, log, percentile, table  # noqa: E402
from bench_wake_ha import wait_mesh_up  # noqa: E402

NB = 3
TREE = "tree"  # the label of this checkout's brokers


# ----------------------------------------------------------------------------------------------
# one probe
# ----------------------------------------------------------------------------------------------

@dataclass
class Group:
    name: str
    consumers: int
    batch: int
    recv: dict[str, float] = field(default_factory=dict)   # tx -> first receive time
    duplicates: int = 0
    pops: list[tuple[float, int]] = field(default_factory=list)  # (time, messages)
    empty: list[float] = field(default_factory=list)            # times of empty long polls


async def push_one(client: RawHTTPClient, body: str, errors: Counter,
                   first: dict[str, str]) -> str:
    try:
        r = await asyncio.wait_for(
            client.post("/api/v1/push", content=body, headers=JSON_HEADERS), 30)
    except TimeoutError:
        errors["push timeout"] += 1
        return "timeout"
    except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
        errors["push connection"] += 1
        first.setdefault("push connection", repr(exc)[:200])
        return "error"
    if r.status_code in (200, 201):
        try:
            return str(r.json()[0].get("status"))
        except (ValueError, LookupError, AttributeError, TypeError):
            pass
    errors[f"push HTTP {r.status_code}"] += 1
    first.setdefault(f"push HTTP {r.status_code}", r.text[:200])
    return f"http_{r.status_code}"


async def health_counters(urls: list[str]) -> Counter | None:
    """Summed over the brokers, from ``GET /health``: mesh frames written to peers
    (heartbeats excluded), claim queries, pops woken by commits, timer re-checks."""
    total: Counter = Counter()
    for url in urls:
        client = RawHTTPClient(url, 1)
        try:
            shared = (await asyncio.wait_for(client.get("/health"), 10)).json()["shared_state"]
            t, lp = shared["transport"] or {}, shared.get("longPolls") or {}
        except (TimeoutError, OSError, ValueError, KeyError, TypeError, RuntimeError,
                asyncio.IncompleteReadError):
            return None
        finally:
            await client.aclose()
        total["frames"] += int(t.get("messages_sent", 0))
        for k in ("claimQueries", "woken", "timerRechecks"):
            total[k] += int(lp.get(k, 0))
    return total


async def probe(brokers: list[Broker], postmaster: int | None, rate: float,
                args: argparse.Namespace, profile_tag: str | None = None,
                pgss: Database | None = None) -> dict[str, Any]:
    urls = [b.url for b in brokers]
    queue = f"mixed-{uuid.uuid4().hex[:8]}"
    P = args.producers
    interval = P / rate
    answered: dict[str, float] = {}          # tx -> answer time (queued ones)
    sent: list[tuple[float, str]] = []       # (send time, status) of every push
    groups = [Group(f"g{i + 1}", c, b) for i, (c, b) in enumerate(args.groups)]
    errors: Counter = Counter()
    first: dict[str, str] = {}
    stop_producers, stop_consumers = asyncio.Event(), asyncio.Event()

    async def producer(k: int) -> None:
        clients = [RawHTTPClient(u, 1) for u in urls]
        n, nxt = 0, time.perf_counter() + k * interval / P
        partition = f"k{k % args.partitions}"
        try:
            while not stop_producers.is_set():
                wait = nxt - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                    if stop_producers.is_set():
                        break
                tx = f"{k}-{n}"
                body = json.dumps({"items": [{"queue": queue, "partition": partition,
                                              "transactionId": tx,
                                              "payload": {"k": k, "n": n, "pad": PAD}}]})
                t_send = time.perf_counter()
                status = await push_one(clients[(k + n) % NB], body, errors, first)
                t_answer = time.perf_counter()
                sent.append((t_send, status))
                if status == "queued":
                    answered[tx] = t_answer
                elif not status.startswith(("http_", "timeout", "error")):
                    errors[f"push {status}"] += 1
                n += 1
                nxt += interval
                if nxt < t_answer - interval:  # behind: go on from now, no burst
                    nxt = t_answer
        finally:
            for c in clients:
                await c.aclose()

    async def consumer(g: Group, c: int) -> None:
        client = RawHTTPClient(urls[c % NB], 1)
        path = (f"/api/v1/pop/queue/{queue}?consumerGroup={g.name}&batch={g.batch}"
                f"&wait=true&timeout={args.poll_timeout_ms}")
        try:
            while not stop_consumers.is_set():
                try:
                    r = await asyncio.wait_for(client.get(path), 15)
                except (TimeoutError, OSError, asyncio.IncompleteReadError,
                        RuntimeError) as exc:
                    errors[f"pop {type(exc).__name__}"] += 1
                    first.setdefault("pop", repr(exc)[:200])
                    await asyncio.sleep(0.2)
                    continue
                t = time.perf_counter()
                if r.status_code == 204:
                    g.empty.append(t)
                    continue
                if r.status_code == 404 and not answered:
                    await asyncio.sleep(0.05)  # the queue exists once the first push is in
                    continue
                if r.status_code != 200:
                    errors[f"pop HTTP {r.status_code}"] += 1
                    first.setdefault(f"pop HTTP {r.status_code}", r.text[:200])
                    await asyncio.sleep(0.2)
                    continue
                messages = r.json().get("messages") or []
                if not messages:
                    g.empty.append(t)
                    continue
                g.pops.append((t, len(messages)))
                for m in messages:
                    if m["transactionId"] in g.recv:
                        g.duplicates += 1
                    else:
                        g.recv[m["transactionId"]] = t
                body = json.dumps({"acknowledgments": [
                    {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"} for m in messages],
                    "consumerGroup": g.name})
                try:
                    a = await asyncio.wait_for(
                        client.post("/api/v1/ack/batch", content=body, headers=JSON_HEADERS),
                        15)
                    if a.status_code != 200:
                        errors[f"ack HTTP {a.status_code}"] += 1
                        first.setdefault(f"ack HTTP {a.status_code}", a.text[:200])
                except (TimeoutError, OSError, asyncio.IncompleteReadError,
                        RuntimeError) as exc:
                    errors[f"ack {type(exc).__name__}"] += 1
        finally:
            await client.aclose()

    consumers = [asyncio.create_task(consumer(g, c)) for g in groups for c in range(g.consumers)]
    await asyncio.sleep(0.2)
    producers = [asyncio.create_task(producer(k)) for k in range(P)]
    spies = start_py_spy(brokers, args, profile_tag) if profile_tag else []
    meter = CpuMeter(brokers, postmaster)
    try:
        await asyncio.sleep(args.warmup_s)
        health0 = await health_counters(urls)
        w0 = time.perf_counter()
        await pg_statements(pgss, args.top, reset=True)
        meter.start()
        load0 = os.getloadavg()[0]
        await asyncio.sleep(args.window_s)
        w1 = time.perf_counter()
        cpu = meter.stop()
        statements = await pg_statements(pgss, args.top)
        load1 = os.getloadavg()[0]
        health1 = await health_counters(urls)
        stop_producers.set()
        await asyncio.wait(producers, timeout=35)
        window_tx = {tx for tx, t in answered.items() if w0 <= t < w1}
        deadline = time.perf_counter() + args.drain_s
        for _ in range(int(args.drain_s / 0.05) + 1):  # polls, bounded by the deadline
            if time.perf_counter() >= deadline or not any(window_tx - g.recv.keys()
                                                          for g in groups):
                break
            await asyncio.sleep(0.05)
        drain_end = time.perf_counter()
    finally:
        stop_producers.set()
        stop_consumers.set()
        await asyncio.wait(consumers, timeout=args.poll_timeout_ms / 1000 + 16)
        for x in [*producers, *consumers]:
            x.cancel()
        await asyncio.gather(*producers, *consumers, return_exceptions=True)
        profile = stop_py_spy(spies, args, profile_tag) if spies else None

    window = w1 - w0
    pushed = len(window_tx)
    sent_window = [s for t, s in sent if w0 <= t < w1]
    achieved = pushed / window
    answers_before = sorted(answered.values())
    res_groups = []
    for g in groups:
        lat = [((g.recv.get(tx, math.inf)) - answered[tx]) * 1000 for tx in window_tx]
        late = sum(1 for x in lat if x == math.inf)
        lat = [x if x != math.inf else (drain_end - answered[tx]) * 1000
               for x, tx in zip(lat, window_tx)]
        recv_times = sorted(g.recv.values())

        def backlog(t: float, recv_times: list[float] = recv_times) -> int:
            import bisect
            return bisect.bisect_right(answers_before, t) - bisect.bisect_right(recv_times, t)
        pops = [n for t, n in g.pops if w0 <= t < w1]
        # when the slow deliveries were pushed: per second of the window, how many of the
        # group's deliveries took over --p99-ms (a stall shows as a cluster)
        slow_by_s = Counter(int(answered[tx] - w0) for x, tx in zip(lat, window_tx)
                            if x >= args.p99_ms)
        res_groups.append({
            "group": g.name, "consumers": g.consumers, "batch": g.batch,
            "deliveries_per_s": round(sum(1 for t in recv_times if w0 <= t < w1) / window, 1),
            "p50_ms": round(percentile(lat, 50) or 0, 1) if lat else None,
            "p99_ms": round(percentile(lat, 99) or 0, 1) if lat else None,
            "undelivered_after_drain": late,
            "backlog_start": backlog(w0), "backlog_end": backlog(w1),
            "backlog_growth": backlog(w1) - backlog(w0),
            "pops_with_messages": len(pops),
            "messages_per_pop": round(sum(pops) / len(pops), 2) if pops else None,
            "pops_per_s": round(len(pops) / window, 1),
            "empty_polls_per_s": round(sum(1 for t in g.empty if w0 <= t < w1) / window, 1),
            "duplicates": g.duplicates,
            "slow_by_second": [slow_by_s.get(i, 0) for i in range(int(window) + 1)]})
    growth_cap = max(50.0, rate * 0.5)
    reasons = []
    if achieved < args.min_achieved * rate:
        reasons.append(f"pushes {achieved:,.0f}/s < {args.min_achieved:g} x offered")
    not_queued = sum(1 for s in sent_window if s != "queued")
    if not_queued:
        reasons.append(f"{not_queued} pushes not queued")
    for g in res_groups:
        if g["p99_ms"] is None or g["p99_ms"] >= args.p99_ms:
            reasons.append(f"{g['group']} p99 {g['p99_ms']} ms")
        if g["backlog_growth"] > growth_cap:
            reasons.append(f"{g['group']} backlog +{g['backlog_growth']}")
    brokers_s = cpu["brokers_s"] or 0.0
    # HTTP requests the window took: pushes, pops (with messages or empty) and their acks
    requests = pushed + sum(2 * g["pops_with_messages"] + g["empty_polls_per_s"] * window
                            for g in res_groups)
    return {
        "requests": round(requests),
        "broker_cpu_ms_per_request": round(brokers_s * 1000 / requests, 3) if requests else None,
        "offered": round(rate, 1), "achieved": round(achieved, 1), "window_s": round(window, 2),
        "pushed": pushed, "pushes_not_queued": not_queued, "groups": res_groups,
        "keeps_pace": not reasons, "why_not": reasons, "cpu": cpu,
        "broker_cpu_ms_per_push": round(brokers_s * 1000 / pushed, 3) if pushed else None,
        **{f"{k}_per_s": (round((health1[c] - health0[c]) / window, 1)
                          if health0 is not None and health1 is not None else None)
           for k, c in (("mesh_frames", "frames"), ("claim_queries", "claimQueries"),
                        ("woken", "woken"), ("timer_rechecks", "timerRechecks"))},
        "errors": dict(errors), "first_errors": first, "load": [load0, load1],
        "queue": queue, "profile": profile, "pg_statements": statements}


# ----------------------------------------------------------------------------------------------
# a revision's search
# ----------------------------------------------------------------------------------------------

def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def probe_row(label: str, p: dict) -> list[str]:
    g = p["groups"]
    cpu = p["cpu"]
    return [label, fmt(p["offered"]), fmt(p["achieved"]),
            " / ".join(fmt(x["deliveries_per_s"]) for x in g),
            " / ".join(f"{fmt(x['p50_ms'])}/{fmt(x['p99_ms'])}" for x in g),
            " / ".join(f"{x['backlog_growth']:+d}" for x in g),
            " / ".join(fmt(x["messages_per_pop"], ".1f") for x in g),
            " / ".join(fmt(x["empty_polls_per_s"], ".0f") for x in g),
            f"{fmt(cpu['brokers_s'], '.1f')} / {fmt(cpu['postgres_s'], '.1f')} / "
            f"{fmt(cpu['loadgen_s'], '.1f')} / {fmt(cpu['others_s'], '.1f')}",
            fmt(p["broker_cpu_ms_per_push"], ".2f"), fmt(p["broker_cpu_ms_per_request"], ".3f"),
            fmt(p["mesh_frames_per_s"]),
            f"{fmt(p['claim_queries_per_s'])} / {fmt(p['woken_per_s'])}",
            "yes" if p["keeps_pace"] else "no: " + "; ".join(p["why_not"])[:60]]


PROBE_HEADERS = ["who", "offered", "pushed/s", "deliv/s g1 / g2", "p50/p99 ms g1 / g2",
                 "backlog +", "msgs/pop", "empty/s", "CPU s brk/pg/lg/other",
                 "brk ms/push", "brk ms/req", "mesh frames/s", "claims/s / woken/s", "keeps pace"]


class Cluster:
    """One revision's PostgreSQL and three meshed brokers, and its search state."""

    def __init__(self, label: str, root: Path, args: argparse.Namespace) -> None:
        self.label, self.root = label, root
        self.probes: list[dict] = []
        self.lo: float | None = None   # highest rate that kept pace
        self.hi: float | None = None   # lowest rate that did not
        self.next_rate: float | None = args.start_rate
        self.db = start_database()
        self.brokers: list[Broker] = []
        try:
            if args.pg_statements:
                if self.db.embedded is None:
                    raise SystemExit("--pg-statements needs the embedded PostgreSQL")
                asyncio.run(enable_pg_statements(self.db))
            self.brokers = start_brokers(self.db, NB, mesh=True, root=root,
                                         LOG_LEVEL=args.log_level, **dict(args.env))
            if not asyncio.run(wait_mesh_up([b.url for b in self.brokers])):
                raise RuntimeError("the mesh did not come up within 20 s")
        except BaseException:
            self.close()
            raise
        self.postmaster = postmaster_pid(self.db)

    def run(self, rate: float, args: argparse.Namespace, n: int) -> dict:
        tag = f"{self.label}-{n}-{rate:.0f}" if args.profile_dir else None
        p = asyncio.run(probe(self.brokers, self.postmaster, rate, args, tag,
                              self.db if args.pg_statements else None))
        self.probes.append(p)
        print(table(PROBE_HEADERS, [probe_row(self.label, p)]), flush=True)
        if p["errors"]:
            log(f"errors: {p['errors']} {p['first_errors']}")
        if p["profile"]:
            print_summary(p["profile"], "py-spy over the three brokers")
        if p["pg_statements"]:
            print_statements(p["pg_statements"], p["window_s"], p["pushed"])
        return p

    def step(self, p: dict, args: argparse.Namespace) -> None:
        """The search: up by --step while probes keep pace, down while they do not, then
        bisection until the bracket is within --precision."""
        rate = p["offered"]
        if p["keeps_pace"]:
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)
        if self.hi is None:
            self.next_rate = rate * args.step
        elif self.lo is None:
            self.next_rate = rate / args.step if rate / args.step >= args.min_rate else None
        elif self.hi / self.lo <= 1 + args.precision:
            self.next_rate = None
        else:
            self.next_rate = math.sqrt(self.lo * self.hi)

    def result(self) -> dict:
        passing = [p for p in self.probes if p["keeps_pace"]]
        found = max(passing, key=lambda p: p["offered"]) if passing else None
        return {"label": self.label, "root": str(self.root), "probes": self.probes,
                "found": found,
                "lowest_failing": min((p["offered"] for p in self.probes
                                       if not p["keeps_pace"]), default=None)}

    def close(self) -> None:
        for b in self.brokers:
            b.stop()
        self.db.stop()


def measure(trees: list[tuple[str, Path]], args: argparse.Namespace) -> list[dict]:
    """Every revision's cluster up at once; each round probes them one after another (the
    order alternating), so the revisions share the machine's moods; with --rates each rate
    once per revision, else each revision's search moves on from its own last probe."""
    clusters: list[Cluster] = []
    try:
        for label, root in trees:
            log(f"=== {label}: PostgreSQL and three brokers from {root} "
                f"(load {os.getloadavg()[0]:.2f})")
            clusters.append(Cluster(label, root, args))
        per_probe = args.warmup_s + args.window_s + args.drain_s / 2 + 3
        budget_end = time.monotonic() + args.budget_s * len(clusters)
        plan = list(args.rates) if args.rates else None
        n = 0
        while True:
            if plan is not None:
                if not plan:
                    break
                rate = plan.pop(0)
                todo = [(c, rate) for c in clusters]
            else:
                todo = [(c, c.next_rate) for c in clusters if c.next_rate is not None]
                if not todo:
                    break
                if time.monotonic() + per_probe * len(todo) > budget_end:
                    log("budget spent")
                    break
            if n % 2:
                todo.reverse()
            n += 1
            for c, r in todo:
                assert r is not None
                p = c.run(r, args, n)
                if plan is None:
                    c.step(p, args)
        return [c.result() for c in clusters]
    finally:
        for c in clusters:
            c.close()


def print_statements(rows: list[dict], window: float, pushed: int) -> None:
    print(f"  PostgreSQL over the window (pg_stat_statements, track=all; ms of execution per "
          f"pushed message = total / {pushed:,} pushes):")
    for r in rows:
        per = float(r["total_ms"]) / pushed if pushed else 0.0
        print(f"    {float(r['total_ms']):>9,.1f} ms {r['calls'] / window:>7,.1f}/s "
              f"{float(r['mean_ms']):>7.3f} ms/call {per:6.3f} ms/push "
              f"{'' if r['toplevel'] else '(nested) '}{r['query']}")


def summary_rows(segments: list[dict]) -> list[list[str]]:
    rows = []
    for s in segments:
        f = s["found"]
        if f is None:
            rows.append([s["label"], "none kept pace", "-", "-", "-", "-", "-", "-", "-",
                         fmt(s["lowest_failing"])])
            continue
        cpu = f["cpu"]
        w = f["window_s"]
        rows.append([
            s["label"], fmt(f["offered"]), fmt(f["achieved"]),
            " / ".join(fmt(g["deliveries_per_s"]) for g in f["groups"]),
            " / ".join(f"{fmt(g['p50_ms'])}/{fmt(g['p99_ms'])}" for g in f["groups"]),
            " / ".join(fmt(g["messages_per_pop"], ".1f") for g in f["groups"]),
            f"{cpu['brokers_s'] / w:.2f} / {fmt((cpu['postgres_s'] or 0) / w, '.2f')} / "
            f"{cpu['loadgen_s'] / w:.2f} / {cpu['others_s'] / w:.2f}",
            fmt(f["broker_cpu_ms_per_push"], ".2f"),
            fmt((cpu["postgres_s"] or 0) * 1000 / f["pushed"], ".2f") if f["pushed"] else "-",
            fmt(s["lowest_failing"])])
    return rows


SUMMARY_HEADERS = ["who", "found rate", "pushed/s", "deliv/s g1 / g2", "p50/p99 ms g1 / g2",
                   "msgs/pop", "cores brk/pg/lg/other", "brk ms/push", "pg ms/push",
                   "lowest failing"]


# ----------------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------------

def parse_groups(s: str) -> list[tuple[int, int]]:
    out = []
    for part in filter(None, (p.strip() for p in s.split(","))):
        c, _, b = part.partition("x")
        if not (c.isdigit() and b.isdigit() and int(c) > 0 and int(b) > 0):
            raise argparse.ArgumentTypeError(f"a group is CONSUMERSxBATCH, not {part!r}")
        out.append((int(c), int(b)))
    return out


def parse_rates(s: str) -> list[float]:
    try:
        rates = [float(x) for x in s.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError("rates are positive numbers, comma-separated")
    return rates


def parse_env(s: str) -> tuple[str, str]:
    k, eq, v = s.partition("=")
    if not eq or not k:
        raise argparse.ArgumentTypeError(f"KEY=VALUE, not {s!r}")
    return k, v


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", action="append", default=[],
                    help="also measure this git revision's brokers (repeatable)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the measurement (fresh clusters) this many times")
    ap.add_argument("--rates", type=parse_rates,
                    help="probe these offered msg/s (comma-separated) instead of searching")
    ap.add_argument("--start-rate", type=float, default=450.0)
    ap.add_argument("--step", type=float, default=1.3, help="search factor up / down")
    ap.add_argument("--precision", type=float, default=0.08,
                    help="stop when lowest failing / highest passing <= 1 + this")
    ap.add_argument("--min-rate", type=float, default=50.0)
    ap.add_argument("--budget-s", type=float, default=600.0,
                    help="probing time per revision and round (no probe starts past it)")
    ap.add_argument("--window-s", type=float, default=60.0, help="measured window of a probe")
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--drain-s", type=float, default=5.0,
                    help="after the window: how long the groups may take to receive it")
    ap.add_argument("--p99-ms", type=float, default=1000.0, help="delivery latency p99 bound")
    ap.add_argument("--min-achieved", type=float, default=0.95,
                    help="pushes achieved / offered a probe needs to keep pace")
    ap.add_argument("--producers", type=int, default=32)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--groups", type=parse_groups, default=parse_groups("3x10,3x10"),
                    help="consumer groups, each CONSUMERSxBATCH (comma-separated)")
    ap.add_argument("--poll-timeout-ms", type=int, default=1000)
    ap.add_argument("--log-level", default="WARNING", help="the brokers' LOG_LEVEL")
    ap.add_argument("--env", type=parse_env, action="append", default=[],
                    help="KEY=VALUE for every broker (repeatable)")
    ap.add_argument("--profile-dir", help="py-spy record the brokers in every probe's run; "
                                          "raw stacks here, the top frames printed")
    ap.add_argument("--spy-rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--spy-arg", dest="spy_args", action="append", default=[],
                    help="more py-spy record arguments, e.g. --spy-arg=--nonblocking "
                         "(repeatable)")
    ap.add_argument("--top", type=int, default=25, help="frames listed from a profile")
    ap.add_argument("--pg-statements", action="store_true",
                    help="pg_stat_statements over every probe's window (embedded PostgreSQL)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = ap.parse_args(argv)
    if args.producers < 1 or args.partitions < 1 or args.rounds < 1 or args.window_s <= 0:
        ap.error("--producers, --partitions, --rounds and --window-s must be positive")
    if args.step <= 1 or args.precision <= 0:
        ap.error("--step must be above 1 and --precision above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on SIGTERM too
    load_start = os.getloadavg()
    trees: list[tuple[str, Path]] = []
    made: list[Path] = []
    segments: list[dict] = []
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, text=True, capture_output=True).stdout.strip())
    try:
        for rev in args.rev:
            path = worktree(rev)
            made.append(path)
            short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, text=True,
                                   capture_output=True).stdout.strip()
            trees.append((f"{rev}@{short}" if short != rev else rev, path))
        trees.append((f"{TREE}@{head}{'+' if dirty else ''}", ROOT))
        for _ in range(args.rounds):
            segments += measure(trees, args)
    finally:
        for path in made:
            drop_worktree(path)
    load_end = os.getloadavg()
    print("\nevery probe")
    print(table(PROBE_HEADERS, [probe_row(s["label"], p) for s in segments
                                for p in s["probes"]]))
    print("\nthe highest rate both groups kept pace with (cores: CPU seconds per second of "
          "the window)")
    print(table(SUMMARY_HEADERS, summary_rows(segments)))
    if len(trees) > 1:
        by: dict[str, list[dict]] = {}
        for s in segments:
            by.setdefault(s["label"], []).append(s)
        base = trees[-1][0]
        for label, segs in by.items():
            if label == base:
                continue
            for a, b in zip(segs, by[base]):
                fa, fb = a["found"], b["found"]
                if fa and fb:
                    print(f"{base} / {label}: found rate x{fb['offered'] / fa['offered']:.2f}, "
                          f"broker CPU per push x"
                          f"{fb['broker_cpu_ms_per_push'] / fa['broker_cpu_ms_per_push']:.2f}")
    print(f"load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load_start)}, "
          f"at end {'/'.join(f'{x:.2f}' for x in load_end)}; {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"benchmark": "mixed_load", "argv": sys.argv[1:],
             "args": {k: v for k, v in vars(args).items()}, "load_start": load_start,
             "load_end": load_end, "segments": segments}, indent=1, default=str))
        print(f"results: {args.json}")
    bad = [(s["label"], p["offered"], p["errors"]) for s in segments for p in s["probes"]
           if p["errors"]]
    for label, rate, errs in bad:
        print(f"ERRORS {label} at {rate:,.0f}/s: {errs}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
