"""One spool directory, one broker.

Two brokers writing one FILE_BUFFER_DIR would replay each other's files under their own
names and interleave their accept orders: pushes come out of order (seen: five alternating
pushes during maintenance replayed b1..b5 before a1..a5). So a broker takes an exclusive
``flock`` on ``FILE_BUFFER_DIR/lock`` before it touches anything in it, keeps it for its whole
life, and refuses to start when another live process holds it. The lock file also names the
holder's pid, for the one-line refusal.

The kernel drops the lock when the process dies, however it dies (``kill -9`` included), so a
stale file never blocks a restart. ``flock`` on a network filesystem may not be honoured:
keep the spool on a local disk (it is node-local by design).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from actors.spool.files import make_dir

LOCK_NAME = "lock"


class SpoolDirectoryBusy(Exception):
    """Another live process holds the directory's lock."""

    def __init__(self, directory: Path, holder: str) -> None:
        super().__init__(f"spool directory {directory} is in use by another broker "
                         f"(pid {holder}); give each broker its own FILE_BUFFER_DIR")
        self.directory = directory
        self.holder = holder


class SpoolDirectoryLock:
    """Held from `acquire()` until the process ends (its descriptor is never closed)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory).resolve()
        self.path = self.directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise SpoolDirectoryBusy (OSError when the directory cannot be
        made or the file opened)."""
        make_dir(self.directory)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SpoolDirectoryBusy(self.directory, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
