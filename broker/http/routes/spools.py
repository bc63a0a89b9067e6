"""The cluster's spool holds, for operators (docs/behaviour.md §5.8). Admin role under JWT.

    GET  /api/v1/system/spools                       every spool holding partitions back
    POST /api/v1/system/spools/{spool}/release       delete that spool's holds and heartbeat
                                                     row; body {"force": true} for a spool
                                                     that beat within FILE_BUFFER_ORDER_WAIT_MS

Releasing a spool: its partitions are no longer held back by it. If its disk ever comes back,
its pushes land later, each counted as an order exception; nothing already in PostgreSQL
changes. Cluster-wide: any broker answers for every spool.
"""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.telemetry import telemetry
from broker.http.responses import error, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.common import body_object
from broker.http.wire.spools import holds_answer, release_answer
from broker.service import spools as spools_service

bp = Blueprint("spools")

PREFIX = "/api/v1/system/spools"


@bp.get(PREFIX)
async def list_spools(request: BrokerRequest):
    holds = await spools_service.holds(request.app.ctx)
    return json(holds_answer(holds, telemetry.spool_holds_ended))


@bp.post(PREFIX + "/<spool_id:str>/release", unquote=True)
async def release_spool(request: BrokerRequest, spool_id: str):
    body = body_object(read_json(request))
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise BadRequest("force must be a boolean")
    unknown = sorted(set(body) - {"force"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    try:
        result = await spools_service.release(request.app.ctx, spool_id, force)
    except spools_service.SpoolNotFound as exc:
        return error(str(exc), 404)
    except spools_service.SpoolRefused as exc:
        return error(str(exc), 409)
    return json(release_answer(spool_id, result, force))
