#!/usr/bin/env python3
"""The hot path of two revisions side by side in one run: push 1, push 100, pop + ack 100.

    .venv/bin/python benchmarks/hot_path_ab.py                 # working tree against HEAD
    .venv/bin/python benchmarks/hot_path_ab.py --before 2121caf --rounds 3

One PostgreSQL (embedded, or PG_HOST...), two brokers on it: "before" runs from a temporary
``git worktree`` of ``--before`` (default ``HEAD``), "after" from this checkout (the working
tree, uncommitted changes included); ``--before-env``/``--after-env KEY=VALUE`` set either
broker's environment (two settings of one revision compare the same way). Each round runs every workload on both brokers, in
alternating order (before first in even rounds), each on a fresh queue, then the raw asyncpg
baseline of the same rows (``_loadgen.raw_push`` / ``raw_pop_ack`` on ``bench_raw``, as the
push and pop benchmarks do). Both brokers see the same machine, database and load generator,
so their ratio is what one change is worth, even on a noisy machine.

Each round also runs the "store" floor (``_store_floor.py``): the same rows through the
broker's own store layer (``Store.push``, ``Store.pop`` + ``Store.ack``: the same SQL functions
and argument encoding) called from the load generator, with no HTTP, services, actors or
folding. "raw" is a plain INSERT / SELECT + DELETE on one table: it bounds what PostgreSQL
could do without the broker's guarantees; "store" bounds what this broker could do with them.

Printed per workload (medians over ``--rounds``): msg/s of each broker, after ÷ before,
after ÷ raw, each broker's CPU per 1,000 messages (from /proc) and, for pushes, the request
p50/p99; then the store floor's msg/s, each broker ÷ store, and the store layer's own client
CPU per 1,000 messages (this process's, so the share of a broker's CPU that is asyncpg and the
store). Exit 1 when a phase saw an error (a push not queued, an ack refused).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _loadgen as loadgen  # noqa: E402
import _store_floor as floor  # noqa: E402
from _harness import Broker, BrokerMeter, drop_worktree, start_database, worktree  # noqa: E402
from _loadgen import (  # noqa: E402
    RAW_INSERT_MANY,
    RAW_TABLE,
    Phase,
    Rows,
    fmt_rate,
    http_pop_ack,
    http_push,
    log,
    median,
    percentile,
    ratio,
    raw_pop_ack,
    raw_push,
    table,
)

WORKLOADS = ("push1", "push100", "popack100")


async def broker_phase(broker: Broker, workload: str, n: int, args: argparse.Namespace,
                       label: str) -> Phase:
    rows = Rows(n, args.partitions)
    queue = f"ab-{workload}-{uuid.uuid4().hex[:8]}"
    if workload == "popack100":
        fill = await http_push(broker.url, queue, rows, 100, args.concurrency, 120,
                               f"{label} prefill")
        if fill.done != n:
            fill.error(f"prefill queued {fill.done}/{n}")
            return fill
        meter = BrokerMeter(broker)
        phase = await http_pop_ack(broker.url, queue, n, 100, args.concurrency,
                                   args.max_seconds, label)
    else:
        batch = 1 if workload == "push1" else 100
        meter = BrokerMeter(broker)
        phase = await http_push(broker.url, queue, rows, batch, args.concurrency,
                                args.max_seconds, label)
    phase.broker = meter.figures(phase.done)
    return phase


async def raw_phase(pool, workload: str, n: int, args: argparse.Namespace) -> Phase:
    rows = Rows(n, args.partitions)
    await pool.execute("TRUNCATE bench_raw")
    if workload == "popack100":
        for chunk in rows.chunks(100):
            await pool.execute(RAW_INSERT_MANY, *rows.raw_args(chunk, 100))
        await pool.execute("VACUUM ANALYZE bench_raw")
        return await raw_pop_ack(pool, n, 100, args.concurrency, args.max_seconds,
                                 f"raw {workload}")
    batch = 1 if workload == "push1" else 100
    return await raw_push(pool, rows, batch, args.concurrency, args.max_seconds,
                          f"raw {workload}")


async def store_phase(store, broker: Broker, workload: str, n: int,
                      args: argparse.Namespace) -> Phase:
    """The same rows through the broker's store layer, called from this process (the
    "store" column: the broker's own SQL, no HTTP, no services, no actors, no folding)."""
    rows = Rows(n, args.partitions)
    queue = f"ab-store-{workload}-{uuid.uuid4().hex[:8]}"
    if workload == "popack100":
        fill = await http_push(broker.url, queue, rows, 100, args.concurrency, 120,
                               "store prefill")
        if fill.done != n:
            fill.error(f"prefill queued {fill.done}/{n}")
            return fill
        return await floor.store_pop_ack(store, queue, n, 100, args.concurrency,
                                         args.max_seconds, f"store {workload}")
    batch = 1 if workload == "push1" else 100
    return await floor.store_push(store, rows, queue, batch, args.concurrency,
                                  args.max_seconds, f"store {workload}")


async def main(args: argparse.Namespace) -> int:
    import asyncpg
    loadgen.set_client(args.client)
    sizes = {"push1": args.push1_n, "push100": args.push100_n, "popack100": args.popack_n}
    before_root = worktree(args.before)
    db = start_database()
    brokers: dict[str, Broker] = {}
    errors: list[str] = []
    try:
        brokers["before"] = Broker(db, root=before_root, **env_pairs(args.before_env))
        brokers["after"] = Broker(db, **env_pairs(args.after_env))
        log(f"before: {args.before} on {brokers['before'].url}; after: this checkout on "
            f"{brokers['after'].url}")
        pool = await asyncpg.create_pool(db.dsn, min_size=args.concurrency,
                                         max_size=args.concurrency)
        await pool.execute(RAW_TABLE)
        store = await floor.open_store(db.dsn, args.concurrency)
        for name, b in brokers.items():  # warm caches and pool connections off the clock
            await http_push(b.url, f"ab-warm-{name}", Rows(400, args.partitions), 1,
                            args.concurrency, 30, "warm-up")
        got: dict[tuple[str, str], list[Phase]] = {}
        for rnd in range(args.rounds):
            for workload in args.workloads:
                order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
                for name in order:
                    p = await broker_phase(brokers[name], workload, sizes[workload], args,
                                           f"{name} {workload} r{rnd}")
                    got.setdefault((workload, name), []).append(p)
                    log(f"{p.label}: {fmt_rate(p.rate)} msg/s, broker CPU "
                        f"{p.broker and p.broker['broker_cpu_ms_per_1000']} ms/1k")
                p = await store_phase(store, brokers["after"], workload, sizes[workload], args)
                got.setdefault((workload, "store"), []).append(p)
                log(f"store {workload} r{rnd}: {fmt_rate(p.rate)} msg/s, store CPU "
                    f"{p.broker and p.broker['store_cpu_ms_per_1000']} ms/1k")
                p = await raw_phase(pool, workload, sizes[workload], args)
                got.setdefault((workload, "raw"), []).append(p)
                log(f"raw {workload} r{rnd}: {fmt_rate(p.rate)} msg/s")
        await pool.close()
        await store.close()
        for phases in got.values():
            errors += [f"{p.label}: {p.errors} errors ({p.first_error})" for p in phases
                       if p.errors]
        print_table(got, args.workloads)
    finally:
        for b in brokers.values():
            b.stop()
        db.stop()
        drop_worktree(before_root)
    for e in errors:
        print("ERROR", e)
    return 1 if errors else 0


def print_table(got: dict[tuple[str, str], list[Phase]], workloads: list[str]) -> None:
    def rate(w: str, who: str) -> float | None:
        return median([p.rate or 0.0 for p in got[(w, who)]])

    def cpu(w: str, who: str, key: str = "broker_cpu_ms_per_1000") -> float | None:
        return median([p.broker[key] or 0.0 for p in got[(w, who)] if p.broker])

    def tails(w: str, who: str) -> str:
        lat = [x for p in got[(w, who)] for x in p.latencies_ms]
        if not lat or w == "popack100":
            return "-"
        return f"{percentile(lat, 50):.1f} / {percentile(lat, 99):.1f}"

    rows, floors = [], []
    for w in workloads:
        b, a, s, r = rate(w, "before"), rate(w, "after"), rate(w, "store"), rate(w, "raw")
        cb, ca = cpu(w, "before"), cpu(w, "after")
        cs = cpu(w, "store", "store_cpu_ms_per_1000")
        rows.append([w, fmt_rate(b), fmt_rate(a), f"{ratio(a, b):.2f}", fmt_rate(r),
                     f"{ratio(b, r):.2f}", f"{ratio(a, r):.2f}",
                     f"{cb:.1f}", f"{ca:.1f}", f"{ratio(ca, cb):.2f}",
                     tails(w, "before"), tails(w, "after")])
        floors.append([w, fmt_rate(s), f"{ratio(b, s):.2f}", f"{ratio(a, s):.2f}",
                       f"{cs:.1f}", tails(w, "store")])
    print(table(["workload", "before msg/s", "after msg/s", "after/before", "raw msg/s",
                 "before/raw", "after/raw", "before CPU ms/1k", "after CPU ms/1k",
                 "CPU after/before", "before p50/p99 ms", "after p50/p99 ms"], rows))
    print("The broker's own SQL, called through its store layer from the load generator "
          "(no HTTP, services, actors or folding):")
    print(table(["workload", "store msg/s", "before/store", "after/store",
                 "store client CPU ms/1k", "store p50/p99 ms"], floors))


def env_pairs(pairs: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` as a dict (a broker's environment overrides)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--before-env/--after-env take KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="HEAD", help="git revision of the 'before' broker")
    ap.add_argument("--before-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable of the 'before' broker (repeatable)")
    ap.add_argument("--after-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable of the 'after' broker (repeatable), e.g. to "
                         "compare two settings of the same code with --before HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--push1-n", type=int, default=4000, help="messages pushed one per request")
    ap.add_argument("--push100-n", type=int, default=40000, help="messages pushed 100 per request")
    ap.add_argument("--popack-n", type=int, default=30000, help="messages popped and acked, 100 per pop")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--max-seconds", type=float, default=60.0, help="time cap per phase")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="the load generator's HTTP client (see benchmarks/README.md)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
