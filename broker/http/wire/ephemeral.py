"""Ephemeral queues on the wire (docs/ephemeral.md §1, docs/wire-contract.md's ephemeral
family): the bodies and query strings of the eight verbs, and their answers.

Every refusal here is a 400 (413 for a push or ack over PUSH_MAX_ITEMS_PER_REQUEST) before
anything changed. The queue name is read first and on its own (``queue_of``, ``pop_queue``),
so a route can decide where the queue is served before parsing the rest.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from broker.core.domain import QUEUE_MODE
from broker.core.errors import BadRequest
from broker.core.validate import Invalid, payload_json
from broker.http.wire.common import INT32_MAX, body_object, name_field, q_bool, q_int, q_str
from broker.service.ephemeral import (
    Delivery,
    EphemeralPop,
    PushVerdict,
    QueueFigures,
    QueueOptions,
    parse_patch,
)

DEFAULT_PARTITION = "Default"
MAX_POP_BATCH = 10_000
ACK_STATUSES = ("completed", "failed", "retry")
_MAX_ID = 200

NOT_FOUND = "ephemeral_queue_not_found"
FULL = "ephemeral_queue_full"
MEMORY = "ephemeral_memory_full"
TOO_LARGE = "ephemeral_push_too_large"


# -- requests -----------------------------------------------------------------------------

def queue_of(body: Any) -> tuple[Mapping[str, Any], str]:
    """The body (a JSON object) and its ``queue``."""
    body = body_object(body)
    return body, name_field(body.get("queue"), "queue")


def path_queue(queue: str) -> str:
    return name_field(queue, "queue")


def pop_queue(args: Mapping[str, Any]) -> str:
    return name_field(q_str(args, "queue"), "queue")


def _group(value: Any) -> str:
    if value is None or value == "":
        return QUEUE_MODE
    return name_field(value, "group")


def _check_count(count: int, limit: int, what: str) -> None:
    if count > limit:
        raise BadRequest(f"Too many {what} in one request: {count}, at most {limit} "
                         f"(PUSH_MAX_ITEMS_PER_REQUEST); split it into smaller requests", 413)


def parse_push(body: Mapping[str, Any], max_items: int
               ) -> tuple[str, list[tuple[str, int]], int]:
    """(partition, [(payload JSON text, bytes)], total bytes) of a push body
    ``{queue, partition?, messages: [{payload}]}``; partition omitted: ``Default``. A
    payload follows the durable push's acceptance rule (broker/core/validate.py)."""
    partition = body.get("partition")
    partition = DEFAULT_PARTITION if partition is None else name_field(partition, "partition")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages must be an array of {payload}")
    _check_count(len(messages), max_items, "messages")
    items: list[tuple[str, int]] = []
    total = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object {{payload}}")
        if len(message) > 1 or (message and "payload" not in message):
            extra = sorted(str(k) for k in message if k != "payload")
            raise BadRequest(f"messages[{i}] carries {', '.join(extra)}"[:300] +
                             ": an ephemeral message is {payload} only (no transactionId, no "
                             "queue or partition per message)")
        try:
            text = payload_json(message.get("payload"), f"messages[{i}].payload")
        except Invalid as exc:
            raise BadRequest(str(exc)) from None
        size = len(text) if text.isascii() else len(text.encode())
        items.append((text, size))
        total += size
    return partition, items, total


def parse_pop(args: Mapping[str, Any], queue: str, default_batch: int,
              default_timeout_ms: int) -> EphemeralPop:
    partition = q_str(args, "partition")
    batch = q_int(args, "batch", default_batch, maximum=MAX_POP_BATCH)
    if batch < 1:
        raise BadRequest(f"batch must be an integer >= 1, got {args.get('batch')!r}")
    timeout = q_int(args, "timeout", default_timeout_ms, maximum=INT32_MAX)
    if timeout < 0:
        raise BadRequest(f"timeout must be an integer >= 0, got {args.get('timeout')!r}")
    group = args.get("group")
    if group in (None, ""):
        group = args.get("consumerGroup")
    return EphemeralPop(
        queue=queue, partition=None if partition is None else name_field(partition, "partition"),
        group=_group(group), batch=batch, wait=q_bool(args, "wait"), timeout_ms=timeout,
        auto_ack=q_bool(args, "autoAck"))


def parse_ack(body: Mapping[str, Any], max_items: int) -> tuple[str, list[tuple[str, str]]]:
    """(group, [(id, status)]) of ``{queue, group?, acks: [{id, status?, error?}]}``."""
    acks = body.get("acks")
    if not isinstance(acks, list):
        raise BadRequest("acks must be an array of {id, status?, error?}")
    _check_count(len(acks), max_items, "acks")
    out = []
    for i, ack in enumerate(acks):
        if not isinstance(ack, dict):
            raise BadRequest(f"acks[{i}] must be an object {{id, status?, error?}}")
        mid = ack.get("id")
        if not isinstance(mid, str) or not mid or len(mid) > _MAX_ID:
            raise BadRequest(f"acks[{i}].id must be a message id (a non-empty string)")
        status = ack.get("status")
        if status is None:
            status = "completed"
        elif status not in ACK_STATUSES:
            raise BadRequest(f"acks[{i}].status must be completed, failed or retry, "
                             f"got {status!r}"[:300])
        error = ack.get("error")
        if error is not None and not isinstance(error, str):
            raise BadRequest(f"acks[{i}].error must be a string")
        out.append((mid, status))
    return _group(body.get("group")), out


def parse_configure(body: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(str(k) for k in body if k not in ("queue", "options"))
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; a configure body is "
                         "{queue, options}"[:300])
    return parse_patch(body.get("options"))


# -- answers ------------------------------------------------------------------------------

def push_answer(verdict: PushVerdict) -> tuple[dict[str, Any], int]:
    """200 ``{pushed}``; 429 (queue full, policy reject), 503 (memory budget), 413 (can never
    fit), each ``{error: code, code, detail}``."""
    if verdict.status == "pushed":
        return {"pushed": verdict.pushed}, 200
    code, status = {"full": (FULL, 429), "memory": (MEMORY, 503),
                    "too_large": (TOO_LARGE, 413)}[verdict.status]
    return {"error": code, "code": code, "detail": verdict.detail}, status


def pop_body(queue_json: str, taken: Sequence[Delivery]) -> str:
    """``{queue, messages: [{id, partition, payload, attempts}]}``, the payloads spliced in
    as stored (JSON text)."""
    messages = ",".join('{"id":"%s","partition":%s,"payload":%s,"attempts":%d}' % d
                        for d in taken)
    return f'{{"queue":{queue_json},"messages":[{messages}]}}'


def ack_answer(acks: Sequence[tuple[str, str]],
               outcomes: Sequence[tuple[str, bool]]) -> dict[str, Any]:
    """``{results: [{id, outcome}]}``; ``dropped: true`` on an ``acked`` failure that used the
    message's last delivery (retryLimit: dropped for the group, no DLQ)."""
    results = []
    for (mid, _status), (outcome, dropped) in zip(acks, outcomes, strict=True):
        results.append({"id": mid, "outcome": outcome, "dropped": True} if dropped
                       else {"id": mid, "outcome": outcome})
    return {"results": results}


def configure_answer(queue: str, options: QueueOptions) -> dict[str, Any]:
    return {"queue": queue, "configured": True, "options": options.wire()}


def counts(c: Mapping[str, int]) -> dict[str, Any]:
    return {"pushed": c["pushed"], "popped": c["popped"], "acked": c["acked"],
            "rejected": {"full": c["rejected_full"], "memory": c["rejected_memory"],
                         "too_large": c["rejected_too_large"]},
            "dropped": {"retry_limit": c["dropped_retry_limit"], "ttl": c["dropped_ttl"],
                        "length": c["dropped_length"], "bytes": c["dropped_bytes"],
                        "reset": c["dropped_reset"], "moved": c["dropped_moved"]}}


def queues_answer(queues: Iterable[QueueFigures]) -> dict[str, Any]:
    return {"queues": [{"queue": f.queue, "declared": f.declared, "messages": f.messages,
                        "bytes": f.bytes, "partitions": len(f.partitions),
                        "groups": [g.group for g in f.groups], "options": f.options.wire(),
                        "counters": counts(f.counts)} for f in queues]}


def depth_answer(f: QueueFigures) -> dict[str, Any]:
    return {"queue": f.queue, "declared": f.declared, "messages": f.messages,
            "bytes": f.bytes, "options": f.options.wire(), "partitions": f.partitions,
            "groups": [{"group": g.group, "pending": g.pending, "leased": g.leased,
                        "partitions": g.partitions} for g in f.groups],
            "counters": counts(f.counts)}


def not_found(queue: str) -> dict[str, Any]:
    return {"error": NOT_FOUND, "code": NOT_FOUND,
            "detail": f"ephemeral queue {queue!r} does not exist on this broker"}


def health_figures(f: Mapping[str, Any]) -> dict[str, Any]:
    """``/health``'s ``ephemeral``: what the rings hold (per queue too), the budget, parked
    pops and the counters since this broker started."""
    return {"queues": f["queues"], "messages": f["messages"], "bytes": f["bytes"],
            "chargedBytes": f["chargedBytes"], "maxBytes": f["maxBytes"],
            "parkedPops": f["parkedPops"], "incarnation": f["incarnation"],
            "counters": counts(f["counts"]),
            "byQueue": {q: {"messages": m, "bytes": b}
                        for q, (m, b) in sorted(f["byQueue"].items())}}


def metric_families(f: Mapping[str, Any], gauge: Callable[..., Any],
                    counter: Callable[..., Any]) -> Iterable[Any]:
    """The Prometheus families of the ephemeral queues (routes/ops/metrics.py's helpers)."""
    c = counts(f["counts"])
    by_queue = sorted(f["byQueue"].items())
    yield gauge("queen_ephemeral_queues", "Ephemeral queues on this broker", f["queues"])
    yield gauge("queen_ephemeral_messages", "Messages held in RAM per ephemeral queue", None,
                ["queue"], [([q], m) for q, (m, _b) in by_queue])
    yield gauge("queen_ephemeral_bytes", "Payload bytes held in RAM per ephemeral queue", None,
                ["queue"], [([q], b) for q, (_m, b) in by_queue])
    yield gauge("queen_ephemeral_charged_bytes",
                "Bytes charged against EPHEMERAL_MAX_BYTES (payloads plus per-message "
                "overhead)", f["chargedBytes"])
    yield gauge("queen_ephemeral_max_bytes", "EPHEMERAL_MAX_BYTES", f["maxBytes"])
    yield gauge("queen_ephemeral_parked_pops", "Ephemeral long polls parked on this broker",
                f["parkedPops"])
    yield counter("queen_ephemeral_messages_total", "Ephemeral messages by event", ["event"],
                  [([k], c[k]) for k in ("pushed", "popped", "acked")])
    yield counter("queen_ephemeral_dropped_total", "Ephemeral messages dropped, by reason",
                  ["reason"], sorted(([k], v) for k, v in c["dropped"].items()))
    yield counter("queen_ephemeral_rejected_total",
                  "Ephemeral messages refused at push, by reason", ["reason"],
                  sorted(([k], v) for k, v in c["rejected"].items()))
