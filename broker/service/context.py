"""The application context, typed: Sanic's ``app.ctx`` is an instance of this (of its
HTTP subclass, broker.http.types.HttpContext).

Fields set when the app is built are filled at once; the rest while the server starts
(broker/wiring.py, called by ``broker.http.app``'s ``before_server_start``), before any
request is served, so handlers and services may rely on every field being set.

The actors are reached through their proxies, typed with the views of
:mod:`actors.proxies`: each view is made of the actor's own methods, so what a service
calls on an actor is checked against the actor's one declaration of it. What only the
HTTP layer uses (the authenticator) is on its subclass, broker.http.types.HttpContext.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx
    from pykka import ActorRef

    from actors.ephemeral import EphemeralQueues
    from actors.hints import Hints
    from actors.mesh import Mesh
    from actors.pop_waiters import PopWaiterRegistry
    from actors.proxies import (
        BatcherProxy,
        HotListProxy,
        JobProxy,
        LiveSeriesProxy,
        PopWaitersProxy,
        SpoolProxy,
        StagingMergerProxy,
        TimerSweeperProxy,
    )
    from actors.reconciler import CacheReconciler, MaintenanceFlags, QueueConfigCache
    from actors.spool import SpoolBacklog
    from broker.core.config import Settings
    from broker.core.crypto import PayloadCipher
    from broker.core.loop_lag import LoopMonitor
    from broker.core.telemetry import Telemetry
    from broker.service.migration import Migration
    from broker.store.db import Store


@dataclass
class BrokerContext:
    # set when the app is built
    settings: Settings
    cipher: PayloadCipher | None
    telemetry: Telemetry
    # set while the server starts (None until then, typed as set: see the module docstring)
    store: Store = None  # type: ignore[assignment]
    # PopWaiterRegistry: its ref (long_poll parks on it), and its proxy for everything else
    waiters: ActorRef[PopWaiterRegistry] = None  # type: ignore[assignment]
    waiters_proxy: PopWaitersProxy = None  # type: ignore[assignment]
    queue_cache: QueueConfigCache = None  # type: ignore[assignment]
    flags: MaintenanceFlags = None  # type: ignore[assignment]
    reconciler: ActorRef[CacheReconciler] = None  # type: ignore[assignment]
    hotlist: HotListProxy | None = None  # None with QUEEN_HOTLIST=false
    hints: Hints = None  # type: ignore[assignment]
    mesh: Mesh | None = None  # None without peers
    # passes an ephemeral queue's requests on to its owner (broker/http/forward.py)
    forward_client: httpx.AsyncClient | None = None  # with a mesh only (wiring.start_forwarding)
    spool: SpoolProxy = None  # type: ignore[assignment]
    # merges queen.staged into the queues
    merger: StagingMergerProxy = None  # type: ignore[assignment]
    spool_backlog: SpoolBacklog = None  # type: ignore[assignment]
    # Batchers folding pushes, acks and /streams/v1/state/get reads
    push_batcher: BatcherProxy = None  # type: ignore[assignment]
    ack_batcher: BatcherProxy = None  # type: ignore[assignment]
    streams_state_batcher: BatcherProxy = None  # type: ignore[assignment]
    # the leader jobs by name: retention, stats, metrics
    jobs: dict[str, JobProxy] = field(default_factory=dict)
    timer_sweeper: TimerSweeperProxy | None = None  # delivers due timers
    migration: Migration = None  # type: ignore[assignment]  # this process's copy state
    live: LiveSeriesProxy = None  # type: ignore[assignment]  # throughput, depth history
    # this broker's ephemeral queues, owned by the EphemeralKeeper actor (its methods never
    # await: the data path calls them directly, actors/ephemeral/__init__.py)
    ephemeral: EphemeralQueues = None  # type: ignore[assignment]
    loop_monitor: LoopMonitor = None  # type: ignore[assignment]  # the loop's lag (liveness)
    stopping: bool = False  # set when the server starts its stop: not ready from then on
