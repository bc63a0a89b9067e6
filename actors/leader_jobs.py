"""Background jobs: retention sweep (lock 737001), stats reconciler (lock
737002), metrics collector (ungated). See behaviour.md §7."""
from __future__ import annotations

from typing import Any


async def start_jobs(*, store: Any, settings: Any, telemetry: Any, gauges: Any) -> dict:
    """Start the job actors; returns them by name (stopped by runtime.stop_all)."""
    return {}
