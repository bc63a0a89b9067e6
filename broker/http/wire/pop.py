"""Pop on the wire (docs/wire-contract.md §5): the query string of the three pop routes, and
the answer: the messages found (§5.3) or one of the empty results (§5.4)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from broker.core.config import subscription_starts_new
from broker.core.domain import QUEUE_MODE, PopRequest
from broker.core.errors import BadRequest
from broker.core.times import iso_micro_us, parse_timestamp
from broker.core.validate import MAX_NAME
from broker.http.responses import dumps as _json
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


def pop_answer(req: PopRequest, result: PopResult) -> str:
    """The answer to a pop, as JSON text: the messages it took, or why it took none (§5.4);
    with the sizing echoed when the pop engaged autopilot (§5.8)."""
    keys = own_keys(req, result)
    if result.popped is None:
        answer = _empty(req, result)
        answer.update(keys)
        return _json(answer)
    popped = result.popped
    first = popped.rows[0]
    messages, partitions = _messages(req, popped)
    envelope = {
        "success": True,
        "queue": first["queue_name"],
        "partition": first["partition_name"],
        "partitionId": str(first["partition_id"]),
        "leaseId": popped.lease_id,
        "consumerGroup": req.group,
        "partitionsClaimed": partitions,
        **keys,
    }
    # The messages go in as text: each payload is PostgreSQL's JSON text of it, spliced
    # in as it is instead of being decoded and encoded again (and, for the rest of a
    # message, the strings a pop's messages share are encoded once).
    return _json(envelope)[:-1] + ',"messages":[' + ",".join(messages) + "]}"


def _messages(req: PopRequest, popped: Popped) -> tuple[list[str], int]:
    """Each message of a pop as JSON text (§5.3), and how many partitions the messages come
    from (the rows come grouped by partition)."""
    group, lease = _json(req.group), _json(popped.lease_id)
    out = []
    partitions = 0
    last: Any = None
    queue = partition = partition_id = ""
    for row, data in zip(popped.rows, popped.payloads):
        if partitions == 0 or row["partition_id"] != last:
            partitions += 1
            last = row["partition_id"]
            queue, partition = _json(row["queue_name"]), _json(row["partition_name"])
            partition_id = str(last)
        trace = row["trace_id"]
        trace_id = "null" if trace is None else f'"{trace}"'  # a UUID: nothing to escape
        out.append(
            f'{{"id":"{row["message_id"]}","transactionId":{_json(row["transaction_id"])},'
            f'"traceId":{trace_id},"data":{data},"producerSub":{_json(row["producer_sub"])},'
            f'"createdAt":"{iso_micro_us(row["created_us"])}","queue":{queue},'
            f'"partition":{partition},"partitionId":"{partition_id}","leaseId":{lease},'
            f'"consumerGroup":{group},"retryCount":{int(row["retry_count"] or 0)}}}')
    return out, partitions


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


def _empty(req: PopRequest, result: PopResult) -> dict:
    answer = _empty_answer(req, result)
    if result.queue_missing:
        # No such queue: the empty answer every client reads as "no messages", told
        # apart by this key only (never a 404: service/pop.py says why).
        answer["queueExists"] = False
    return answer


def _empty_answer(req: PopRequest, result: PopResult) -> dict:
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
