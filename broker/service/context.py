"""The application context, typed: Sanic's ``app.ctx`` is an instance of this.

Fields set when the app is built are filled at once; the rest while the
server starts (``broker.http.app``'s ``before_server_start``), before any request
is served, so handlers and services may rely on every field being set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.hints import Hints
    from actors.mesh import Mesh
    from actors.reconciler import MaintenanceFlags, QueueConfigCache
    from actors.spool import SpoolBacklog
    from broker.core.config import Settings
    from broker.core.crypto import PayloadCipher
    from broker.core.telemetry import Telemetry
    from broker.http.auth import Authenticator
    from broker.store.db import Store


@dataclass
class BrokerContext:
    # set when the app is built
    settings: Settings
    cipher: PayloadCipher | None
    auth: Authenticator
    telemetry: Telemetry
    # set while the server starts
    store: Store = None  # type: ignore[assignment]
    waiters: Any = None          # PopWaiterRegistry ref (long_poll parks on it)
    waiters_proxy: Any = None    # ... and its proxy, for everything else
    queue_cache: QueueConfigCache = None  # type: ignore[assignment]
    flags: MaintenanceFlags = None  # type: ignore[assignment]
    reconciler: Any = None       # CacheReconciler ref
    hotlist: Any | None = None   # HotListActor proxy; None with QUEEN_HOTLIST=false
    hints: Hints = None  # type: ignore[assignment]
    mesh: Mesh | None = None     # None without peers
    spool: Any = None            # Spool proxy
    merger: Any = None           # StagingMerger proxy (merges queen.staged into the queues)
    spool_backlog: SpoolBacklog = None  # type: ignore[assignment]
    push_batcher: Any = None     # Batcher proxy folding pushes
    ack_batcher: Any = None      # Batcher proxy folding acks
    streams_state_batcher: Any = None  # Batcher proxy folding /streams/v1/state/get reads
    jobs: Any = None             # leader jobs (retention, stats, metrics)
    timer_sweeper: Any = None    # TimerSweeper proxy (delivers due timers)
    migration: Any = None        # service.migration.Migration: this process's copy state
    live: Any = None             # LiveSeries proxy: per-second throughput, depth history
