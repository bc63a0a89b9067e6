"""What this broker sees right now (the dashboard's overview reads these; so can anyone):

* ``GET /api/v1/live/throughput?seconds=900``: messages pushed / popped / acknowledged
  through this broker per second, oldest first (kept in memory by actors/live_series.py);
* ``GET /api/v1/live/queues/{queue}/depth``: the queue's pending figure per depth sample
  (queen.stats as the stats job counted it), oldest first;
* ``GET /api/v1/live/cluster``: this broker and the cluster as it sees it: mesh peers,
  its spool (pending, quarantined) and the spools that hold partitions back, both
  maintenance flags, and the background jobs' last runs here.
"""
from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sanic import Blueprint

from broker.core.times import iso_milli
from broker.http.responses import args, json
from broker.http.types import BrokerRequest
from broker.http.wire.common import q_int
from broker.service import gauges, jobs
from broker.service.drain import spool_stats
from broker.service.gauges import cluster_backlog
from broker.service.system import THROUGHPUT_SECONDS, database_reachable

if TYPE_CHECKING:
    from broker.service.context import BrokerContext

bp = Blueprint("ops_live")


def _iso(seconds: float | None) -> str | None:
    return None if seconds is None else iso_milli(dt.datetime.fromtimestamp(seconds, dt.UTC))


@bp.get("/api/v1/live/throughput")
async def throughput(request: BrokerRequest):
    seconds = q_int(args(request), "seconds", THROUGHPUT_SECONDS, minimum=1,
                    maximum=THROUGHPUT_SECONDS)
    points = await gauges.throughput(request.app.ctx, seconds)
    totals = request.app.ctx.telemetry.throughput_totals()
    return json({
        "server": request.app.ctx.settings.queen_server_id,
        "intervalSeconds": 1,
        "seconds": seconds,
        # columns, not objects: 900 points stay small
        "t": [p[0] for p in points],
        "pushed": [p[1] for p in points],
        "popped": [p[2] for p in points],
        "acked": [p[3] for p in points],
        "sums": {"pushed": sum(p[1] for p in points), "popped": sum(p[2] for p in points),
                 "acked": sum(p[3] for p in points)},
        "sinceStart": totals,
    })


@bp.get("/api/v1/live/queues/<queue:str>/depth", unquote=True)
async def depth(request: BrokerRequest, queue: str):
    points, interval = await gauges.depth_history(request.app.ctx, queue)
    return json({"queue": queue, "intervalSeconds": interval,
                 "source": "queen.stats (stats job)",
                 "t": [round(t, 3) for t, _ in points], "pending": [d for _, d in points]})


async def _jobs(ctx: BrokerContext) -> list[dict]:
    out = []
    for name, s in (await jobs.stats(ctx)).items():
        last = s.get("lastResult") or {}
        out.append({"job": name, "intervalMs": s["intervalMs"], "cycles": s["cycles"],
                    "ran": s["ran"], "skipped": s["skipped"], "failures": s["failures"],
                    "lastStartedAt": _iso(s["lastStartedAt"]),
                    "lastDurationMs": s["lastDurationMs"],
                    "lastSkipped": bool(last.get("skipped")) if last else None,
                    "lastError": s["lastError"]})
    return out


@bp.get("/api/v1/live/cluster")
async def cluster(request: BrokerRequest):
    app = request.app
    settings = app.ctx.settings
    mesh = gauges.mesh_stats(app.ctx)
    spool = await spool_stats(app.ctx)
    return json({
        "server": settings.queen_server_id,
        "workerId": settings.worker_id,
        "database": "connected" if await database_reachable(app.ctx) else "disconnected",
        "maintenance": {"push": app.ctx.flags.push, "pop": app.ctx.flags.pop},
        "mesh": None if mesh is None else {
            "peers": mesh["peers"], "peerCount": mesh["peer_count"],
            "serversAlive": mesh["servers_alive"], "serversDead": mesh["servers_dead"],
            "auth": mesh["auth"], "tls": mesh["tls"]},
        "spool": {"pending": spool["pendingCount"], "quarantined": spool["quarantinedEvents"],
                  "pendingBytes": spool["pendingBytes"], "healthy": spool["healthy"]},
        "spoolBacklog": await cluster_backlog(app.ctx),
        "parkedPops": await gauges.parked_pops(app.ctx),
        "jobs": await _jobs(app.ctx),
    })
