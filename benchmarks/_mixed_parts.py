"""The parts of mixed_load.py that measure the machine rather than the broker's answers: CPU
seconds of the brokers, of PostgreSQL (postmaster, live and reaped children) and of this
load generator (PostgreSQL's through _harness.PgMeter), pg_stat_statements over a window,
py-spy on the brokers."""
from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
from pathlib import Path

from _harness import Broker, BrokerMeter, Database, PgMeter

# ----------------------------------------------------------------------------------------------
# CPU of the parts, from /proc
# ----------------------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def loadgen_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine_busy_s() -> float:
    """CPU seconds every core spent not idle (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return (sum(cpu[:8]) - cpu[3] - cpu[4]) / TICK


def postmaster_pid(db: Database) -> int | None:
    if db.embedded is None:
        return None  # an external server: maybe not on this machine
    try:
        return int((db.embedded.data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """Brokers, PostgreSQL, load generator and the whole machine between start() and stop()."""

    def __init__(self, brokers: list[Broker], postmaster: int | None) -> None:
        self.brokers = brokers
        self.pg = PgMeter(postmaster) if postmaster is not None else None

    def _broker_sys_s(self) -> float:
        return sum(int(_stat_fields(b.proc.pid)[12]) for b in self.brokers) / TICK

    def start(self) -> None:
        self.broker = BrokerMeter(self.brokers)
        self.pg0 = self.pg.cpu_s() if self.pg is not None else None
        self.lg0, self.m0 = loadgen_cpu_s(), machine_busy_s()
        self.sys0 = self._broker_sys_s()

    def stop(self) -> dict[str, float | None]:
        self.broker.stop()
        sys1 = self._broker_sys_s()
        pg1 = self.pg.cpu_s() if self.pg is not None else None
        lg1, m1 = loadgen_cpu_s(), machine_busy_s()
        b = self.broker.figures(0)
        brokers = b["broker_cpu_ms"] / 1000
        pg = None if pg1 is None or self.pg0 is None else pg1 - self.pg0
        lg, machine = lg1 - self.lg0, m1 - self.m0
        return {"brokers_s": brokers, "brokers_system_s": round(sys1 - self.sys0, 2),
                "postgres_s": pg, "loadgen_s": lg, "machine_s": machine,
                "others_s": machine - brokers - (pg or 0) - lg,
                "broker_peak_rss_mb": b["broker_peak_rss_mb"]}


PGSS_TOP = """SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
                 round(mean_exec_time::numeric, 3) AS mean_ms, toplevel,
                 left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query
          FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat_statements%'
          ORDER BY total_exec_time DESC LIMIT $1"""


async def pg_statements(db: Database | None, top: int, reset: bool = False) -> list[dict]:
    if db is None:
        return []
    import asyncpg
    conn = await asyncpg.connect(db.dsn)
    try:
        if reset:
            await conn.execute("SELECT pg_stat_statements_reset()")
            return []
        return [dict(r) for r in await conn.fetch(PGSS_TOP, top)]
    finally:
        await conn.close()


# ----------------------------------------------------------------------------------------------
# py-spy on the brokers (--profile-dir)
# ----------------------------------------------------------------------------------------------

def start_py_spy(brokers: list[Broker], args: argparse.Namespace, tag: str) -> list:
    from profile_broker import py_spy
    out = Path(args.profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [(subprocess.Popen(
        # py-spy's default: the broker paused while a sample is read. Without the pause
        # (--spy-arg=--nonblocking) stacks are read while they change, and most samples of
        # this load landed in the event loop's and asyncpg's frames wrongly (perf put 74 % of
        # the brokers' CPU in the interpreter's bytecode loop, 2 % in asyncpg's protocol).
        [py_spy(), "record", "--format", "raw", "--rate", str(args.spy_rate), *args.spy_args, "-o", str(out / f"{tag}-b{i}.txt"), "--pid", str(b.proc.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out / f"{tag}-b{i}.txt")
        for i, b in enumerate(brokers)]


def stop_py_spy(spies: list, args: argparse.Namespace, tag: str) -> dict | None:
    from profile_broker import summarize
    for p, _ in spies:
        p.send_signal(signal.SIGINT)
    for p, _ in spies:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    merged = Path(args.profile_dir) / f"{tag}.txt"
    with merged.open("w") as out:
        for _, path in spies:
            if path.exists():
                out.write(path.read_text(errors="replace"))
    return summarize(merged, args.top)
