"""Health on the wire (docs/wire-contract.md §15.1): ``GET /health`` and the cluster view of
this broker it carries (also ``GET /api/v1/system/shared-state``; docs/behaviour.md §3.6),
and the machines' ``GET /health/live`` and ``GET /health/ready``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.core.config import Settings
from broker.service.health import Liveness, Readiness


def health_answer(ok: bool, settings: Settings, database_server: dict, broker_version: str,
                  shared_state: dict, spool: dict) -> dict:
    return {
        "status": "healthy" if ok else "unhealthy",
        "database": "connected" if ok else "disconnected",
        # Which PG_HOST server is in use (it moves after a failover), as last seen.
        "databaseServer": database_server,
        "server": settings.queen_server_id,
        "worker_id": settings.worker_id,
        # The reference server answers a constant "1.0.0" here, and Queen's dashboard shows
        # this field as the broker's version ("Broker 1.0.0"): this broker's own release is
        # the true answer. ``brokerVersion`` carries the same value (older dashboards and
        # scripts of this broker read it). No client reads either to decide anything.
        "version": broker_version,
        "brokerVersion": broker_version,
        "shared_state": shared_state,
        "spool": spool,
        "queen": {"worker_id": settings.worker_id, "status": "active"},
    }


def shared_state_answer(settings: Settings, running: bool, transport: dict | None,
                        queue_config_cache: dict, maintenance: bool, pop_maintenance: bool,
                        parked_pops: int, long_polls: dict,
                        hot_list: dict | None = None) -> dict:
    """``running``: this broker has a mesh; its stats under ``transport``. Then the config
    cache, peer liveness and the maintenance flags; ``hot_list``: what the hot-list's rings
    hold (None with QUEEN_HOTLIST=false)."""
    return {
        "enabled": settings.queen_sync_enabled,
        "running": running,
        "server_id": settings.queen_server_id,
        "transport": transport,
        "queue_config_cache": queue_config_cache,
        "server_health": {
            "servers_tracked": (transport["servers_alive"] + transport["servers_dead"]) if transport else 0,
            "servers_alive": transport["servers_alive"] if transport else 0,
            "servers_dead": transport["servers_dead"] if transport else 0,
        },
        "maintenance_mode": maintenance,
        "pop_maintenance_mode": pop_maintenance,
        "parkedPops": parked_pops,
        "longPolls": long_polls,
        "hotList": hot_list,
    }


def long_poll_figures(wakes: Mapping[str, int], pops: Mapping[str, Any]) -> dict:
    """How much work parked pops cost: claims issued, timer re-checks and how many
    of them another pop's check answered, pops woken by commits."""
    return {"parked": wakes["parked"], "cohorts": wakes["cohorts"],
            "claimQueries": pops["claim_queries"], "attempts": pops["attempts"],
            "timerRechecks": pops["timer_rechecks"], "sharedRechecks": pops["shared_rechecks"],
            "woken": wakes["woken"], "wakesPassedOn": wakes["passed_on"]}


def live_answer(live: Liveness) -> tuple[dict, int]:
    """``GET /health/live``: 200 live, 503 when the event loop was stuck."""
    body: dict[str, Any] = {"status": "live" if live.live else "stuck",
                            "loopLagMs": live.lag_ms, "maxLoopLagMs": live.max_lag_ms}
    return body, 200 if live.live else 503


def ready_answer(ready: Readiness) -> tuple[dict, int]:
    """``GET /health/ready``: 200 ready, 503 with the reason (stopping, spool_full,
    spool_failing)."""
    body: dict[str, Any] = {"status": "ready" if ready.ready else "unready",
                            "database": ready.database}
    if not ready.ready:
        body["reason"] = ready.reason
    if ready.spool:
        body["spool"] = ready.spool
    return body, 200 if ready.ready else 503
