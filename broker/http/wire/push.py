"""Push on the wire (docs/wire-contract.md §4): the items of a push (and of a transaction's
or a stream cycle's push), and the answer per item."""
from __future__ import annotations

from typing import Any

from broker.core.domain import PushItem
from broker.core.errors import BadRequest
from broker.core.ids import new_uuid7
from broker.core.validate import Invalid, check_push
from broker.http.wire.common import body_object, required_name
from broker.service.push import ItemOutcome, PushOutcome


def parse_push_item(item: Any, index: int, default_payload: Any = None) -> PushItem:
    """One item of a push or transaction: the types first (Queen's messages),
    then the acceptance rule of :mod:`broker.core.validate`, so an item is never
    acknowledged that PostgreSQL would refuse."""
    if not isinstance(item, dict):
        raise BadRequest(f"items[{index}] must be an object")
    queue = required_name(item.get("queue"), "Queue must be a string")
    partition = item.get("partition")
    if partition is None:
        partition = "Default"
    partition = required_name(partition, "Partition must be a string")
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


def push_answer(outcome: PushOutcome) -> list[dict]:
    """The answer's array, one element per item in request order (§4.1)."""
    return [_item_answer(n, done, outcome.error) for n, done in enumerate(outcome.items)]


def _item_answer(index: int, done: ItemOutcome, error: str | None) -> dict:
    item = done.item
    if done.status in ("staged", "spooled", "failed", "refused"):
        # Not in queen.messages (yet): no partition id to tell. Staged and spooled items
        # are both ``buffered`` to the client: durable, stored in order later under the
        # ``message_id`` answered here (as a queued item's). A refused one (its queue's
        # maxSize) is ``failed`` with the reason, which the client raises or hands to its
        # error callback.
        failed = done.status in ("failed", "refused")
        out: dict[str, Any] = {
            "index": index, "status": "failed" if failed else "buffered",
            "queue": item.queue, "partition": item.partition,
            "transactionId": item.transaction_id}
        if failed:
            out["error"] = done.error if done.status == "refused" else error
        else:
            out["message_id"] = done.message_id
        return out
    out = {
        "index": index,
        "transaction_id": item.transaction_id,
        "status": done.status,
        "message_id": done.message_id,
        "queueName": item.queue,
    }
    if done.status == "queued":
        out["partition_id"] = done.partition_id
        out["trace_id"] = item.trace_id
    return out
