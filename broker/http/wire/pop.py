"""Pop on the wire (docs/wire-contract.md §5): the query string of the three pop routes, and
the answer: the messages found (§5.3) or one of the empty results (§5.4)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from broker.core.config import subscription_starts_new
from broker.core.domain import QUEUE_MODE, PopRequest
from broker.core.errors import BadRequest
from broker.core.times import iso_micro, parse_timestamp
from broker.core.validate import MAX_NAME
from broker.http.wire.common import INT32_MAX, q_bool, q_int, q_str
from broker.service.pop import Popped, PopResult

MAX_POP_BATCH = 10_000       # messages one pop may return
MAX_POP_PARTITIONS = 1_000   # partitions one wildcard pop may claim


def parse_pop(args: Mapping[str, Any], *, queue: str | None, partition: str | None,
              default_batch: int, default_timeout_ms: int,
              default_subscription_mode: str) -> PopRequest:
    namespace, task = q_str(args, "namespace"), q_str(args, "task")
    if queue is None and namespace is None and task is None:
        raise BadRequest("namespace or task is required")
    group = q_str(args, "consumerGroup") or QUEUE_MODE
    if len(group) > MAX_NAME:
        raise BadRequest(f"consumerGroup must be at most {MAX_NAME} characters")
    auto_ack = q_bool(args, "autoAck")
    conflation = q_bool(args, "conflation")
    if conflation:  # a policy of a named group on one queue (§5.8)
        if group == QUEUE_MODE:
            raise BadRequest("conflation needs a consumerGroup: it is a consumer group's policy")
        if auto_ack:
            raise BadRequest("conflation and autoAck exclude each other")
    mode = q_str(args, "subscriptionMode") or default_subscription_mode
    sub_from_raw = q_str(args, "subscriptionFrom")
    sub_mode: str | None = None
    sub_from: dt.datetime | None = None
    if sub_from_raw is not None:
        if sub_from_raw.lower() == "now":
            sub_mode = "new"
        else:
            sub_mode, sub_from = "timestamp", parse_timestamp(sub_from_raw, "subscriptionFrom")
    elif subscription_starts_new(mode):
        sub_mode = "new"
    # Every other mode (all, from_beginning, earliest, ...) starts at the oldest message: the
    # reference broker reads it so, and the official clients send such values.
    if group == QUEUE_MODE:
        sub_mode, sub_from = None, None  # queue mode never seeds
    partitions = _count(args, "partitions", 1, 1, MAX_POP_PARTITIONS)
    # The 2.6 client omits the knobs it leaves to the broker (its utils/autopilot.py); the
    # partition route has no sweep width to choose.
    autopilot = q_bool(args, "autopilot")
    return PopRequest(
        queue=queue,
        partition=partition,
        namespace=namespace if queue is None else None,
        task=task if queue is None else None,
        group=group,
        batch=_count(args, "batch", default_batch, 1, MAX_POP_BATCH),
        # Checked on every route; the partition route claims its one partition whatever
        # the value.
        max_partitions=1 if partition is not None else partitions,
        wait=q_bool(args, "wait"),
        timeout_ms=_count(args, "timeout", default_timeout_ms, 0, INT32_MAX),
        auto_ack=auto_ack,
        subscription_mode=sub_mode,
        subscription_from=sub_from,
        autopilot=autopilot,
        autopilot_batch=autopilot and args.get("batch") in (None, ""),
        autopilot_partitions=(autopilot and partition is None
                              and args.get("partitions") in (None, "")),
        frames=q_bool(args, "frames"),
        conflation=conflation,
    )


def _count(args: Mapping[str, Any], name: str, default: int, least: int, most: int) -> int:
    """A numeric pop parameter: below ``least`` is a 400 naming it (``batch=-1`` would
    otherwise be served as ``batch=1``); above ``most`` it is capped, a budget larger than
    one pop serves."""
    value = q_int(args, name, default, maximum=most)
    if value < least:
        raise BadRequest(f"{name} must be an integer >= {least}, got {args.get(name)!r}")
    return value


def pop_message(row: Mapping[str, Any], data: Any, group: str, lease_id: str,
                partition_id: str | None = None) -> dict:
    """One popped message; ``partition_id``: the row's, already a string (a pop's
    messages share few partitions, so the caller converts each once)."""
    return {
        "id": str(row["message_id"]),
        "transactionId": row["transaction_id"],
        "traceId": str(row["trace_id"]) if row["trace_id"] else None,
        "data": data,
        "producerSub": row["producer_sub"],
        "createdAt": iso_micro(row["created_at"]),
        "queue": row["queue_name"],
        "partition": row["partition_name"],
        "partitionId": partition_id or str(row["partition_id"]),
        "leaseId": lease_id,
        "consumerGroup": group,
        "retryCount": row["retry_count"] or 0,
    }


def pop_answer(req: PopRequest, result: PopResult) -> dict:
    """The answer to a pop: the messages it took, or why it took none (§5.4); with the
    sizing echoed when the pop engaged autopilot (§5.8)."""
    answer = _answer(req, result)
    answer.update(own_keys(req, result))
    return answer


def own_keys(req: PopRequest, result: PopResult) -> dict:
    """What an answer carries beside its messages and their place: the autopilot echo and
    the conflation echo (§5.8). ``conflation: true`` when the group's stored policy
    conflates (or, policy not read, when this pop declared it and delivered nothing);
    ``conflationConflict: true`` when this pop declared it and the stored policy does not."""
    keys: dict[str, Any] = {}
    stored = result.conflation
    if stored or (stored is None and req.conflation and result.popped is None):
        keys["conflation"] = True
    elif req.conflation and stored is False:
        keys["conflationConflict"] = True
    sizing = result.sizing
    if sizing is not None:
        keys["autopilot"] = {"partitions": sizing.partitions, "batch": sizing.batch,
                             "waitMs": sizing.wait_ms}
    return keys


def _answer(req: PopRequest, result: PopResult) -> dict:
    if result.popped is not None:
        return _found(req, result.popped)
    if result.empty == "paused":  # pop maintenance
        return {"messages": [], "paused": True}
    if req.wait:  # the deadline passed
        return {"success": True, "queue": req.queue, "partition": req.partition,
                "partitionId": None, "leaseId": None, "consumerGroup": req.group,
                "messages": []}
    if result.empty == "window_buffer":
        return {"success": True, "queue": req.queue, "partition": req.partition,
                "leaseId": "", "consumerGroup": req.group, "messages": [],
                "windowBufferActive": True}
    reason = {"empty": "no_available_partition"}.get(result.empty, result.empty)
    return {"success": False, "error": reason, "messages": []}


def _found(req: PopRequest, popped: Popped) -> dict:
    messages = []
    partitions = 0
    last: Any = None
    partition_id = ""
    for row, data in zip(popped.rows, popped.payloads):
        # The rows come grouped by partition: one string per partition, not per message.
        if partitions == 0 or last != row["partition_id"]:
            partitions += 1
            last = row["partition_id"]
            partition_id = str(last)
        messages.append(pop_message(row, data, req.group, popped.lease_id, partition_id))
    first = popped.rows[0]
    return {
        "success": True,
        "queue": first["queue_name"],
        "partition": first["partition_name"],
        "partitionId": str(first["partition_id"]),
        "leaseId": popped.lease_id,
        "consumerGroup": req.group,
        "partitionsClaimed": partitions,
        "messages": messages,
    }
