"""Offset reads and partition discovery: ``POST /api/v1/fetch`` and
``POST /api/v1/partitions/changed`` (reads: READ_ONLY when JWT is on)."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.reads import changed_answer, fetch_answer, parse_changed, parse_fetch
from broker.service import reads as service

bp = Blueprint("reads")


@bp.post("/api/v1/fetch")
async def fetch(request: BrokerRequest):
    entries, call_budget = parse_fetch(read_json(request))
    return json(fetch_answer(await service.fetch(request.app.ctx, entries, call_budget)))


@bp.post("/api/v1/partitions/changed")
async def changed(request: BrokerRequest):
    queries = parse_changed(read_json(request))
    pages = [await service.changed(request.app.ctx, query) for query in queries]
    return json(changed_answer(pages))
