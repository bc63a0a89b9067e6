"""The operator's view of the streaming queries: GET /api/v1/status/streams (every query
with its state size and committed cycles) and GET /api/v1/status/streams/<name> (one query
and its source partitions). Shaping only; the figures come from broker/service/streams.py.

``state``: rows, stored bytes of the values (``pg_column_size``), partitions holding state,
the newest write. ``cycles``: committed cycles, the partitions that committed one, when the
newest committed (PostgreSQL's clock, written in the cycle's own transaction: every broker's
cycles count, replayed and rolled-back ones do not)."""
from __future__ import annotations

from typing import Any

from sanic import Blueprint

from broker.core.times import iso_milli
from broker.http.responses import args, error, json
from broker.http.types import BrokerRequest
from broker.http.wire.common import MAX_NAME, q_int
from broker.service import streams as service

bp = Blueprint("ops_streams")

MAX_PARTITIONS = 1000


def _query(r: Any) -> dict:
    return {"queryId": str(r["id"]), "name": r["name"], "sourceQueue": r["source_queue"],
            "sinkQueue": r["sink_queue"], "configHash": r["config_hash"],
            "createdAt": iso_milli(r["created_at"]), "updatedAt": iso_milli(r["updated_at"]),
            "state": {"rows": r["state_rows"], "bytes": r["state_bytes"],
                      "partitions": r["state_partitions"],
                      "lastUpdateAt": iso_milli(r["last_state_at"])},
            "cycles": {"committed": r["cycles"], "partitions": r["cycle_partitions"],
                       "lastCycleAt": iso_milli(r["last_cycle_at"])}}


@bp.get("/api/v1/status/streams")
async def streams_status(request: BrokerRequest):
    rows = await service.status(request.app.ctx)
    return json({"queries": [_query(r) for r in rows],
                 "totals": {"queries": len(rows),
                            "stateRows": sum(r["state_rows"] for r in rows),
                            "stateBytes": sum(r["state_bytes"] for r in rows),
                            "cycles": sum(r["cycles"] for r in rows)}})


@bp.get("/api/v1/status/streams/<name:str>", unquote=True)
async def stream_status(request: BrokerRequest, name: str):
    if len(name) > MAX_NAME:
        return error(f"name must be at most {MAX_NAME} characters", 400)
    limit = q_int(args(request), "limit", 100, minimum=1, maximum=MAX_PARTITIONS)
    found = await service.status_of(request.app.ctx, name, limit)
    if found is None:
        return error(f"no query named {name!r}", 404)
    query, parts = found
    return json({"query": _query(query), "partitions": [
        {"partitionId": str(p["partition_id"]), "queue": p["queue"], "partition": p["partition"],
         "state": {"rows": p["state_rows"], "bytes": p["state_bytes"],
                   "lastUpdateAt": iso_milli(p["last_state_at"])},
         "cycles": {"committed": p["cycles"], "lastCycleAt": iso_milli(p["last_cycle_at"])}}
        for p in parts]})
