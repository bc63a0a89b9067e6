"""Statistics refresh and the background jobs' figures (docs/wire-contract.md §11.9,
docs/behaviour.md §7).

* ``POST /api/v1/stats/refresh`` forces a stats cycle on this broker now (body
  optional; ``{"full": true}`` recounts every partition). Another replica
  holding lock 737002 makes it a skip: ``{"success": true, "skipped": true}``.
* ``GET /api/v1/system/jobs`` each job's counters (cycles run / skipped /
  failed, last result), as its actor reports them.
* ``POST /api/v1/system/jobs/<name>/run`` runs one cycle of a job now
  (``retention`` | ``stats`` | ``metrics``) and answers its result.

The jobs are reached through ``app.ctx.jobs`` (proxies from actors.leader_jobs).
"""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import error, json, read_json
from broker.http.types import BrokerRequest

bp = Blueprint("ops_stats")


@bp.post("/api/v1/stats/refresh")
async def refresh_stats(request: BrokerRequest):
    body = read_json(request)
    full = bool(body.get("full")) if isinstance(body, dict) else False
    job = request.app.ctx.jobs.get("stats")
    if job is None:
        return error("stats job not running", 503)
    result = await job.run_once(full=full)
    if "error" in result:
        return json({"success": False, "skipped": False, "error": result["error"],
                     "durationMs": result["durationMs"]}, status=500)
    return json({"success": True, "skipped": bool(result.get("skipped")),
                 "durationMs": result["durationMs"]})


@bp.get("/api/v1/system/jobs")
async def jobs_stats(request: BrokerRequest):
    return json({name: await job.stats() for name, job in request.app.ctx.jobs.items()})


@bp.post("/api/v1/system/jobs/<name:str>/run")
async def run_job(request: BrokerRequest, name: str):
    job = request.app.ctx.jobs.get(name)
    if job is None:
        return error(f"no such job: {name}", 404)
    return json(await job.run_once())
