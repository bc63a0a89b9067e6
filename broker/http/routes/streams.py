"""The /streams/v1 routes the official clients' streaming SDK runs on: register a query,
commit a cycle, read state; plus list and delete queries for operators. Parsing and
shaping only; the work is in broker/service/streams.py."""
from __future__ import annotations

from typing import Any

from sanic import Blueprint

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import iso_milli
from broker.core.validate import Invalid, check_name, check_text, payload_json
from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.ack import parse_ack_item, parse_group
from broker.http.wire.common import body_object
from broker.http.wire.push import check_item_count, parse_push_item
from broker.service import streams as service
from broker.service.push import checked_producer_sub
from broker.store.streams import StateOp, StateRead

bp = Blueprint("streams")

STATE_KEY_MAX_BYTES = 1024
"""Longest state key (UTF-8 bytes): keys are a unique index's entries."""
STATE_VALUE_MAX_BYTES = 1024 * 1024
"""Largest state value (its JSON text, UTF-8 bytes)."""
MAX_STATE_OPS = 10_000
"""Most state ops one cycle may carry."""
MAX_STATE_KEYS = 10_000
"""Most keys one state read may name."""
CYCLE_ACK_STATUSES = ("completed", "success", "failed", "dlq")


def _uuid(body: Any, name: str) -> str:
    value = body.get(name)
    if value is None or value == "":
        raise BadRequest(f"{name} is required")
    if not is_uuid(value):
        raise BadRequest(f"{name} must be a UUID, got {value!r}"[:200])
    return value


def _bool(body: Any, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value


def _list(body: Any, name: str, limit: int) -> list:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{name} must be an array")
    if len(value) > limit:
        raise BadRequest(f"{name} holds {len(value)} entries; at most {limit} are accepted")
    return value


def _name(value: Any, where: str) -> str:
    try:
        check_name(value, where)
    except Invalid as exc:
        raise BadRequest(str(exc)) from None
    return value


def _key(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where} must be a non-empty string")
    try:
        check_text(value, where)
    except Invalid as exc:
        raise BadRequest(str(exc)) from None
    if len(value.encode("utf-8", "surrogatepass")) > STATE_KEY_MAX_BYTES:
        raise BadRequest(f"{where} is longer than {STATE_KEY_MAX_BYTES} bytes")
    return value


# -- queries ------------------------------------------------------------------

@bp.post("/streams/v1/queries")
async def register_query(request: BrokerRequest):
    body = body_object(read_json(request))
    name = _name(body.get("name"), "name")
    source = _name(body.get("source_queue"), "source_queue")
    sink = body.get("sink_queue")
    sink = None if sink in (None, "") else _name(sink, "sink_queue")
    config_hash = _name(body.get("config_hash"), "config_hash")
    reset = _bool(body, "reset", False)
    row = await service.register_query(request.app.ctx, name, source, sink, config_hash, reset)
    if row["conflict"]:
        return json({"success": False, "query_id": str(row["query_id"]), "name": name,
                     "error": f"config_hash mismatch for query {name!r}: it was registered "
                              f"with {row['existing_hash']!r}, this request has "
                              f"{config_hash!r}; pass reset: true to delete its state and "
                              "take the new config"}, status=409)
    return json({"success": True, "query_id": str(row["query_id"]), "name": row["name"],
                 "config_hash": row["config_hash"], "fresh": row["fresh"],
                 "reset": row["did_reset"]})


@bp.get("/streams/v1/queries")
async def list_queries(request: BrokerRequest):
    rows = await service.list_queries(request.app.ctx)
    return json({"queries": [
        {"query_id": str(r["id"]), "name": r["name"], "source_queue": r["source_queue"],
         "sink_queue": r["sink_queue"], "config_hash": r["config_hash"],
         "created_at": iso_milli(r["created_at"]), "updated_at": iso_milli(r["updated_at"]),
         "state": {"rows": r["state_rows"], "bytes": r["state_bytes"],
                   "partitions": r["state_partitions"],
                   "last_update": iso_milli(r["last_state_at"])}}
        for r in rows]})


@bp.delete("/streams/v1/queries/<name:str>", unquote=True)
async def delete_query(request: BrokerRequest, name: str):
    gone = await service.delete_query(request.app.ctx, name)
    if gone is None:
        return json({"success": False, "error": f"no query named {name!r}"}, status=404)
    return json({"success": True, "query_id": gone, "name": name, "deleted": True})


# -- cycle --------------------------------------------------------------------

def _state_ops(body: Any) -> list[StateOp]:
    ops = []
    for n, op in enumerate(_list(body, "state_ops", MAX_STATE_OPS)):
        where = f"state_ops[{n}]"
        if not isinstance(op, dict):
            raise BadRequest(f"{where} must be an object")
        kind = op.get("type")
        key = _key(op.get("key"), f"{where}.key")
        if kind == "delete":
            ops.append(StateOp("delete", key, None))
        elif kind == "upsert":
            try:
                text = payload_json(op.get("value", {}), f"{where}.value")
            except Invalid as exc:
                raise BadRequest(str(exc)) from None
            if len(text.encode("utf-8")) > STATE_VALUE_MAX_BYTES:
                raise BadRequest(f"{where}.value is larger than {STATE_VALUE_MAX_BYTES} bytes "
                                 "as JSON")
            ops.append(StateOp("upsert", key, text))
        else:
            raise BadRequest(f"{where}.type must be 'upsert' or 'delete', got {kind!r}"[:200])
    return ops


def parse_cycle(body: Any, max_items: int) -> service.CycleRequest:
    body = body_object(body)
    query_id = _uuid(body, "query_id")
    partition_id = _uuid(body, "partition_id")
    group = parse_group(body.get("consumer_group"))
    ops = _state_ops(body)
    items = body.get("push_items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadRequest("push_items must be an array")
    check_item_count(len(items), max_items)
    pushes = [parse_push_item(it, n, default_payload={}) for n, it in enumerate(items)]
    ack = body.get("ack")
    ack_row = None
    if ack is not None:
        if not isinstance(ack, dict):
            raise BadRequest("ack must be an object or null")
        status = ack.get("status") or "completed"
        if status not in CYCLE_ACK_STATUSES:
            raise BadRequest(f"ack.status must be one of {', '.join(CYCLE_ACK_STATUSES)}, "
                             f"got {status!r}"[:200])
        ack_row = parse_ack_item({**ack, "status": status, "partitionId": partition_id},
                                 group, batch=False)
    return service.CycleRequest(query_id, partition_id, group, ops, pushes, ack_row,
                                _bool(body, "release_lease", True))


@bp.post("/streams/v1/cycle")
async def cycle(request: BrokerRequest):
    ctx = request.app.ctx
    req = parse_cycle(read_json(request), ctx.settings.push_max_items_per_request)
    head = {"query_id": req.query_id, "partition_id": req.partition_id}
    try:
        out = await service.cycle(ctx, req, checked_producer_sub(
            getattr(request.ctx, "producer_sub", None)))
    except service.UnknownTarget as exc:
        return json({"success": False, **head, "error": exc.reason}, status=404)
    if out.error is not None:
        # Rolled back (the ack's lease or message): answered in-band, as the SDK expects.
        return json({"success": False, **head, "state_ops_applied": 0, "push_results": [],
                     "ack_result": None, "error": out.error})
    return json({"success": True, **head, "already_committed": out.replayed,
                 "state_ops_applied": out.applied,
                 "push_results": [{"queueName": item.queue, "partition": item.partition,
                                   "messageId": str(r["message_id"]),
                                   "transactionId": item.transaction_id,
                                   "status": r["status"]} for item, r in out.pushed],
                 "ack_result": out.ack})


# -- state --------------------------------------------------------------------

def parse_state_get(body: Any) -> StateRead:
    body = body_object(body)
    keys = tuple(_key(k, f"keys[{n}]")
                 for n, k in enumerate(_list(body, "keys", MAX_STATE_KEYS)))
    prefix = body.get("key_prefix")
    if prefix == "":
        prefix = None
    if prefix is not None:
        prefix = _key(prefix, "key_prefix")
    ripe = body.get("ripe_at_or_before")
    if ripe is not None and (isinstance(ripe, bool) or not isinstance(ripe, int)
                             or not -2**63 <= ripe < 2**63):
        raise BadRequest("ripe_at_or_before must be an integer (epoch milliseconds)")
    return StateRead(_uuid(body, "query_id"), _uuid(body, "partition_id"), keys, prefix, ripe)


@bp.post("/streams/v1/state/get")
async def state_get(request: BrokerRequest):
    rows = await service.read_state(request.app.ctx, parse_state_get(read_json(request)))
    return json({"success": True, "rows": [
        {"key": r["key"], "value": r["value"], "updated_at": iso_milli(r["updated_at"])}
        for r in rows]})
