#!/usr/bin/env python3
"""Load benchmarks for the broker, reported as ratios measured in the same run.

    python3 dev.py bench                 # all (push pop wake wake_ha consume outage outage_ha herd
                                         #      partitions fanout backlog)
    python3 dev.py bench --quick         # the same, smaller (backlog 1 M messages, ...)
    python3 dev.py bench push wake       # only some
    python3 dev.py bench --help          # sizes, concurrency, rounds, output dir

Each benchmark starts its own PostgreSQL (embedded, in a temp dir; or the server named by
PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB) and its own broker process (LOG_LEVEL=WARNING) on
loopback, runs bounded loops (bounded counts and a time cap per phase), prints a table and writes
its results as JSON to <results-dir>/<name>-<timestamp>.json.  A summary table and the
targets table (_targets.py: target, measured, ratio, met / NOT met) close the run.  Every
benchmark reports the broker's CPU per 1,000 messages and its RSS (_harness.BrokerMeter).
Throughput is compared with a raw-asyncpg baseline doing the equivalent minimal SQL on the same
database in the same run, so the ratio (broker / raw) is what to read on a noisy
machine; absolute msg/s numbers are only comparable within one run.

One module per benchmark (bench_push.py, bench_pop_ack.py, bench_wake.py, bench_wake_ha.py,
bench_consume.py, bench_outage.py, bench_outage_ha.py, bench_herd.py, scale_partitions.py,
scale_fanout.py, scale_backlog.py); this file parses the command line (each module adds its
options), runs the named ones in turn and writes their results, the summary and the targets.

Exit status: 0 on success, 1 when an invariant failed (lost, duplicated or reordered messages,
failed requests, a pending partition never served), 2 on bad arguments; missed targets do not
change it.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _loadgen as loadgen  # noqa: E402
import bench_client_paths  # noqa: E402
import bench_consume  # noqa: E402
import bench_ephemeral  # noqa: E402
import bench_herd  # noqa: E402
import bench_outage  # noqa: E402
import bench_outage_ha  # noqa: E402
import bench_pop_ack  # noqa: E402
import bench_push  # noqa: E402
import bench_wake  # noqa: E402
import bench_wake_ha  # noqa: E402
import scale_backlog  # noqa: E402
import scale_fanout  # noqa: E402
import scale_partitions  # noqa: E402
from _loadgen import table  # noqa: E402
from _targets import HEADERS as TARGET_HEADERS  # noqa: E402
from _targets import target_rows  # noqa: E402

# One module per benchmark; each has NAME, add_arguments(parser), run(args, failures) (async,
# returns the result written to the JSON) and summary_rows(result).  In the order they run.
MODULES = (bench_push, bench_pop_ack, bench_wake, bench_wake_ha, bench_consume, bench_client_paths,
           bench_ephemeral, bench_outage, bench_outage_ha, bench_herd, scale_partitions,
           scale_fanout, scale_backlog)
BY_NAME = {m.NAME: m for m in MODULES}
BENCHMARKS = tuple(BY_NAME)
# The order of their options in --help (outage's before consume's, as it always was).
OPTION_ORDER = (bench_push, bench_pop_ack, bench_wake, bench_wake_ha, bench_outage,
                bench_outage_ha, bench_consume, bench_client_paths, bench_ephemeral, bench_herd,
                scale_partitions, scale_fanout, scale_backlog)
assert set(OPTION_ORDER) == set(MODULES), "every benchmark module in both lists"
# --quick: smaller sizes for a shorter run (options given explicitly are kept)
QUICK = {"backlog_messages": 1_000_000, "fanout_n": 10_000, "wake_tries": 100,
         "wake_ha_tries": 100, "wake_ha_cut_tries": 10, "push_n100": 20_000, "pop_n100": 20_000,
         "consume_n": 5_000}


def environment() -> dict:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        rev = ""
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "git_rev": rev or None,
            "database": "external" if os.environ.get("PG_HOST") else "embedded"}


def summary_rows(name: str, res: dict) -> list[list[str]]:
    return BY_NAME[name].summary_rows(res)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)")
    ap.add_argument("-c", "--concurrency", type=int, default=16,
                    help="concurrent client tasks (push/pop) and raw pool size")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="HTTP load generator for push/pop/wake: a minimal asyncio HTTP/1.1 "
                         "keep-alive client, or httpx.AsyncClient (~10x more client CPU per "
                         "request: on 2 cores it caps near 450 req/s and hides the broker)")
    ap.add_argument("--no-uvloop", action="store_true",
                    help="run the load generator on the default asyncio loop, not uvloop")
    ap.add_argument("--partitions", type=int, default=16, help="partitions per queue")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each push/pop measurement (broker then raw) and report medians")
    for module in OPTION_ORDER:
        module.add_arguments(ap)
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes for a shorter run: " + ", ".join(
                        f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="time cap of each measured phase")
    ap.add_argument("--results-dir", default=os.environ.get("BENCH_RESULTS_DIR",
                                                            "/tmp/queen-bench-results"),
                    help="where the JSON results go")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if min(args.concurrency, args.partitions, args.rounds, args.consume_producers,
           args.consume_concurrency, args.consume_batch, args.wake_tries, args.wake_ha_tries,
           args.wake_ha_cut_tries, args.wake_ha_cut_lanes, args.outage_producers) < 1:
        ap.error("counts must be >= 1")
    if len(args.outage_ha_timeline) % 2 == 0 or min(args.outage_ha_timeline) < 0 \
            or min(args.outage_ha_brokers, args.outage_ha_producers) < 1 \
            or args.outage_ha_groups < 0:
        ap.error("--outage-ha-timeline must be an odd number of seconds >= 0 (up, down, ..., "
                 "up); outage_ha brokers and producers >= 1, groups >= 0")
    cut = args.wake_ha_cut_delay_ms
    if len(cut) != 2 or not 0 <= cut[0] <= cut[1] <= 3500:
        ap.error("--wake-ha-cut-delay-ms must be LO-HI with 0 <= LO <= HI <= 3500 (the parked "
                 "pop times out after 5 s)")
    if not 0 <= args.wake_ha_delay_ms <= 3500 or not 0 <= args.wake_delay_ms <= 3500:
        ap.error("wake delays must be between 0 and 3500 ms (the parked pop times out after 5 s)")
    args.names = args.names or list(BENCHMARKS)
    return args


async def main_async(args: argparse.Namespace) -> int:
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    env = environment()
    summary: list[list[str]] = []
    by_name: dict[str, dict | None] = {}
    written: list[Path] = []
    all_failures: list[str] = []
    t_all = time.perf_counter()
    print(f"benchmarks: {', '.join(args.names)} (python {env['python']}, {env['cpus']} cpus, "
          f"{env['database']} PostgreSQL, client {args.client} on {args.loop})")
    for name in args.names:
        print(f"\n== {name} " + "=" * (70 - len(name)), flush=True)
        failures: list[str] = []
        t = time.perf_counter()
        try:
            res = await BY_NAME[name].run(args, failures)
        except Exception as exc:  # one broken benchmark does not hide the others
            failures.append(f"{name}: crashed: {exc!r}")
            res = None
        for f in failures:
            print(f"  FAILED: {f}")
        all_failures += failures
        doc = {"benchmark": name, "timestamp": stamp, "duration_s": time.perf_counter() - t,
               "environment": env, "parameters": {k: v for k, v in vars(args).items()
                                                   if k != "names"},
               "failures": failures, "result": res}
        path = results_dir / f"{name}-{stamp}.json"
        path.write_text(json.dumps(doc, indent=2, default=str))
        written.append(path)
        by_name[name] = res
        if res is not None:
            summary += summary_rows(name, res)
        else:
            summary.append([f"{name}: crashed", "-", "-", "-"])

    print("\n== summary " + "=" * 63)
    print(table(["benchmark", "broker", "baseline: raw asyncpg / target", "broker/raw, verdict"],
                summary))
    print("\n== targets " + "=" * 62)
    print(table(TARGET_HEADERS, target_rows(by_name)))
    print(f"  load {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {env['cpus']} cpus; a "
          f"missed target does not change the exit status (invariant failures do)")
    print(f"total time {time.perf_counter() - t_all:.0f}s; results:")
    for p in written:
        print(f"  {p}")
    if all_failures:
        print(f"{len(all_failures)} failure(s):")
        for f in all_failures:
            print(f"  - {f}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    loadgen.set_client(args.client)
    if not args.no_uvloop:
        try:
            import uvloop
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            args.loop = "uvloop"
        except ImportError:
            args.loop = "asyncio"
    else:
        args.loop = "asyncio"
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
