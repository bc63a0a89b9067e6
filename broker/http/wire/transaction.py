"""The transaction on the wire (docs/wire-contract.md §7): its body (push and ack operations,
required leases, riders) and its answer, committed or rolled back."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from broker.core.domain import PushItem
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.http.wire.ack import parse_ack_item, parse_group
from broker.http.wire.common import body_object
from broker.http.wire.push import parse_push_item
from broker.http.wire.riders import (
    parse_riders,
    rider_results,
    riders_rolled_back,
    timers_not_applied,
)
from broker.service.ack import TransactionAborted, TransactionOutcome
from broker.service.kv import KvPreconditionFailed
from broker.service.kv import rolled_back as kv_rolled_back
from broker.service.riders import Riders

# The operations in request order: ("push", PushItem) | ("ack", AckRow).
Flat = list[tuple[str, Any]]


def parse_transaction(body: Any, pushes: Sequence[PushItem] = ()
                      ) -> tuple[Flat, list[str], Riders]:
    """The operations flattened in request order, the required lease ids (each once),
    the riders. ``pushes``: the pushed items of a binary body (wire/push_binary.py), which
    follow the head's operations."""
    body = body_object(body)
    riders = Riders(*parse_riders(body))
    ops = body.get("operations", [] if pushes else None)
    if not isinstance(ops, list):
        raise BadRequest("operations array required")
    if not ops and not riders and not pushes:
        raise BadRequest("operations array cannot be empty")
    required = body.get("requiredLeases") or []
    if not isinstance(required, list) or not all(is_uuid(x) for x in required):
        raise BadRequest("requiredLeases must be an array of lease ids (UUIDs)")
    required = list(dict.fromkeys(required))
    flat: Flat = []
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
            row = parse_ack_item(op, parse_group(op.get("consumerGroup")), batch=False,
                                 handles=True)
            if row.lease_id is None and len(required) == 1:
                row = replace(row, lease_id=required[0])
            flat.append(("ack", row))
        else:
            raise BadRequest(f"operations[{n}].type must be 'push' or 'ack', got {kind!r}")
    flat += [("push", item) for item in pushes]
    return flat, required, riders


def transaction_answer(outcome: TransactionOutcome, flat: Flat, riders: Riders) -> dict:
    """Committed: every operation's result, then the riders'. Rolled back: every element
    saying so, with the reason (a failed kv precondition is answered with what the loser
    needs, the client returns it from commit())."""
    txn_id = outcome.transaction_id
    if outcome.kv_failed is not None:
        return _kv_precondition(outcome, outcome.kv_failed, flat, riders)
    if outcome.aborted is not None:
        return {"transactionId": txn_id, "success": False, "error": outcome.aborted.reason,
                "results": _rolled_back(outcome.steps, flat, outcome.aborted)
                + riders_rolled_back(len(flat), riders)}
    results: list[dict] = []
    flat_iter = iter(flat)
    for (kind, rows), res in zip(outcome.steps, outcome.results):
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
    results += rider_results(len(results), riders.kv_results, riders.timer_results)
    return {"transactionId": txn_id, "success": True, "results": results}


def transaction_counts(answer: dict) -> dict:
    """A committed transaction's answer as the binary body's flag 2 asks: the pushes' and
    the acks' results counted (``pushed``, ``duplicate``, ``acked``), the riders' results
    kept. A rolled-back answer stays whole: which operation failed is the point of it."""
    if not answer.get("success"):
        return answer
    ops = [r for r in answer["results"] if r.get("type") in ("push", "ack")]
    return {"transactionId": answer["transactionId"], "success": True,
            "pushed": sum(1 for r in ops if r["type"] == "push" and r["status"] == "queued"),
            "duplicate": sum(1 for r in ops if r["type"] == "push"
                             and r["status"] == "duplicate"),
            "acked": sum(1 for r in ops if r["type"] == "ack" and r["success"]),
            "results": [r for r in answer["results"] if r.get("type") not in ("push", "ack")]}


def _kv_precondition(outcome: TransactionOutcome, failed: KvPreconditionFailed, flat: Flat,
                     riders: Riders) -> dict:
    """A required kv rider op did not apply: the one failure answered (HTTP 200), not
    raised, with what the loser needs (the client returns it from commit())."""
    rejected = TransactionAborted("rolled back: a kv precondition did not hold")
    return {"transactionId": outcome.transaction_id, "success": False,
            "reason": "kv_precondition",
            "error": f"kv precondition failed ({failed.result.get('reason')}): "
                     f"{failed.result.get('ns')}/{failed.result.get('key')}",
            "failedIndex": len(flat) + failed.index, "kvReason": failed.result.get("reason"),
            "version": failed.result.get("version"), "value": failed.result.get("value"),
            "results": _rolled_back(outcome.steps, flat, rejected)
            + rider_results(len(flat), kv_rolled_back(riders.kv_ops, riders.kv_results, failed),
                            timers_not_applied(riders, "not_run"))}


def _rolled_back(steps: list[tuple[str, list]], flat: Flat,
                 aborted: TransactionAborted) -> list[dict]:
    """Every item of a rolled-back transaction, each saying so: nothing was committed, so no
    item has a messageId or a partitionId. The reason is on the ack that failed, or on the
    acks under the required lease that was not live."""
    results: list[dict] = []
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
