"""Configure, queue resources, dead letters and health (docs/wire-contract.md §9, §10,
§12, §15.1)."""
from __future__ import annotations

from loguru import logger
from sanic import Blueprint

import broker
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.telemetry import telemetry
from broker.core.times import parse_timestamp
from broker.http.responses import args, error, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire import ephemeral as ephemeral_wire
from broker.http.wire.common import q_int, q_str
from broker.http.wire.dlq import dlq_page, retry_answer
from broker.http.wire.health import (
    health_answer,
    live_answer,
    long_poll_figures,
    ready_answer,
    shared_state_answer,
)
from broker.http.wire.queues import (
    configure_answer,
    ignored_options,
    parse_configure,
    queue_detail,
    queue_summary,
)
from broker.http.wire.spools import holds_answer
from broker.service import ephemeral as ephemeral_service
from broker.service import health as health_service
from broker.service import queues as service
from broker.service import spools as spools_service
from broker.service.drain import spool_stats
from broker.service.gauges import cluster_view
from broker.service.system import database_state

bp = Blueprint("admin")


@bp.post("/api/v1/configure")
async def configure(request: BrokerRequest):
    req = parse_configure(read_json(request))
    app = request.app
    row = await service.configure(app.ctx, req.queue, req.namespace, req.task, req.options)
    # No silent option: what is accepted but not acted on is answered and logged, once.
    ignored = ignored_options(req, row, encryption_key=app.ctx.cipher is not None)
    if ignored:
        logger.warning("configure {}: ignored {}", req.queue, "; ".join(ignored.values()))
    elif row["encryption_enabled"] and app.ctx.cipher is None:
        logger.warning("queue {} has encryptionEnabled but QUEEN_ENCRYPTION_KEY is not set: "
                       "its payloads are stored in clear", req.queue)
    return json(configure_answer(row, req, ignored))


# -- queues -----------------------------------------------------------------

@bp.get("/api/v1/resources/queues")
async def list_queues(request: BrokerRequest):
    rows = await service.listing(request.app.ctx)
    return json({"queues": [queue_summary(r) for r in rows]})


@bp.get("/api/v1/resources/queues/<queue:str>", unquote=True)
async def get_queue(request: BrokerRequest, queue: str):
    q, partitions = await service.detail(request.app.ctx, queue)
    if q is None:
        return error("Queue not found", 404)
    return json(queue_detail(q, partitions))


@bp.delete("/api/v1/resources/queues/<queue:str>", unquote=True)
async def delete_queue(request: BrokerRequest, queue: str):
    existed = await service.delete(request.app.ctx, queue)
    return json({"deleted": True, "queue": queue, "existed": existed})


# -- dead letters -----------------------------------------------------------

@bp.get("/api/v1/dlq")
async def dlq(request: BrokerRequest):
    a = args(request)
    since = q_str(a, "from")
    until = q_str(a, "to")
    limit = min(q_int(a, "limit", 100, minimum=1), 1000)
    offset = q_int(a, "offset", 0, minimum=0)
    page = await service.dead_letters(
        request.app.ctx, queue=q_str(a, "queue"), partition=q_str(a, "partition"),
        group=q_str(a, "consumerGroup"),
        since=parse_timestamp(since, "from") if since else None,
        until=parse_timestamp(until, "to") if until else None,
        limit=limit, offset=offset)
    return json(dlq_page(page.rows, page.payloads, page.total, limit, offset))


@bp.post("/api/v1/messages/<partition_id:str>/<transaction_id:str>/retry", unquote=True)
async def retry_dead_letter(request: BrokerRequest, partition_id: str, transaction_id: str):
    """Re-enqueue a dead-lettered message: its DLQ rows go, and a copy with a derived
    transactionId is pushed to the same partition (every group sees the copy; the
    original stays where it is, so no cursor moves backwards)."""
    if not is_uuid(partition_id):
        raise BadRequest(f"partitionId must be a UUID, got {partition_id!r}")
    retried = await service.retry_dead_letter(request.app.ctx, partition_id, transaction_id)
    if retried is None:
        return error("Message not found in the dead-letter queue", 404)
    return json(retry_answer(transaction_id, retried.dead, retried.copy_transaction_id,
                             retried.pushed))


# -- health -----------------------------------------------------------------

@bp.get("/health")
async def health(request: BrokerRequest):
    app = request.app
    settings = app.ctx.settings
    ok, server = await database_state(app.ctx)
    body = health_answer(ok, settings, server, broker.__version__, await shared_state(app),
                         await spool_stats(app.ctx))
    body["ephemeral"] = ephemeral_wire.health_figures(ephemeral_service.figures(app.ctx))
    # The cluster's spool holds (PostgreSQL's, like clusterBacklog); null while it is away.
    holds = await spools_service.holds_or_none(app.ctx) if ok else None
    body["spoolHolds"] = (None if holds is None
                          else holds_answer(holds, telemetry.spool_holds_ended))
    return json(body, status=200 if ok else 503)


@bp.get("/health/live")
async def health_live(request: BrokerRequest):
    """Liveness, for a process supervisor: the event loop is not stuck (no PostgreSQL)."""
    body, status = live_answer(health_service.liveness(request.app.ctx))
    return json(body, status=status)


@bp.get("/health/ready")
async def health_ready(request: BrokerRequest):
    """Readiness, for a load balancer: PostgreSQL or the spool takes pushes; not stopping."""
    body, status = ready_answer(await health_service.readiness(request.app.ctx))
    return json(body, status=status)


async def shared_state(app) -> dict:
    """The cluster view of this broker (docs/behaviour.md §3.6): mesh stats under
    ``transport``, the config cache, peer liveness and the maintenance flags."""
    view = await cluster_view(app.ctx)
    long_polls = long_poll_figures(view.wake_stats, telemetry.pops)
    return shared_state_answer(app.ctx.settings, view.transport is not None, view.transport,
                               view.cache, app.ctx.flags.push, app.ctx.flags.pop, view.parked,
                               long_polls, view.hot_list)


@bp.get("/api/v1/system/shared-state")
async def shared_state_route(request: BrokerRequest):
    return json(await shared_state(request.app))
