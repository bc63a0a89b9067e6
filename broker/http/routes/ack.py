"""Acknowledgements, transactions and lease renewal (docs/wire-contract.md §6–§8)."""
from __future__ import annotations

from typing import Any

from sanic import Blueprint, Request

from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import iso_milli
from broker.http.responses import json, read_json
from broker.http.wire.messages import (
    ack_result,
    body_object,
    check_item_count,
    parse_ack_item,
    parse_group,
    parse_push_item,
)
from broker.http.wire.state import parse_riders
from broker.service import ack as service
from broker.service.push import checked_producer_sub
from broker.service.riders import Riders
from broker.store.db import TransactionAborted
from broker.store.kv import rolled_back as kv_rolled_back

bp = Blueprint("ack")


async def _ack(request: Request, rows):
    results = await service.ack(request.app.ctx, rows)
    return [ack_result(r, row.transaction_id, n) for n, (row, r) in enumerate(zip(rows, results))]


@bp.post("/api/v1/ack")
async def ack(request: Request):
    body = body_object(read_json(request))
    row = parse_ack_item(body, parse_group(body.get("consumerGroup")), batch=False)
    return json(await _ack(request, [row]))


@bp.post("/api/v1/ack/batch")
async def ack_batch(request: Request):
    body = body_object(read_json(request))
    items = body.get("acknowledgments")
    if not isinstance(items, list):
        raise BadRequest("acknowledgments array is required")
    group = parse_group(body.get("consumerGroup"))
    rows = [parse_ack_item(item, group, batch=True) for item in items]
    if not rows:
        return json([])
    return json(await _ack(request, rows))


# -- transaction ------------------------------------------------------------

def _parse_transaction(body: Any):
    body = body_object(body)
    riders = Riders(*parse_riders(body))
    ops = body.get("operations")
    if not isinstance(ops, list):
        raise BadRequest("operations array required")
    if not ops and not riders:
        raise BadRequest("operations array cannot be empty")
    required = body.get("requiredLeases") or []
    if not isinstance(required, list) or not all(is_uuid(x) for x in required):
        raise BadRequest("requiredLeases must be an array of lease ids (UUIDs)")
    required = list(dict.fromkeys(required))
    flat: list[tuple[str, Any]] = []  # ("push", PushItem) | ("ack", AckRow)
    for n, op in enumerate(ops):
        if not isinstance(op, dict):
            raise BadRequest(f"operations[{n}] must be an object")
        kind = op.get("type")
        if kind == "push":
            items = op.get("items")
            if not isinstance(items, list):
                raise BadRequest(f"operations[{n}].items array is required")
            flat += [("push", parse_push_item(it, i, default_payload={})) for i, it in enumerate(items)]
        elif kind == "ack":
            row = parse_ack_item(op, parse_group(op.get("consumerGroup")), batch=False)
            if row.lease_id is None and len(required) == 1:
                row = row.__class__(**{**row.__dict__, "lease_id": required[0]})
            flat.append(("ack", row))
        else:
            raise BadRequest(f"operations[{n}].type must be 'push' or 'ack', got {kind!r}")
    return flat, required, riders


@bp.post("/api/v1/transaction")
async def transaction(request: Request):
    flat, required, riders = _parse_transaction(read_json(request))
    check_item_count(len(flat), request.app.ctx.settings.push_max_items_per_request)
    outcome = await service.transaction(
        request.app.ctx, flat, required,
        checked_producer_sub(getattr(request.ctx, "producer_sub", None)), riders)
    txn_id = outcome.transaction_id
    if outcome.kv_failed is not None:
        return json(_kv_precondition(txn_id, outcome, flat, riders))
    if outcome.aborted is not None:
        return json({"transactionId": txn_id, "success": False, "error": outcome.aborted.reason,
                     "results": _rolled_back(outcome.steps, flat, outcome.aborted)
                     + _riders_rolled_back(len(flat), riders)})
    steps, step_results = outcome.steps, outcome.results

    results = []
    flat_iter = iter(flat)
    for (kind, rows), res in zip(steps, step_results):
        for _row, r in zip(rows, res):
            _, item = next(flat_iter)
            index = len(results)
            if kind == "push":
                results.append({"index": index, "type": "push", "success": True,
                                "status": r["status"], "transactionId": item.transaction_id,
                                "messageId": str(r["message_id"]),
                                "partitionId": str(r["partition_id"]), "queueName": item.queue})
            else:
                results.append({"index": index, "type": "ack", "success": r["success"],
                                "transactionId": item.transaction_id, "error": r["error"],
                                "dlq": r["dlq"]})
    results += _rider_results(len(results), riders.kv_results, riders.timer_results)
    return json({"transactionId": txn_id, "success": True, "results": results})


def _rider_results(start: int, kv_results: list[dict], timer_results: list[dict]) -> list[dict]:
    """The riders' elements after the operations' (the append-only layout)."""
    return ([{"index": start + n, "type": "kv", **r} for n, r in enumerate(kv_results)]
            + [{"index": start + len(kv_results) + n, "type": "timer", **r}
               for n, r in enumerate(timer_results)])


def _riders_rolled_back(start: int, riders: Riders) -> list[dict]:
    return _rider_results(
        start, [{"op": op.op, "ns": op.ns, "key": op.key, "applied": False,
                 "reason": "rolled_back"} for op in riders.kv_ops],
        [{"op": op.op, "queue": op.queue, "timerKey": op.timer_key, "ok": False,
          "status": "rolled_back"} for op in riders.timer_ops])


def _kv_precondition(txn_id: str, outcome, flat: list[tuple[str, Any]], riders: Riders) -> dict:
    """A required kv rider op did not apply: the one failure answered (HTTP 200), not
    raised, with what the loser needs (the client returns it from commit())."""
    failed = outcome.kv_failed
    rejected = TransactionAborted("rolled back: a kv precondition did not hold")
    timers_not_run = [{"op": op.op, "queue": op.queue, "timerKey": op.timer_key, "ok": False,
                       "status": "not_run"} for op in riders.timer_ops]
    return {"transactionId": txn_id, "success": False, "reason": "kv_precondition",
            "error": f"kv precondition failed ({failed.result.get('reason')}): "
                     f"{failed.result.get('ns')}/{failed.result.get('key')}",
            "failedIndex": len(flat) + failed.index, "kvReason": failed.result.get("reason"),
            "version": failed.result.get("version"), "value": failed.result.get("value"),
            "results": _rolled_back(outcome.steps, flat, rejected)
            + _rider_results(len(flat), kv_rolled_back(riders.kv_ops, riders.kv_results, failed),
                             timers_not_run)}


def _rolled_back(steps: list[tuple[str, list]], flat: list[tuple[str, Any]],
                 aborted: TransactionAborted) -> list[dict]:
    """Every item of a rolled-back transaction, each saying so: nothing was committed, so no
    item has a messageId or a partitionId. The reason is on the ack that failed, or on the
    acks under the required lease that was not live."""
    results = []
    flat_iter = iter(flat)
    for step, (kind, rows) in enumerate(steps):
        for n in range(len(rows)):
            _, item = next(flat_iter)
            out = {"index": len(results), "type": kind, "success": False,
                   "status": "rolled_back", "transactionId": item.transaction_id}
            if kind == "push":
                out["queueName"] = item.queue
                out["partition"] = item.partition
            else:
                failed = (aborted.failed_at == (step, n) or
                          (aborted.dead_lease is not None and item.lease_id == aborted.dead_lease))
                out["error"] = aborted.reason if failed else None
            results.append(out)
    return results


# -- lease ------------------------------------------------------------------

@bp.post("/api/v1/lease/<lease_id:str>/extend", unquote=True)
async def extend_lease(request: Request, lease_id: str):
    body = body_object(read_json(request))
    seconds = body.get("seconds", 60)
    if seconds is None:
        seconds = 60
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 86400:
        raise BadRequest("seconds must be an integer between 1 and 86400")
    if not is_uuid(lease_id):
        raise BadRequest(f"leaseId must be a UUID, got {lease_id!r}")
    renewed, expires, err = await service.extend_lease(request.app.ctx, lease_id, seconds)
    expires_at = iso_milli(expires)
    return json({"leaseId": lease_id, "success": renewed > 0, "error": err,
                 "expiresAt": expires_at, "newExpiresAt": expires_at, "renewed": renewed})
