"""The spool's figures: ``GET /health`` → ``spool`` (with ``staging`` added by
broker/service/drain.py), the Prometheus ``queen_file_buffer_*`` families, and the
one line that says what became of a backlog once the spool is empty again."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

if TYPE_CHECKING:
    from actors.spool.actor import Spool

__all__ = ["DrainedLine", "dir_usage", "figures"]


def figures(spool: Spool, failed_files: tuple[int, int]) -> dict[str, Any]:
    """The spool's figures; ``failed_files`` is ``dir_usage(failed/)``."""
    files, writer, uploader = spool.files, spool.writer, spool.uploader
    count, total = failed_files
    return {
        "pendingCount": max(0, files.pending),
        "pendingFiles": files.pending_files(),
        "pendingBytes": files.bytes,
        "maxBytes": writer.max_bytes,
        "rejectedFull": writer.rejected_full,
        "failedCount": writer.failed,
        "failedFiles": {"count": count, "totalBytes": total,
                        "totalMB": round(total / (1024 * 1024), 2)},
        "dbHealthy": spool.health.db_healthy,
        "paused": spool.paused,
        "healthy": writer.healthy,
        "backlogPartitions": spool.backlog.partitions(),
        "replayedEvents": uploader.replayed_events,
        "quarantinedFiles": uploader.quarantined_files,
        "quarantinedEvents": spool.quarantine.count,
        "registeredPartitions": len(spool.registration.registered),
        # Durability (FILE_BUFFER_FSYNC): syncs served and failed, acknowledged events a
        # failed sync left exposed (interval mode only), and what the start found damaged.
        "fsync": writer.policy,
        "syncs": writer.syncs,
        "syncFailures": writer.sync_failures,
        "unsafeAcknowledged": writer.unsafe_acknowledged,
        "tornBytesCut": writer.recovered.torn_bytes,
        "damagedRecords": writer.recovered.damaged + uploader.damaged_records,
        "spoolId": spool.spool_id,
    }


class DrainedLine:
    """Once the spool is empty again: one line saying what became of what it held, and how
    long after the first of it was spooled.

    That time is the oldest pending event's accept time (``acceptedAt``, the wall clock in
    µs, or its file's name for older records), read from the spool itself, so it holds
    across a restart: a backlog spooled before the broker stopped and drained after the next
    start is timed from when it was spooled, not from when this process first saw it."""

    def __init__(self) -> None:
        # (first accept time in µs, uploaded events, quarantined events) as the spool last
        # became non-empty
        self._started: tuple[int, int, int] | None = None

    def maybe_started(self, pending: int, uploaded: int, quarantined: int,
                      oldest_us: Callable[[], int | None]) -> None:
        """``oldest_us``: the accept time of the oldest event still pending (None when the
        spool cannot tell), asked only when a backlog starts."""
        if pending > 0 and self._started is None:
            first = oldest_us()
            self._started = (first if first else time.time_ns() // 1000, uploaded, quarantined)

    def maybe_done(self, pending: int, uploaded: int, quarantined: int) -> None:
        if pending > 0 or self._started is None:
            return
        since_us, uploaded_then, quarantined_then = self._started
        self._started = None
        took = max(0.0, (time.time_ns() // 1000 - since_us) / 1e6)
        logger.info("spool: drained: {} event(s) stored, {} quarantined, {:.1f} s after the "
                    "first was spooled", uploaded - uploaded_then,
                    max(0, quarantined - quarantined_then), took)


def dir_usage(directory: Path) -> tuple[int, int]:
    """(files, bytes) of a directory (blocking)."""
    count = total = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.is_file():
                    count += 1
                    total += entry.stat().st_size
    except OSError:
        pass
    return count, total
