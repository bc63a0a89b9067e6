"""Maintenance modes (docs/behaviour.md §4.2, docs/wire-contract.md §15.4): the flags'
work is broker/service/system.py's. A flip that cannot be persisted answers 503 and
changes nothing.
"""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.common import body_object
from broker.service.drain import spool_stats
from broker.service.gauges import cluster_backlog
from broker.service.system import flip, refresh_flags

bp = Blueprint("system")

def _enabled(request: BrokerRequest) -> bool:
    enabled = body_object(read_json(request)).get("enabled")
    if not isinstance(enabled, bool):
        raise BadRequest("enabled (boolean) is required")
    return enabled


async def _buffer(app) -> dict:
    stats = await spool_stats(app.ctx)
    failed = stats["failedFiles"]
    return {
        "bufferedMessages": stats["pendingCount"],
        "bufferHealthy": stats["healthy"],
        "quarantinedEvents": stats["quarantinedEvents"],
        "orderExceptions": stats["orderExceptions"],
        # the drain through PostgreSQL: staged pushes not merged yet, the merge rate
        # here, and the expected time to empty at that rate (null: not merging here)
        "staging": {k: stats["staging"][k] for k in ("stagedEvents", "stagedPartitions",
                                                      "mergeRatePerSecond", "etaSeconds",
                                                      "draining", "lastDrain")},
        "bufferStats": {"pendingCount": stats["pendingCount"], "failedCount": stats["failedCount"],
                        "dbHealthy": stats["dbHealthy"],
                        "pendingBytes": stats["pendingBytes"], "maxBytes": stats["maxBytes"],
                        "rejectedFull": stats["rejectedFull"],
                        "quarantinedEvents": stats["quarantinedEvents"],
                        "failedFiles": {**failed, "failoverCount": failed["count"],
                                        "qos0Count": 0}},
    }


@bp.get("/api/v1/system/maintenance")
async def get_maintenance(request: BrokerRequest):
    app = request.app
    await refresh_flags(app.ctx)
    return json({"maintenanceMode": app.ctx.flags.push, "popMaintenanceMode": app.ctx.flags.pop,
                 **await _buffer(app), "clusterBacklog": await cluster_backlog(app.ctx)})


@bp.post("/api/v1/system/maintenance")
async def set_maintenance(request: BrokerRequest):
    enabled = _enabled(request)
    app = request.app
    await flip(app.ctx, "push", enabled)
    buffer = await _buffer(app)
    return json({"maintenanceMode": enabled, "bufferedMessages": buffer["bufferedMessages"],
                 "bufferHealthy": buffer["bufferHealthy"],
                 "message": "Maintenance mode ENABLED. All PUSHes routing to file buffer."
                 if enabled else
                 "Maintenance mode DISABLED. Background processor will drain buffer to DB."})


@bp.get("/api/v1/system/maintenance/pop")
async def get_pop_maintenance(request: BrokerRequest):
    app = request.app
    await refresh_flags(app.ctx)
    on = app.ctx.flags.pop
    return json({"popMaintenanceMode": on,
                 "message": "Pop maintenance mode is ON. All POP operations return empty arrays."
                 if on else "Pop maintenance mode is OFF. Normal operation."})


@bp.post("/api/v1/system/maintenance/pop")
async def set_pop_maintenance(request: BrokerRequest):
    enabled = _enabled(request)
    await flip(request.app.ctx, "pop", enabled)
    return json({"popMaintenanceMode": enabled,
                 "message": "Pop maintenance mode ENABLED. All POP operations will return empty arrays."
                 if enabled else "Pop maintenance mode DISABLED. Normal operation resumed."})
