"""Process plumbing shared by the benchmarks: a PostgreSQL and broker processes.

Same approach as tests/conftest.py (copied, not imported, so the benchmarks do not depend on
pytest): PG_HOST/PG_PORT/PG_USER/PG_PASSWORD/PG_DB when PG_HOST is set, otherwise an embedded
PostgreSQL in a temporary directory; brokers are real ``python -m broker`` processes on loopback.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent


def worktree(rev: str) -> Path:
    """A temporary detached ``git worktree`` of ``rev``: a broker of that revision runs from
    it (``Broker(root=...)``) beside this checkout's, to compare the two in one run."""
    path = Path(tempfile.mkdtemp(prefix="qbench-rev-", dir="/tmp"))
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path), rev],
                   cwd=ROOT, check=True)
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                   check=False, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Database:
    host: str
    port: int
    user: str
    password: str
    db: str
    embedded: object | None = None
    tmp: Path | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.db}"

    def env(self) -> dict[str, str]:
        return {"PG_HOST": self.host, "PG_PORT": str(self.port), "PG_USER": self.user,
                "PG_PASSWORD": self.password, "PG_DB": self.db}

    @property
    def kind(self) -> str:
        return "embedded" if self.embedded is not None else "external"

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop(mode="immediate")
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def can_restart(self) -> bool:
        """Only an embedded PostgreSQL (ours alone) may be stopped and started mid-run."""
        return self.embedded is not None

    async def stop_server(self) -> None:
        """Crash-stop the server (``pg_ctl stop -m immediate``: connections die, no checkpoint),
        in a thread so the event loop keeps running."""
        await self.embedded.astop(mode="immediate")

    async def start_server(self) -> None:
        await self.embedded.astart()


def start_database() -> Database:
    """The external database named by PG_* (PG_HOST set) or a fresh embedded one."""
    if os.environ.get("PG_HOST"):
        return Database(os.environ["PG_HOST"], int(os.environ.get("PG_PORT", "5432")),
                        os.environ.get("PG_USER", "postgres"),
                        os.environ.get("PG_PASSWORD", "postgres"),
                        os.environ.get("PG_DB", "postgres"))
    from broker.store.embedded_pg import EmbeddedPostgres
    tmp = Path(tempfile.mkdtemp(prefix="qbench-pg", dir="/tmp"))
    pg = EmbeddedPostgres(tmp / "data", port=free_port())
    pg.start()
    return Database(pg.host, pg.port, "postgres", "postgres", "postgres", embedded=pg, tmp=tmp)


class Broker:
    def __init__(self, database: Database, *, root: Path | None = None,
                 **env_overrides: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="qbench-broker", dir="/tmp"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **database.env(), "HOST": "127.0.0.1", "PORT": str(self.port),
               "LOG_LEVEL": "WARNING", "FILE_BUFFER_DIR": str(self.tmp / "buffers"),
               "QUEEN_MESH_PEERS": "", **env_overrides}
        self.log_path = self.tmp / "broker.log"
        self._log = open(self.log_path, "wb")
        # ``root`` or BENCH_BROKER_ROOT: run the broker from another checkout (e.g. to compare
        # two revisions with the same benchmark script); ``-m`` imports from the working
        # directory.
        root = root or Path(os.environ.get("BENCH_BROKER_ROOT") or ROOT)
        self.proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=root, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                message = f"broker exited with {self.proc.returncode}:\n{self.log()}"
                self.stop()
                raise RuntimeError(message)
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        message = f"broker did not become healthy:\n{self.log()}"
        self.stop()
        raise RuntimeError(message)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def start_brokers(database: Database, n: int, mesh: bool, *, root: Path | None = None,
                  **env_overrides: str) -> list[Broker]:
    """``n`` brokers on one database, each with its own server id and mesh port.  With ``mesh``
    each lists all the others as peers (same secret, loopback); without it QUEEN_MESH_PEERS is
    empty, so no mesh runs and a broker only learns of another's pushes by re-checking.
    ``root``: run them from another checkout (as ``Broker``)."""
    ports = [free_port() for _ in range(n)]
    secret = "be" * 32
    brokers: list[Broker] = []
    try:
        for i in range(n):
            peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i)
            brokers.append(Broker(database, root=root, **{
                "QUEEN_SERVER_ID": f"bench-{i}", "QUEEN_MESH_PORT": str(ports[i]),
                "QUEEN_MESH_PEERS": peers if mesh else "", "QUEEN_SYNC_SECRET": secret,
                **env_overrides}))
    except Exception:
        for b in brokers:
            b.stop()
        raise
    return brokers


# ----------------------------------------------------------------------------------------------
# A minimal HTTP/1.1 keep-alive client (--client raw)
# ----------------------------------------------------------------------------------------------

class RawResponse:
    __slots__ = ("status_code", "content")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self):
        import json
        return json.loads(self.content)


class RawHTTPClient:
    """Just enough HTTP/1.1 for the benchmarks: keep-alive connections, Content-Length bodies.

    httpx costs ~1-2 ms of client CPU per request, which on a 2-core machine shared with the
    broker and PostgreSQL caps a load generator near 500 req/s; this client costs a tenth of
    that, so small-request benchmarks measure the broker rather than the client.  The interface
    is the subset of ``httpx.AsyncClient`` the benchmarks use.
    """

    def __init__(self, base_url: str, max_connections: int = 64) -> None:
        import asyncio
        from urllib.parse import urlsplit
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname, parts.port or 80
        self._idle: list = []
        self._sem = asyncio.Semaphore(max_connections)
        self._host_header = f"{self._host}:{self._port}".encode()

    async def __aenter__(self) -> RawHTTPClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()

    async def get(self, path: str, **kw) -> RawResponse:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, content: bytes | str = b"", headers: dict | None = None,
                   **kw) -> RawResponse:
        return await self.request("POST", path, content=content, headers=headers)

    async def request(self, method: str, path: str, content: bytes | str = b"",
                      headers: dict | None = None) -> RawResponse:
        import asyncio
        if isinstance(content, str):
            content = content.encode()
        head = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self._host_header]
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}".encode())
        if content or method == "POST":
            head.append(b"Content-Length: " + str(len(content)).encode())
        data = b"\r\n".join(head) + b"\r\n\r\n" + content
        async with self._sem:
            for attempt in (0, 1):
                reused = bool(self._idle)
                if reused:
                    reader, writer = self._idle.pop()
                else:
                    reader, writer = await asyncio.open_connection(self._host, self._port)
                try:
                    writer.write(data)
                    status_line = await reader.readuntil(b"\r\n")
                    header_blob = await reader.readuntil(b"\r\n\r\n")
                except (ConnectionError, asyncio.IncompleteReadError):
                    writer.close()
                    if reused and attempt == 0:
                        continue  # a keep-alive connection the server closed: retry once, fresh
                    raise
                status = int(status_line.split(b" ", 2)[1])
                length, close = 0, False
                for line in header_blob.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                    elif name == b"transfer-encoding":
                        raise RuntimeError("chunked responses are not supported by RawHTTPClient")
                body = await reader.readexactly(length) if length else b""
                if close:
                    writer.close()
                else:
                    self._idle.append((reader, writer))
                return RawResponse(status, body)
        raise RuntimeError("unreachable")


# ----------------------------------------------------------------------------------------------
# The broker's own figures, from /proc (steadier than wall-clock figures on a shared machine)
# ----------------------------------------------------------------------------------------------

def proc_figures(pid: int) -> dict[str, float]:
    """CPU seconds (user + system), RSS and peak RSS (VmHWM) in MB of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return {"cpu_s": cpu, "rss_mb": rss, "peak_rss_mb": peak}


class BrokerMeter:
    """Broker CPU and memory over one measured phase, summed over the given brokers.

    ``meter = BrokerMeter(brokers)`` snapshots the CPU counters; ``meter.figures(n)`` reads them
    again and answers CPU ms in total and per 1,000 of the ``n`` messages the phase moved, the
    largest current RSS and the largest peak RSS (VmHWM: the high-water mark since the broker
    started, so a short peak between two readings is not missed).  ``meter.stop()`` takes the
    closing reading early (before the brokers stop, when the message count is only known
    later)."""

    def __init__(self, brokers: Broker | list[Broker]) -> None:
        self.pids = [b.proc.pid for b in (brokers if isinstance(brokers, list) else [brokers])]
        self.start = [proc_figures(p)["cpu_s"] for p in self.pids]
        self.end: list[dict[str, float]] | None = None

    def stop(self) -> None:
        if self.end is None:
            self.end = [proc_figures(p) for p in self.pids]

    def figures(self, messages: int) -> dict[str, float | None]:
        now = self.end or [proc_figures(p) for p in self.pids]
        cpu_ms = sum(n["cpu_s"] - s for n, s in zip(now, self.start)) * 1000
        return {"broker_cpu_ms": round(cpu_ms, 1),
                "broker_cpu_ms_per_1000": round(cpu_ms * 1000 / messages, 1) if messages else None,
                "broker_rss_mb": round(max(n["rss_mb"] for n in now), 1),
                "broker_peak_rss_mb": round(max(n["peak_rss_mb"] for n in now), 1)}


def fmt_broker(fig: dict | None) -> str:
    """'CPU 12.3 ms/1k msgs, RSS 80 MB (peak 85)' for a BrokerMeter.figures() result."""
    if not fig:
        return "-"
    per = fig.get("broker_cpu_ms_per_1000")
    return (f"CPU {'-' if per is None else f'{per:,.1f}'} ms/1k msgs, RSS "
            f"{fig['broker_rss_mb']:.0f} MB (peak {fig['broker_peak_rss_mb']:.0f})")


STORED_IN_SEQ_ORDER = """
SELECT p.name AS partition, m.transaction_id, m.seq FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1
ORDER BY p.name, m.seq"""
"""A queue's stored messages, per partition in position order (the order checks' input)."""


class PgMeter:
    """CPU seconds of a PostgreSQL server: its postmaster and every process under it, plus
    what the postmaster has reaped (backends and workers that exited count too)."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = psutil.Process(postmaster)

    def cpu_s(self) -> float:
        t = self.postmaster.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in self.postmaster.children(recursive=True):
            try:
                c = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += c.user + c.system
        return total


async def enable_pg_statements(db: Database) -> None:
    """pg_stat_statements with ``track = all`` (the statements inside the data-path functions
    count too): preloaded on the embedded server, which restarts for it (before any broker
    connects), and created."""
    conn = await asyncpg.connect(db.dsn)
    try:
        loaded = await conn.fetchval("SHOW shared_preload_libraries")
        if "pg_stat_statements" not in loaded:
            if db.embedded is None:
                raise SystemExit("pg_stat_statements is not preloaded on PG_HOST's server")
            await conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            await conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
    finally:
        await conn.close()
    if db.embedded is not None:
        db.embedded.stop()
        db.embedded.start()
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()
