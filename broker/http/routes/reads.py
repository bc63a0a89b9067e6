"""Offset reads and partition discovery: ``POST /api/v1/fetch`` and
``POST /api/v1/partitions/changed`` (reads: READ_ONLY when JWT is on)."""
from __future__ import annotations

from sanic import Blueprint, Request

from broker.http.responses import json, read_json
from broker.http.wire.state import parse_changed, parse_fetch
from broker.service import reads as service

bp = Blueprint("reads")


@bp.post("/api/v1/fetch")
async def fetch(request: Request):
    entries, call_budget = parse_fetch(read_json(request))
    return json({"entries": await service.fetch(request.app.ctx, entries, call_budget)})


@bp.post("/api/v1/partitions/changed")
async def changed(request: Request):
    queries = parse_changed(read_json(request))
    safe: list[str] = []
    answers = []
    for query in queries:
        safe_time, answer = await service.changed(request.app.ctx, query)
        if safe_time is not None:
            safe.append(safe_time)
        answers.append(answer)
    # The earliest page's safe time holds for every later page of this call.
    return json({"entries": answers, "safeTime": min(safe) if safe else None})
