"""A Patroni-managed PostgreSQL cluster on loopback, for fault tests and benchmarks.

Real parts, the way operators run them: one etcd (Debian's ``etcd-server``) as the DCS, and
PostgreSQL members each under its own Patroni (Debian's ``patroni``, PostgreSQL's binaries
from ``/usr/lib/postgresql/<major>/bin``), ``synchronous_mode`` on, so an acknowledged commit
is on the synchronous standby before it is answered. The timings (ttl, loop_wait,
retry_timeout) are short so that a failover takes seconds, not the defaults' half a minute.

PostgreSQL refuses to run as root, so as root everything runs as the ``postgres`` system user
the Debian package creates, in a temporary directory it owns. Every process is found again at
cleanup by that directory in its command line (Patroni detaches the postmaster into a session
of its own, so a process group would not reach it) and killed.
"""
from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tests.ports import free_ports
from tests.waiting import wait_until

SCOPE = "queen"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 6, 1, 2  # Patroni wants loop_wait + 2 * retry_timeout <= ttl
SYSTEM_USER = "postgres"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL server binaries (Debian's layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def missing_parts() -> str | None:
    """Why a Patroni cluster cannot run here (what is not installed), or None."""
    needed = {"patroni": shutil.which("patroni"), "etcd": shutil.which("etcd"),
              "PostgreSQL server binaries": bin_dir()}
    absent = [name for name, where in needed.items() if where is None]
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            absent.append(f"the {SYSTEM_USER} system user")
    return ", ".join(absent) + " not installed (apt-get install patroni etcd-server " \
        "postgresql-15)" if absent else None


@dataclass
class Member:
    name: str
    pg_port: int
    rest_port: int
    root: Path
    proc: subprocess.Popen | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / self.name / "data"

    @property
    def config(self) -> Path:
        return self.root / f"{self.name}.yml"

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres:postgres@127.0.0.1:{self.pg_port}/postgres"

    def postmaster_pid(self) -> int | None:
        """The live postmaster of this member's data dir (from ``postmaster.pid``), or None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
            process = psutil.Process(pid)
            if process.name() == "postgres" and process.status() != psutil.STATUS_ZOMBIE:
                return pid
        except (OSError, ValueError, IndexError, psutil.Error):
            pass
        return None

    def role_is(self, role: str) -> bool:
        """Patroni's REST health check: GET /primary, /replica, /sync answers 200."""
        try:
            return httpx.get(f"{self.rest}/{role}", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


class PatroniCluster:
    def __init__(self, members: int = 2) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="qpat", dir="/tmp"))
        ports = free_ports(2 + 2 * members)
        self.etcd_port, self.etcd_peer_port = ports[0], ports[1]
        self.members = [Member(f"m{i + 1}", ports[2 + 2 * i], ports[3 + 2 * i], self.root)
                        for i in range(members)]
        self.etcd: subprocess.Popen | None = None
        self._user = pwd.getpwnam(SYSTEM_USER) if os.geteuid() == 0 else None
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """etcd, then the first member (it bootstraps as the leader), then the others as
        replicas; returns once one of them is the synchronous standby."""
        self.etcd = self._spawn("etcd", [
            "etcd", "--name", "etcd", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-cluster", f"etcd=http://127.0.0.1:{self.etcd_peer_port}"])
        wait_until(self._etcd_healthy, 30, f"etcd serving:\n{self.log('etcd')}")
        first, *others = self.members
        self.start_member(first)
        wait_until(lambda: first.role_is("primary"), 90,
                   f"{first.name} bootstrapped as the leader:\n{self.log(first.name)}")
        for m in others:
            self.start_member(m)
        wait_until(lambda: any(m.role_is("sync") for m in others), 120,
                   "a synchronous standby:\n" + "\n".join(self.log(m.name) for m in others))

    def start_member(self, m: Member) -> None:
        (self.root / m.name).mkdir(exist_ok=True)
        if self._user is not None:
            os.chown(self.root / m.name, self._user.pw_uid, self._user.pw_gid)
        m.config.write_text(json.dumps(self._config(m)))  # JSON is YAML
        m.proc = self._spawn(m.name, ["patroni", str(m.config)])

    def stop(self) -> None:
        """Kill everything this cluster started (also after a failed test), then remove it."""
        marker = str(self.root)
        victims = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any(marker in arg for arg in p.info["cmdline"] or ()):
                    victims.append(p)
            except psutil.Error:
                pass
        for m in self.members:  # a postmaster's command line may name a relative data dir
            pid = m.postmaster_pid()
            if pid is not None:
                victims.append(psutil.Process(pid))
        for p in victims:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(victims, timeout=10)
        for proc in [self.etcd, *(m.proc for m in self.members)]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ faults and views

    def leader(self) -> Member | None:
        return next((m for m in self.members if m.role_is("primary")), None)

    def ready(self, timeout_s: float = 120) -> Member:
        """Wait until there is a leader and another member is its synchronous standby (as
        after start(), and again after a switchover once the old leader has rejoined);
        returns the leader."""
        def both() -> bool:
            return self.leader() is not None and any(m.role_is("sync") for m in self.members)
        wait_until(both, timeout_s, "a leader and a synchronous standby:\n"
                   + "\n".join(self.log(m.name) for m in self.members))
        leader = self.leader()
        assert leader is not None
        return leader

    def kill_leader(self, leader: Member) -> None:
        """``kill -9`` of the leader's postmaster, then of its Patroni: nothing restarts it
        there, the leader key expires after the ttl and a replica takes over."""
        pid = leader.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        assert leader.proc is not None
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(10)
        # Patroni may have restarted the postmaster between the two kills.
        pid = leader.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def switchover(self, leader: Member, candidate: Member) -> None:
        """A planned switchover through Patroni's REST API (what ``patronictl switchover
        --candidate X --force`` sends)."""
        r = httpx.post(f"{leader.rest}/switchover", timeout=60,
                       json={"leader": leader.name, "candidate": candidate.name})
        assert r.status_code == 200, r.text

    def log(self, name: str) -> str:
        try:
            return (self.root / f"{name}.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    # ------------------------------------------------------------------ internals

    def _etcd_healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.etcd_port}/health",
                             timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root),
               "LANG": "C.UTF-8"}
        extra: dict = {}
        if self._user is not None:
            extra = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        try:
            return subprocess.Popen(argv, cwd=self.root, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, **extra)
        finally:
            log.close()

    def _config(self, m: Member) -> dict:
        return {
            "scope": SCOPE,
            "namespace": "/service/",
            "name": m.name,
            "restapi": {"listen": f"127.0.0.1:{m.rest_port}",
                        "connect_address": f"127.0.0.1:{m.rest_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "postgresql": {"use_pg_rewind": True,
                                   "parameters": {"max_connections": 200,
                                                  "wal_log_hints": "on"}},
                },
                "initdb": [{"encoding": "UTF8"}, {"username": "postgres"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{m.pg_port}",
                "connect_address": f"127.0.0.1:{m.pg_port}",
                "data_dir": str(m.data_dir),
                "bin_dir": str(bin_dir()),
                "pgpass": str(self.root / m.name / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "pg_hba": ["local all all trust",
                           "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
                "parameters": {"unix_socket_directories": str(self.root / m.name)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False,
                     "nosync": False},
        }
