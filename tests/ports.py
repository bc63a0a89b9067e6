"""Loopback ports for the processes the tests start, never handed out twice.

A test picks a port, releases it, and a broker binds it seconds later. Two things could take
it in between, and both did (a broker's mesh listener failed with "address already in use",
so its peer never connected and "mesh up" timed out):

- the kernel's ``bind(port 0)`` may return a port it returned a moment ago: a port picked for a
  peer's mesh came back as another broker's HTTP port;
- ``bind(port 0)`` draws from the ephemeral range, the same range every outgoing connection
  (a client's, a PostgreSQL pool's) takes its local port from.

So ports come from below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
where no outgoing connection lands, in order, each at most once per test process. A process
holds an exclusive ``flock`` on the block it draws from, so two suites run side by side draw
from different blocks. A port that something else holds is skipped (it fails a trial bind).
"""
from __future__ import annotations

import fcntl
import socket
import tempfile
import threading
from pathlib import Path
from typing import IO

BLOCK_SIZE = 500
LOCK_DIR = Path(tempfile.gettempdir()) / "queen-test-ports"
_FALLBACK_EPHEMERAL_LOW = 32768


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


class PortAllocator:
    def __init__(self, low: int = 10_000, high: int | None = None) -> None:
        self.low = low
        self.high = min(high or _ephemeral_low(), 65_536)
        self._lock = threading.Lock()
        self._held: list[IO[bytes]] = []   # flocked block files, kept open for the process
        self._next: int | None = None
        self._end = 0
        self._block = -1

    def _claim_block(self) -> None:
        LOCK_DIR.mkdir(exist_ok=True)
        blocks = (self.high - self.low) // BLOCK_SIZE
        for block in range(self._block + 1, blocks):
            handle = open(LOCK_DIR / f"block-{block}", "wb")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            self._held.append(handle)
            self._block = block
            self._next = self.low + block * BLOCK_SIZE
            self._end = self._next + BLOCK_SIZE
            return
        raise RuntimeError(f"no free block of {BLOCK_SIZE} test ports in "
                           f"{self.low}..{self.high} ({LOCK_DIR})")

    def take(self) -> int:
        return self.take_range(1)

    def take_range(self, n: int) -> int:
        """The first of ``n`` consecutive such ports (for tools that lay ports out from a
        base, like compose/local_ha.py's --base-port)."""
        if not 0 < n <= BLOCK_SIZE:
            raise ValueError(f"a range of 1..{BLOCK_SIZE} ports, not {n}")
        with self._lock:
            while True:
                if self._next is None or self._next + n > self._end:
                    self._claim_block()
                assert self._next is not None
                base = self._next
                busy = next((p for p in range(base, base + n) if not _bindable(p)), None)
                self._next = base + n if busy is None else busy + 1
                if busy is None:
                    return base


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_ALLOCATOR = PortAllocator()


def free_port() -> int:
    """A loopback port nothing listens on, never returned before in this process."""
    return _ALLOCATOR.take()


def free_ports(n: int) -> list[int]:
    """``n`` distinct such ports."""
    return [free_port() for _ in range(n)]


def free_port_range(n: int) -> int:
    """The first of ``n`` consecutive such ports."""
    return _ALLOCATOR.take_range(n)


__all__ = ["PortAllocator", "free_port", "free_port_range", "free_ports"]
