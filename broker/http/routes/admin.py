"""Configure, queue resources, dead letters and health (docs/wire-contract.md §9, §10,
§12, §15.1)."""
from __future__ import annotations

from loguru import logger
from sanic import Blueprint

import broker
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid, new_uuid7
from broker.core.telemetry import telemetry
from broker.core.times import parse_timestamp
from broker.http.responses import args, error, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire import ephemeral as ephemeral_wire
from broker.http.wire.common import q_int, q_str
from broker.http.wire.dlq import dlq_page, retry_answer
from broker.http.wire.health import health_answer, long_poll_figures, shared_state_answer
from broker.http.wire.queues import (
    configure_answer,
    ignored_options,
    parse_configure,
    queue_detail,
    queue_summary,
)
from broker.http.wire.spools import holds_answer
from broker.service import ephemeral as ephemeral_service
from broker.service import spools as spools_service
from broker.service.drain import spool_stats
from broker.service.push import wake_after_commit
from broker.store.schema import schema_version

bp = Blueprint("admin")


@bp.post("/api/v1/configure")
async def configure(request: BrokerRequest):
    req = parse_configure(read_json(request))
    app = request.app
    row = await app.ctx.store.configure(req.queue, req.namespace, req.task, req.options)
    app.ctx.hints.queue_config_changed(req.queue, deleted=False)
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
    rows = await request.app.ctx.store.list_queues()
    return json({"queues": [queue_summary(r) for r in rows]})


@bp.get("/api/v1/resources/queues/<queue:str>", unquote=True)
async def get_queue(request: BrokerRequest, queue: str):
    q, partitions = await request.app.ctx.store.queue_detail(queue)
    if q is None:
        return error("Queue not found", 404)
    return json(queue_detail(q, partitions))


@bp.delete("/api/v1/resources/queues/<queue:str>", unquote=True)
async def delete_queue(request: BrokerRequest, queue: str):
    existed = await request.app.ctx.store.delete_queue(queue)
    request.app.ctx.hints.queue_config_changed(queue, deleted=True)
    return json({"deleted": True, "queue": queue, "existed": existed})


# -- dead letters -----------------------------------------------------------

@bp.get("/api/v1/dlq")
async def dlq(request: BrokerRequest):
    a = args(request)
    since = q_str(a, "from")
    until = q_str(a, "to")
    limit = min(q_int(a, "limit", 100, minimum=1), 1000)
    offset = q_int(a, "offset", 0, minimum=0)
    total, rows = await request.app.ctx.store.dlq(
        queue=q_str(a, "queue"), partition=q_str(a, "partition"),
        group=q_str(a, "consumerGroup"),
        since=parse_timestamp(since, "from") if since else None,
        until=parse_timestamp(until, "to") if until else None,
        limit=limit, offset=offset)
    cipher = request.app.ctx.cipher
    payloads = [cipher.decrypt(r["payload"]) if r["is_encrypted"] and cipher is not None
                else r["payload"] for r in rows]
    return json(dlq_page(rows, payloads, total, limit, offset))


@bp.post("/api/v1/messages/<partition_id:str>/<transaction_id:str>/retry", unquote=True)
async def retry_dead_letter(request: BrokerRequest, partition_id: str, transaction_id: str):
    """Re-enqueue a dead-lettered message: its DLQ rows go, and a copy with a derived
    transactionId is pushed to the same partition (every group sees the copy; the
    original stays where it is, so no cursor moves backwards)."""
    if not is_uuid(partition_id):
        raise BadRequest(f"partitionId must be a UUID, got {partition_id!r}")
    app = request.app
    copy_txid = f"{transaction_id}:retry:{new_uuid7()}"
    dead, pushed = await app.ctx.store.retry_dead_letter(partition_id, transaction_id,
                                                         new_uuid7(), copy_txid)
    if not dead or pushed is None:  # both or neither
        return error("Message not found in the dead-letter queue", 404)
    first = dead[0]
    wake_after_commit(app.ctx, {(first["queue"], first["partition"])})
    return json(retry_answer(transaction_id, dead, copy_txid, pushed))


# -- health -----------------------------------------------------------------

@bp.get("/health")
async def health(request: BrokerRequest):
    app = request.app
    settings = app.ctx.settings
    store = app.ctx.store
    ok = await store.ping()
    server = {"address": store.server.address, "readOnly": store.server.read_only,
              "schemaVersion": schema_version()}
    body = health_answer(ok, settings, server, broker.__version__, await shared_state(app),
                         await spool_stats(app.ctx))
    body["ephemeral"] = ephemeral_wire.health_figures(ephemeral_service.figures(app.ctx))
    # The cluster's spool holds (PostgreSQL's, like clusterBacklog); null while it is away.
    holds = await spools_service.holds_or_none(app.ctx) if ok else None
    body["spoolHolds"] = (None if holds is None
                          else holds_answer(holds, telemetry.spool_holds_ended))
    return json(body, status=200 if ok else 503)


async def shared_state(app) -> dict:
    """The cluster view of this broker (docs/behaviour.md §3.6): mesh stats under
    ``transport``, the config cache, peer liveness and the maintenance flags."""
    settings = app.ctx.settings
    mesh = app.ctx.mesh
    transport = mesh.stats() if mesh is not None else None
    if transport is not None:  # wakes received from peers, through the per-queue gate
        transport["received_wakes"] = app.ctx.hints.remote_wakes.stats()
    cache = app.ctx.queue_cache.stats()
    parked = await app.ctx.waiters_proxy.parked_count()
    long_polls = long_poll_figures(await app.ctx.waiters_proxy.wake_stats(), telemetry.pops)
    hot_list = await app.ctx.hotlist.stats() if app.ctx.hotlist is not None else None
    return shared_state_answer(settings, mesh is not None, transport, cache, app.ctx.flags.push,
                               app.ctx.flags.pop, parked, long_polls, hot_list)


@bp.get("/api/v1/system/shared-state")
async def shared_state_route(request: BrokerRequest):
    return json(await shared_state(request.app))
