#!/usr/bin/env python3
"""Where a push, a pop and an ack spend their time: py-spy on the broker, pg_stat_statements
on PostgreSQL, one workload at a time.

    .venv/bin/python benchmarks/profile_broker.py                 # push1 push100 popack herd
    .venv/bin/python benchmarks/profile_broker.py push100 --out /tmp/prof

Starts an embedded PostgreSQL with ``shared_preload_libraries=pg_stat_statements``
(``pg_stat_statements.track=all``, so statements inside ``queen.push_ordered`` and friends are
listed too) and one broker, runs each workload with the load generators of ``_loadgen.py`` while
``py-spy record --nonblocking --format raw`` samples the broker, and prints per workload: the
broker's CPU per 1,000 messages (from /proc), the hottest functions by own time and by time
including callees, and the statements PostgreSQL spent the most time in. Raw stacks (collapsed,
for flamegraph tools) and a JSON summary go to ``--out``. Needs ``py-spy`` (PyPI) on PATH or in
the venv, and permission to ptrace the broker (root, or ptrace_scope 0).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import asyncpg  # noqa: E402

import _loadgen as loadgen  # noqa: E402
import bench_herd  # noqa: E402
from _harness import Broker, proc_figures, start_database  # noqa: E402
from _loadgen import Rows, http_pop_ack, http_push  # noqa: E402

WORKLOADS = ("push1", "push100", "popack", "herd")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


def frame_name(frame: str) -> str:
    """'handler (broker/http/routes/push.py:12)' -> 'broker/http/routes/push.py:handler'."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0].rstrip(")")
    for marker in ("site-packages/", "/wt-", "/work/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    if path.startswith("perf/") or path.startswith("main/"):
        path = path.split("/", 1)[1]
    return f"{path}:{name}"


def summarize(raw: Path, top: int) -> dict:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    pct = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0.0)
    return {"samples": total,
            "own": [(f, pct(c)) for f, c in own.most_common(top)],
            "inclusive": [(f, pct(c)) for f, c in incl.most_common(top * 2)]}


def print_summary(summary: dict, label: str) -> None:
    """``summarize``'s figures as the profiles print them: own time, then with callees."""
    print(f"  {label}: {summary['samples']} samples; own time:")
    for f, p in summary["own"]:
        print(f"    {p:5.1f}%  {f}")
    print("  including callees:")
    for f, p in summary["inclusive"]:
        print(f"    {p:5.1f}%  {f}")


PGSS = """SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
                 round(mean_exec_time::numeric, 3) AS mean_ms, rows, toplevel,
                 left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS query
          FROM pg_stat_statements
          WHERE query NOT ILIKE '%pg_stat_statements%'
          ORDER BY total_exec_time DESC LIMIT $1"""


async def workload(name: str, url: str, args: argparse.Namespace) -> int:
    """Run one workload against the broker; returns the messages it moved."""
    rows = Rows
    if name == "push1":
        p = await http_push(url, f"prof-{uuid.uuid4().hex[:6]}", rows(args.n1, 16), 1, 16,
                                60, name)
        return p.done
    if name == "push100":
        p = await http_push(url, f"prof-{uuid.uuid4().hex[:6]}", rows(args.n100, 16), 100,
                                16, 60, name)
        return p.done
    if name == "popack":
        return -1  # handled by the caller: the pre-fill must not be profiled
    raise ValueError(name)


async def profile(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = start_database()
    if db.embedded is None:
        raise SystemExit("needs the embedded PostgreSQL (unset PG_HOST)")
    try:
        conn = await asyncpg.connect(db.dsn)
        await conn.execute("ALTER SYSTEM SET shared_preload_libraries = "
                           "pg_stat_statements, auto_explain")
        await conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        # Plans of statements slower than --explain-ms (nested ones too) go to the server
        # log: a cached plan that stopped fitting the data shows up there.
        await conn.execute(f"ALTER SYSTEM SET auto_explain.log_min_duration = '{args.explain_ms}'")
        await conn.execute("ALTER SYSTEM SET auto_explain.log_nested_statements = on")
        await conn.close()
        db.embedded.stop(mode="fast")
        db.embedded.start()
        conn = await asyncpg.connect(db.dsn)
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        broker = Broker(db)
        summary: dict = {}
        try:
            loadgen.set_client("raw")
            await http_push(broker.url, "prof-warmup", Rows(500, 16), 1, 16, 30, "warm")
            for name in args.names:
                queue = f"prof-pop-{uuid.uuid4().hex[:6]}"
                if name == "popack":  # pre-filled off the profile
                    await http_push(broker.url, queue, Rows(args.npop, 16), 100, 16,
                                        120, "prefill")
                await conn.execute("SELECT pg_stat_statements_reset()")
                raw = out / f"{name}.txt"
                spy = await asyncio.create_subprocess_exec(
                    py_spy(), "record", "--nonblocking", "--format", "raw", "--rate",
                    str(args.rate), "-o", str(raw), "--pid", str(broker.proc.pid),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                await asyncio.sleep(1.0)  # py-spy attaches
                before = proc_figures(broker.proc.pid)
                t = time.perf_counter()
                load = os.getloadavg()
                if name == "popack":
                    p = await http_pop_ack(broker.url, queue, args.npop, 100, 16, 60, name)
                    moved = p.done
                elif name == "herd":
                    hargs = argparse.Namespace(herd_parked=args.herd_parked, herd_pushes=100,
                                               herd_poll_timeout_ms=300_000,
                                               herd_gap_ms=20, herd_idle_s=2.0,
                                               herd_park_max_s=120.0, max_seconds=60.0)
                    moved = await herd_on(broker, hargs)
                else:
                    moved = await workload(name, broker.url, args)
                elapsed = time.perf_counter() - t
                after = proc_figures(broker.proc.pid)
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                try:
                    await asyncio.wait_for(spy.wait(), 30)
                except TimeoutError:
                    spy.kill()
                    await spy.wait()
                stmts = [dict(r) for r in await conn.fetch(PGSS, args.top)]
                cpu_ms = (after["cpu_s"] - before["cpu_s"]) * 1000
                res = {"messages": moved, "elapsed_s": round(elapsed, 2),
                       "msgs_per_s": round(moved / elapsed) if elapsed else None,
                       "broker_cpu_ms_per_1000": round(cpu_ms * 1000 / moved, 1) if moved > 0
                       else None, "broker_rss_mb": round(after["rss_mb"]), "load": load,
                       "python": summarize(raw, args.top) if raw.exists() else None,
                       "postgres": stmts}
                summary[name] = res
                report(name, res)
        finally:
            broker.stop()
            await conn.close()
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        log_file = getattr(db.embedded, "_log_file", None)
        if log_file is not None and Path(log_file).exists():
            shutil.copy(log_file, out / "postgresql.log")
            print(f"server log with auto_explain plans: {out / 'postgresql.log'}")
        print(f"\nraw stacks and summary.json in {out}")
    finally:
        db.stop()
    return 0


async def herd_on(broker: Broker, hargs: argparse.Namespace) -> int:
    """bench_herd.run's measured part against an already running broker."""
    class _Env:
        def __init__(self) -> None:
            self.broker = broker

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    saved = bench_herd.Env
    bench_herd.Env = lambda: _Env()  # type: ignore[assignment]
    try:
        res = await bench_herd.run(hargs, [])
    finally:
        bench_herd.Env = saved
    return res["pushes"]


def report(name: str, res: dict) -> None:
    print(f"\n== {name}: {res['messages']} msgs in {res['elapsed_s']} s = {res['msgs_per_s']} "
          f"msg/s; broker CPU {res['broker_cpu_ms_per_1000']} ms per 1,000 msgs, RSS "
          f"{res['broker_rss_mb']} MB; load {' '.join(f'{x:.1f}' for x in res['load'])}")
    py = res["python"]
    if py:
        print_summary(py, "py-spy (busy only)")
    print("  PostgreSQL (pg_stat_statements, track=all; toplevel f = inside a function):")
    for s in res["postgres"]:
        print(f"    {s['total_ms']:>9} ms {s['calls']:>7} calls {s['mean_ms']:>8} ms/call "
              f"{'' if s['toplevel'] else '(nested) '}{s['query']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(WORKLOADS), metavar="NAME",
                    help=f"workloads, of {', '.join(WORKLOADS)}")
    ap.add_argument("--out", default="/tmp/queen-profile")
    ap.add_argument("--n1", type=int, default=5000, help="messages pushed at batch 1")
    ap.add_argument("--n100", type=int, default=50000, help="messages pushed at batch 100")
    ap.add_argument("--npop", type=int, default=30000, help="messages popped+acked at batch 100")
    ap.add_argument("--herd-parked", type=int, default=2000)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--explain-ms", type=int, default=200,
                    help="auto_explain: log plans of statements slower than this (ms)")
    args = ap.parse_args()
    bad = [n for n in args.names if n not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}")
    return asyncio.run(profile(args))


if __name__ == "__main__":
    sys.exit(main())
