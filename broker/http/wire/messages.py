"""Queen's wire format, in one place: request parsing with clear 400 errors,
and response shaping (docs/wire-contract.md).

Parsing never touches the database; a request that fails here has written
nothing.
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

from broker.core.config import subscription_starts_new
from broker.core.domain import QUEUE_MODE, AckRow, PopRequest, PushItem
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid, new_uuid7
from broker.core.times import iso_micro, parse_timestamp
from broker.core.validate import MAX_NAME, Invalid, check_push
from broker.store.sql import QUEUE_OPTIONS

MAX_POP_BATCH = 10_000       # messages one pop may return
MAX_POP_PARTITIONS = 1_000   # partitions one wildcard pop may claim


# -- formats ----------------------------------------------------------------


def _name(value: Any, message: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise BadRequest(message)
    return value


def body_object(body: Any, what: str = "Request body") -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return body


# -- push -------------------------------------------------------------------


def parse_push_item(item: Any, index: int, default_payload: Any = None) -> PushItem:
    """One item of a push or transaction: the types first (Queen's messages),
    then the acceptance rule of :mod:`broker.core.validate`, so an item is never
    acknowledged that PostgreSQL would refuse."""
    if not isinstance(item, dict):
        raise BadRequest(f"items[{index}] must be an object")
    queue = _name(item.get("queue"), "Queue must be a string")
    partition = item.get("partition")
    if partition is None:
        partition = "Default"
    partition = _name(partition, "Partition must be a string")
    txid = item.get("transactionId")
    if txid is None or txid == "":
        txid = new_uuid7()
    elif not isinstance(txid, str):
        raise BadRequest("TransactionId must be a string")
    trace = item.get("traceId")
    if trace == "":
        trace = None
    elif trace is not None and not isinstance(trace, str):
        raise BadRequest("TraceId must be a string")
    payload = item["payload"] if "payload" in item else default_payload
    try:
        text = check_push(queue, partition, txid, trace, payload, f"items[{index}]")
    except Invalid as exc:
        raise BadRequest(str(exc)) from None
    return PushItem(queue, partition, payload, txid, trace, text)


def parse_push(body: Any) -> list[PushItem]:
    body = body_object(body)
    items = body.get("items")
    if not isinstance(items, list):
        raise BadRequest("items array is required")
    return [parse_push_item(item, i) for i, item in enumerate(items)]


def check_item_count(count: int, limit: int) -> None:
    """One request is one statement: bound it, or it holds its partitions' locks (and other
    pushes to them) for as long as it takes to insert."""
    if count > limit:
        raise BadRequest(f"Too many items in one request: {count}, at most {limit} "
                         f"(PUSH_MAX_ITEMS_PER_REQUEST); split it into smaller requests", 413)


def push_result(item: PushItem, row: Mapping[str, Any], index: int) -> dict:
    out = {
        "index": index,
        "transaction_id": item.transaction_id,
        "status": row["status"],
        "message_id": str(row["message_id"]),
        "queueName": item.queue,
    }
    if row["status"] == "queued":
        out["partition_id"] = str(row["partition_id"])
        out["trace_id"] = item.trace_id
    return out


# -- query strings ----------------------------------------------------------

TRUE_STRINGS = ("true", "1")


def q_bool(args: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = args.get(name)
    if value is None or value == "":
        return default
    if value.lower() in TRUE_STRINGS:
        return True
    if value.lower() in ("false", "0"):
        return False
    raise BadRequest(f"{name} must be true or false, got {value!r}")


INT32_MAX = 2**31 - 1


def q_int(args: Mapping[str, Any], name: str, default: int, minimum: int | None = None,
          maximum: int = INT32_MAX) -> int:
    value = args.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        return minimum
    return min(number, maximum)


def q_str(args: Mapping[str, Any], name: str) -> str | None:
    value = args.get(name)
    return value if value not in (None, "") else None


# -- pop --------------------------------------------------------------------


def parse_pop(args: Mapping[str, Any], *, queue: str | None, partition: str | None,
              default_batch: int, default_timeout_ms: int,
              default_subscription_mode: str) -> PopRequest:
    if q_bool(args, "conflation"):
        raise BadRequest("conflation is not supported by this broker")
    namespace, task = q_str(args, "namespace"), q_str(args, "task")
    if queue is None and namespace is None and task is None:
        raise BadRequest("namespace or task is required")
    group = q_str(args, "consumerGroup") or QUEUE_MODE
    if len(group) > MAX_NAME:
        raise BadRequest(f"consumerGroup must be at most {MAX_NAME} characters")
    auto_ack = q_bool(args, "autoAck")
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
    return PopRequest(
        queue=queue,
        partition=partition,
        namespace=namespace if queue is None else None,
        task=task if queue is None else None,
        group=group,
        batch=q_int(args, "batch", default_batch, minimum=1, maximum=MAX_POP_BATCH),
        max_partitions=1 if partition is not None else q_int(args, "partitions", 1, minimum=1,
                                                             maximum=MAX_POP_PARTITIONS),
        wait=q_bool(args, "wait"),
        timeout_ms=q_int(args, "timeout", default_timeout_ms, minimum=0),
        auto_ack=auto_ack,
        subscription_mode=sub_mode,
        subscription_from=sub_from,
    )


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


# -- ack --------------------------------------------------------------------

ACK_STATUSES = ("completed", "success", "failed", "dlq", "retry")


def parse_ack_item(item: Any, group: str, *, batch: bool) -> AckRow:
    if not isinstance(item, dict):
        raise BadRequest("Each acknowledgment must be an object")
    txid = item.get("transactionId")
    if not isinstance(txid, str) or not txid:
        raise BadRequest("Each acknowledgment must have a valid transactionId string" if batch
                         else "transactionId is required")
    pid = item.get("partitionId")
    if not isinstance(pid, str) or not pid:
        raise BadRequest("Each acknowledgment must have a valid partitionId string to ensure message uniqueness"
                         if batch else "partitionId is required to ensure message uniqueness")
    if not is_uuid(pid):
        raise BadRequest(f"partitionId must be a UUID, got {pid!r}")
    status = item.get("status", "completed")
    if status is None:
        status = "completed"
    if status not in ACK_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(ACK_STATUSES)}, got {status!r}")
    error = item.get("error")
    if error is not None and not isinstance(error, str):
        error = str(error)
    lease = item.get("leaseId")
    if lease in (None, ""):
        lease = None
    elif not is_uuid(lease):
        raise BadRequest(f"leaseId must be a UUID, got {lease!r}")
    return AckRow(txid, pid, status, error, group, lease)


def parse_group(value: Any) -> str:
    if value is None or value == "":
        return QUEUE_MODE
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise BadRequest("consumerGroup must be a string")
    return value


def ack_result(row: Mapping[str, Any], transaction_id: str, index: int) -> dict:
    return {
        "index": index,
        "transactionId": transaction_id,
        "success": row["success"],
        "error": row["error"],
        "queueName": row["queue_name"],
        "partitionName": row["partition_name"],
        "leaseReleased": row["lease_released"],
        "dlq": row["dlq"],
    }


# -- configure --------------------------------------------------------------

def parse_configure(body: Any) -> tuple[str, str | None, str | None, dict[str, Any]]:
    body = body_object(body)
    queue = _name(body.get("queue"), "queue is required")
    namespace = body.get("namespace") if isinstance(body.get("namespace"), str) else None
    task = body.get("task") if isinstance(body.get("task"), str) else None
    raw = body.get("options") or {}
    if not isinstance(raw, dict):
        raise BadRequest("options must be an object")
    options: dict[str, Any] = {}
    for name, _col, typ, _default in QUEUE_OPTIONS:
        if name not in raw or raw[name] is None:
            continue
        value = raw[name]
        if typ == "boolean":
            if not isinstance(value, bool):
                raise BadRequest(f"options.{name} must be a boolean")
        else:
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value != int(value)):
                raise BadRequest(f"options.{name} must be an integer")
            value = int(value)
            # priority is an ordering (the reference takes any integer, a "low" one may be
            # negative); every other integer option is a count or a duration.
            lowest = -(2**31) if name == "priority" else 0
            if value < lowest or value > 2**31 - 1:
                raise BadRequest(f"options.{name} must be between {lowest} and {2**31 - 1}")
        options[name] = value
    return queue, namespace, task, options


def queue_options(row: Mapping[str, Any]) -> dict:
    return {name: row[col] for name, col, _typ, _default in QUEUE_OPTIONS}
