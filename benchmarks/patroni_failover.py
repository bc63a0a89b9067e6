#!/usr/bin/env python3
"""The brokers on a Patroni-managed PostgreSQL through a leader kill and a planned switchover:
how many pushes were acknowledged (``queued`` or ``buffered``), how long until pushes answer
``queued`` again, and delivery latency.

    .venv/bin/python benchmarks/patroni_failover.py                      # kill, switchover
    .venv/bin/python benchmarks/patroni_failover.py --scenarios kill --after-s 40

The same set-up and load as tests/ha/test_patroni.py (tests/ha/patroni_cluster.py,
tests/ha/failover_load.py), for longer: per scenario a fresh cluster (etcd, two PostgreSQL
members under Patroni, ``synchronous_mode`` on, ttl 6 s, loop_wait 1 s, retry_timeout 2 s) and
``--brokers`` fresh broker processes with ``PG_HOST`` listing both members and
``PG_TARGET_SESSION_ATTRS=read-write``, ``DB_CONNECTION_TIMEOUT=500``. ``--producers``
sequential producers push single messages every ``--interval-ms``, each to its own partition
through one broker; two consumer groups pop (batch 10, long polls) and ack through every
broker. ``--before-s`` of load, the fault, ``--after-s`` more, then the drain.

Scenarios: ``kill``: ``kill -9`` of the leader's postmaster, then of its Patroni (the
replica takes over once the leader key expires); ``switchover``: POST /switchover to the
leader's Patroni REST API (what ``patronictl switchover --candidate X --force`` sends).

Reported: pushes, acknowledged (queued / buffered), errors; back to queued: from the moment
the new leader's GET /primary answered 200 to the first push answered ``queued`` after which
every push was (negative: the brokers were writing there before Patroni's REST API said so);
delivery (push sent to first receipt, both groups) p50/p99/max; lost, duplicated or reordered
acknowledged pushes, in PostgreSQL and in each group's deliveries. Exit status 1 when any.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.conftest import Database, launch_broker, stop_brokers, wait_healthy  # noqa: E402
from tests.ha import failover_load  # noqa: E402
from tests.ha.patroni_cluster import PatroniCluster, missing_parts  # noqa: E402


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


def scenario(kind: str, args: argparse.Namespace) -> dict:
    cluster = PatroniCluster(members=2)
    brokers = []
    tmp = Path(tempfile.mkdtemp(prefix="qpatb", dir="/tmp"))
    try:
        t = time.monotonic()
        cluster.start()
        leader = cluster.leader()
        assert leader is not None
        other = next(m for m in cluster.members if m is not leader)
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in cluster.members)
        db = Database("127.0.0.1", leader.pg_port, "postgres", "postgres", "postgres")
        brokers = [launch_broker(db, tmp, PG_HOST=hosts, PG_TARGET_SESSION_ATTRS="read-write",
                                 DB_CONNECTION_TIMEOUT="500") for _ in range(args.brokers)]
        for b in brokers:
            wait_healthy(b, 60)
        log(f"{kind}: cluster and {len(brokers)} brokers up in {time.monotonic() - t:.1f} s "
            f"(leader {leader.name})")

        def fault() -> None:
            if kind == "kill":
                cluster.kill_leader(leader)
            else:
                cluster.switchover(leader, other)

        queue = f"bench-patroni-{kind}-{uuid.uuid4().hex[:8]}"
        run = asyncio.run(failover_load.run(
            [b.url for b in brokers], queue, fault, [other.rest], before_s=args.before_s,
            after_s=args.after_s, producers=args.producers,
            interval_s=args.interval_ms / 1000))
        in_db = asyncio.run(failover_load.stored([m.dsn for m in cluster.members], queue))
        figures = run.figures()
        figures["leader_writable_after_fault_s"] = round(run.writable_at - run.fault_at, 2) \
            if run.writable_at is not None else None
        figures["problems"] = failover_load.losses(run, in_db)
        figures["first_errors"] = run.first_errors
        return {"scenario": kind, **figures}
    finally:
        stop_brokers(brokers)
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="kill,switchover")
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--interval-ms", type=float, default=50)
    parser.add_argument("--before-s", type=float, default=10)
    parser.add_argument("--after-s", type=float, default=20)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    why = missing_parts()
    if why:
        log(f"cannot run: {why}")
        return 2
    results = [scenario(kind, args) for kind in args.scenarios.split(",")]
    keys = ["pushes", "acknowledged", "queued", "buffered", "errors",
            "leader_writable_after_fault_s", "back_to_queued_s", "delivery_p50_ms",
            "delivery_p99_ms", "delivery_max_ms"]
    print("| scenario | " + " | ".join(keys) + " | lost/dup/reordered |")
    print("|---" * (len(keys) + 2) + "|")
    for r in results:
        print(f"| {r['scenario']} | " + " | ".join(str(r[k]) for k in keys)
              + f" | {len(r['problems'])} |")
        for p in r["problems"]:
            print(f"  PROBLEM {p}")
        if r["first_errors"]:
            print(f"  first errors: {r['first_errors']}")
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
