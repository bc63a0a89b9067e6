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

import httpx

ROOT = Path(__file__).resolve().parent.parent


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


def start_database() -> Database:
    """The external database named by PG_* (PG_HOST set) or a fresh embedded one."""
    if os.environ.get("PG_HOST"):
        return Database(os.environ["PG_HOST"], int(os.environ.get("PG_PORT", "5432")),
                        os.environ.get("PG_USER", "postgres"),
                        os.environ.get("PG_PASSWORD", "postgres"),
                        os.environ.get("PG_DB", "postgres"))
    from broker.embedded_pg import EmbeddedPostgres
    tmp = Path(tempfile.mkdtemp(prefix="qbench-pg", dir="/tmp"))
    pg = EmbeddedPostgres(tmp / "data", port=free_port())
    pg.start()
    return Database(pg.host, pg.port, "postgres", "postgres", "postgres", embedded=pg, tmp=tmp)


class Broker:
    def __init__(self, database: Database, **env_overrides: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="qbench-broker", dir="/tmp"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **database.env(), "HOST": "127.0.0.1", "PORT": str(self.port),
               "LOG_LEVEL": "WARNING", "FILE_BUFFER_DIR": str(self.tmp / "buffers"),
               "QUEEN_MESH_PEERS": "", **env_overrides}
        self.log_path = self.tmp / "broker.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=ROOT, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"broker did not become healthy:\n{self.log()}")

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
