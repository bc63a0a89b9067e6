"""The spool's quarantine, for operators: spooled pushes the replay could not
commit (each set aside alone, its neighbours committed), to list, look at,
replay (after fixing what was wrong) or discard. Admin role under JWT.

    GET    /api/v1/system/spool/quarantine              entries without payloads
    GET    /api/v1/system/spool/quarantine/{id}         one entry, with its event
    POST   /api/v1/system/spool/quarantine/{id}/replay  push it now; body may override
                                                        {"queue", "partition"}
    DELETE /api/v1/system/spool/quarantine/{id}         discard it

The quarantine is node-local, like the spool: ask the broker that holds it.
"""
from __future__ import annotations

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.http.responses import error, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.common import body_object
from broker.service import quarantine as service

bp = Blueprint("quarantine")

PREFIX = "/api/v1/system/spool/quarantine"


@bp.get(PREFIX)
async def list_quarantine(request: BrokerRequest):
    entries = await service.entries(request.app.ctx)
    return json({"count": len(entries), "entries": entries})


@bp.get(PREFIX + "/<ident>")
async def get_entry(request: BrokerRequest, ident: str):
    entry = await service.entry(request.app.ctx, ident)
    if entry is None:
        return error(f"no quarantined event {ident}", 404)
    return json(entry)


@bp.post(PREFIX + "/<ident>/replay")
async def replay_entry(request: BrokerRequest, ident: str):
    overrides = body_object(read_json(request))
    for key in ("queue", "partition"):
        if key in overrides and not isinstance(overrides[key], str):
            raise BadRequest(f"{key} must be a string")
    try:
        result = await service.replay(
            request.app.ctx, ident,
            {k: overrides[k] for k in ("queue", "partition") if k in overrides})
    except LookupError:
        return error(f"no quarantined event {ident}", 404)
    except service.ReplayRefused as exc:  # kept in the quarantine
        return error(f"cannot replay {ident}: {exc}", 409)
    return json(result)


@bp.delete(PREFIX + "/<ident>")
async def discard_entry(request: BrokerRequest, ident: str):
    if not await service.discard(request.app.ctx, ident):
        return error(f"no quarantined event {ident}", 404)
    return json({"id": ident, "discarded": True})
