"""Streams on the wire: the bodies of the /streams/v1 routes the official clients' streaming
SDK runs on (register a query, commit a cycle, read state) and their answers, snake_case as
the SDK reads them; and the operator's view of the queries (GET /api/v1/status/streams,
camelCase like every operator read).

A cycle's push items follow the rules of /api/v1/push (wire/push.py) and its ack those of
/api/v1/ack (wire/ack.py)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import iso_milli
from broker.core.validate import Invalid, check_name, check_text, payload_json
from broker.http.wire.ack import is_partition_handle, parse_ack_item, parse_group
from broker.http.wire.common import MAX_NAME, body_object, q_int
from broker.http.wire.push import check_item_count, parse_push_item
from broker.service.streams import (
    CycleAck,
    CycleOutcome,
    CycleRequest,
    QuerySpec,
    StateOp,
    StateRead,
)

STATE_KEY_MAX_BYTES = 1024
"""Longest state key (UTF-8 bytes): keys are a unique index's entries."""
STATE_VALUE_MAX_BYTES = 1024 * 1024
"""Largest state value (its JSON text, UTF-8 bytes)."""
MAX_STATE_OPS = 10_000
"""Most state ops one cycle may carry."""
MAX_STATE_KEYS = 10_000
"""Most keys one state read may name."""
CYCLE_ACK_STATUSES = ("completed", "success", "failed", "dlq")
STATUS_MAX_PARTITIONS = 1000
"""Most partitions the operator's view of one query lists."""


def _uuid(body: Mapping[str, Any], name: str, *, handle: bool = False) -> str:
    """A UUID field; ``handle``: a partition's, which may be its handle instead (the SDK
    keys cycles by the popped messages' partitionId, a handle after a framed pop)."""
    value = body.get(name)
    if value is None or value == "":
        raise BadRequest(f"{name} is required")
    if not is_uuid(value) and not (handle and isinstance(value, str)
                                   and is_partition_handle(value)):
        raise BadRequest(f"{name} must be a UUID, got {value!r}"[:200])
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value


def _list(body: Mapping[str, Any], name: str, limit: int) -> list:
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

def parse_register(body: Any) -> QuerySpec:
    """``POST /streams/v1/queries``: ``{name, source_queue, sink_queue?, config_hash,
    reset?}``."""
    body = body_object(body)
    name = _name(body.get("name"), "name")
    source = _name(body.get("source_queue"), "source_queue")
    sink = body.get("sink_queue")
    sink = None if sink in (None, "") else _name(sink, "sink_queue")
    config_hash = _name(body.get("config_hash"), "config_hash")
    return QuerySpec(name, source, sink, config_hash, _bool(body, "reset", False))


def register_answer(spec: QuerySpec, row: Mapping[str, Any]) -> tuple[dict, int]:
    """(body, status): the query registered (or found as it was), or a 409 when the name
    is registered with another config and no reset was asked."""
    if row["conflict"]:
        return {"success": False, "query_id": str(row["query_id"]), "name": spec.name,
                "error": f"config_hash mismatch for query {spec.name!r}: it was registered "
                         f"with {row['existing_hash']!r}, this request has "
                         f"{spec.config_hash!r}; pass reset: true to delete its state and "
                         "take the new config"}, 409
    return {"success": True, "query_id": str(row["query_id"]), "name": row["name"],
            "config_hash": row["config_hash"], "fresh": row["fresh"],
            "reset": row["did_reset"]}, 200


def queries_answer(rows: list[Any]) -> dict:
    """``GET /streams/v1/queries``: every query with its state size."""
    return {"queries": [
        {"query_id": str(r["id"]), "name": r["name"], "source_queue": r["source_queue"],
         "sink_queue": r["sink_queue"], "config_hash": r["config_hash"],
         "created_at": iso_milli(r["created_at"]), "updated_at": iso_milli(r["updated_at"]),
         "state": {"rows": r["state_rows"], "bytes": r["state_bytes"],
                   "partitions": r["state_partitions"],
                   "last_update": iso_milli(r["last_state_at"])}}
        for r in rows]}


def deleted_answer(name: str, query_id: str | None) -> tuple[dict, int]:
    """(body, status) of ``DELETE /streams/v1/queries/<name>``: 404 when there was none."""
    if query_id is None:
        return {"success": False, "error": f"no query named {name!r}"}, 404
    return {"success": True, "query_id": query_id, "name": name, "deleted": True}, 200


# -- cycle --------------------------------------------------------------------

def _state_ops(body: Mapping[str, Any]) -> list[StateOp]:
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


def parse_cycle(body: Any, max_items: int) -> CycleRequest:
    """``POST /streams/v1/cycle``: ``{query_id, partition_id, consumer_group, state_ops,
    push_items, ack, release_lease}``; ``max_items``: PUSH_MAX_ITEMS_PER_REQUEST."""
    body = body_object(body)
    query_id = _uuid(body, "query_id")
    partition_id = _uuid(body, "partition_id", handle=True)
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
                                 group, batch=False, handles=True)
    return CycleRequest(query_id, partition_id, group, ops, pushes, ack_row,
                        _bool(body, "release_lease", True))


def cycle_answer(req: CycleRequest, out: CycleOutcome) -> dict:
    """A committed (or already committed) cycle, or one rolled back: the ack's lease or
    message refused, answered in-band (200, ``success: false``) as the SDK expects."""
    head = {"query_id": req.query_id, "partition_id": req.partition_id}
    if out.error is not None:
        return {"success": False, **head, "state_ops_applied": 0, "push_results": [],
                "ack_result": None, "error": out.error}
    return {"success": True, **head, "already_committed": out.replayed,
            "state_ops_applied": out.applied,
            "push_results": [{"queueName": item.queue, "partition": item.partition,
                              "messageId": str(r["message_id"]),
                              "transactionId": item.transaction_id,
                              "status": r["status"]} for item, r in out.pushed],
            "ack_result": _ack(out.ack)}


def _ack(ack: CycleAck | None) -> dict | None:
    if ack is None:
        return None
    out = {"success": ack.success, "lease_released": ack.lease_released, "dlq": ack.dlq}
    if ack.already_acknowledged:
        out["already_acknowledged"] = True
    return out


def cycle_unknown_answer(req: CycleRequest, reason: str) -> dict:
    """The cycle named a query or a source partition that does not exist (a 404)."""
    return {"success": False, "query_id": req.query_id, "partition_id": req.partition_id,
            "error": reason}


# -- state --------------------------------------------------------------------

def parse_state_get(body: Any) -> StateRead:
    """``POST /streams/v1/state/get``: ``{query_id, partition_id, keys?, key_prefix?,
    ripe_at_or_before?}``."""
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
    return StateRead(_uuid(body, "query_id"), _uuid(body, "partition_id", handle=True), keys,
                     prefix, ripe)


def state_answer(rows: list[dict[str, Any]]) -> dict:
    return {"success": True, "rows": [
        {"key": r["key"], "value": r["value"], "updated_at": iso_milli(r["updated_at"])}
        for r in rows]}


# -- the operator's view ------------------------------------------------------
# ``state``: rows, stored bytes of the values (``pg_column_size``), partitions holding
# state, the newest write. ``cycles``: committed cycles, the partitions that committed one,
# when the newest committed (PostgreSQL's clock, written in the cycle's own transaction:
# every broker's cycles count, replayed and rolled-back ones do not).

def parse_status_of(name: str, args: Mapping[str, Any]) -> int:
    """``GET /api/v1/status/streams/<name>?limit=``: the name checked, the page size."""
    if len(name) > MAX_NAME:
        raise BadRequest(f"name must be at most {MAX_NAME} characters")
    return q_int(args, "limit", 100, minimum=1, maximum=STATUS_MAX_PARTITIONS)


def _query(r: Any) -> dict:
    return {"queryId": str(r["id"]), "name": r["name"], "sourceQueue": r["source_queue"],
            "sinkQueue": r["sink_queue"], "configHash": r["config_hash"],
            "createdAt": iso_milli(r["created_at"]), "updatedAt": iso_milli(r["updated_at"]),
            "state": {"rows": r["state_rows"], "bytes": r["state_bytes"],
                      "partitions": r["state_partitions"],
                      "lastUpdateAt": iso_milli(r["last_state_at"])},
            "cycles": {"committed": r["cycles"], "partitions": r["cycle_partitions"],
                       "lastCycleAt": iso_milli(r["last_cycle_at"])}}


def status_answer(rows: list[Any]) -> dict:
    """``GET /api/v1/status/streams``: every query, and the totals."""
    return {"queries": [_query(r) for r in rows],
            "totals": {"queries": len(rows),
                       "stateRows": sum(r["state_rows"] for r in rows),
                       "stateBytes": sum(r["state_bytes"] for r in rows),
                       "cycles": sum(r["cycles"] for r in rows)}}


def status_of_answer(query: Any, partitions: list[Any]) -> dict:
    """``GET /api/v1/status/streams/<name>``: the query and its source partitions."""
    return {"query": _query(query), "partitions": [
        {"partitionId": str(p["partition_id"]), "queue": p["queue"], "partition": p["partition"],
         "state": {"rows": p["state_rows"], "bytes": p["state_bytes"],
                   "lastUpdateAt": iso_milli(p["last_state_at"])},
         "cycles": {"committed": p["cycles"], "lastCycleAt": iso_milli(p["last_cycle_at"])}}
        for p in partitions]}


def no_such_query(name: str) -> dict:
    """The operator's view of a query that is not registered (a 404)."""
    return {"error": f"no query named {name!r}"}
