"""The cluster's spool holds on the wire: ``GET /api/v1/system/spools``, the ``spoolHolds``
field of ``GET /health``, and the release's answer (docs/behaviour.md §5.8)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from broker.core.times import iso_milli
from broker.service.spools import Holds, Release, SpoolHold


def _hold(h: SpoolHold) -> dict:
    return {"spool": h.spool, "partitions": h.partitions,
            "oldestAcceptedAt": iso_milli(dt.datetime.fromtimestamp(h.oldest_accept_us / 1e6,
                                                                    dt.UTC)),
            "lastHeartbeat": iso_milli(h.last_heartbeat),
            # seconds since the last heartbeat (PostgreSQL's clock); null: it never beat
            "silentSeconds": None if h.silent_seconds is None else round(h.silent_seconds, 3),
            "silent": h.silent}


def holds_answer(holds: Holds, ended: Mapping[str, int]) -> dict:
    """Every spool holding partitions; silent ones (no heartbeat for ``boundMs``) no longer
    hold back a broker that has beaten that long. ``ended``: this broker's counts of holds
    removed (expired: by the retention job; released: by an operator)."""
    return {"boundMs": holds.wait_ms, "forgetMs": holds.forget_ms,
            "silentSpools": len(holds.silent_spools),
            "silentHeldPartitions": holds.silent_partitions,
            "spools": [_hold(h) for h in holds.spools],
            "ended": {"expired": ended.get("expired", 0), "released": ended.get("released", 0)}}


def release_answer(spool: str, result: Release, forced: bool) -> dict:
    return {"spool": spool, "released": True, "partitions": result.partitions,
            "lastHeartbeat": iso_milli(result.last_heartbeat), "forced": forced}
