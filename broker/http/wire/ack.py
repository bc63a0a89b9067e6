"""Acknowledgements and lease renewal on the wire (docs/wire-contract.md §6, §8): an ack item
(also a transaction's and a stream cycle's), the answer per ack, the lease extension."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from broker.core.domain import QUEUE_MODE, AckRow
from broker.core.errors import BadRequest
from broker.core.ids import is_uuid
from broker.core.times import iso_milli
from broker.core.validate import MAX_NAME

ACK_STATUSES = ("completed", "success", "failed", "dlq", "retry")


U64_MAX = 2**64 - 1


def is_partition_handle(value: str) -> bool:
    """A framed pop's partition handle (docs/wire-contract.md §5.9): a decimal u64."""
    return value.isascii() and value.isdigit() and len(value) <= 20 and int(value) <= U64_MAX


def parse_ack_item(item: Any, group: str, *, batch: bool, handles: bool = False,
                   checked: set[tuple[str, str]] | None = None) -> AckRow:
    """One acknowledgement; ``handles``: the partition may be named by its handle (the ack
    routes and transactions; a stream cycle's partitions are always UUIDs). ``checked``:
    the (field, value) pairs of partition ids and leases an earlier item of the same batch
    passed (a batch's items mostly share them), not checked again; this item's are added."""
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
    if checked is None or ("partition", pid) not in checked:
        if not is_uuid(pid) and not (handles and is_partition_handle(pid)):
            raise BadRequest(f"partitionId must be a UUID{' or a partition handle' if handles else ''}, "
                             f"got {pid!r}")
        if checked is not None:
            checked.add(("partition", pid))
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
    elif checked is None or not isinstance(lease, str) or ("lease", lease) not in checked:
        # (a JSON object or array is no lease, and cannot be looked up in ``checked``)
        if not is_uuid(lease):
            raise BadRequest(f"leaseId must be a UUID, got {lease!r}")
        if checked is not None:
            checked.add(("lease", lease))
    return AckRow(txid, pid, status, error, group, lease)


def parse_group(value: Any) -> str:
    if value is None or value == "":
        return QUEUE_MODE
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise BadRequest("consumerGroup must be a string")
    return value


def parse_ack_batch(body: Mapping[str, Any]) -> list[AckRow]:
    """``{"acknowledgments": [...], "consumerGroup"}`` of POST /api/v1/ack/batch (§6.2)."""
    items = body.get("acknowledgments")
    if not isinstance(items, list):
        raise BadRequest("acknowledgments array is required")
    group = parse_group(body.get("consumerGroup"))
    checked: set[tuple[str, str]] = set()  # (field, value) pairs: a handle is no lease
    return [parse_ack_item(item, group, batch=True, handles=True, checked=checked)
            for item in items]


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


def ack_answer(acks: Sequence[AckRow], results: Sequence[Mapping[str, Any]]) -> list[dict]:
    """One element per ack, in request order (§6.1, §6.2)."""
    return [ack_result(r, row.transaction_id, n)
            for n, (row, r) in enumerate(zip(acks, results))]


# -- lease ----------------------------------------------------------------------------------

def parse_lease_extension(body: Mapping[str, Any], lease_id: str) -> int:
    """The seconds a lease is extended by (§8; 60 when not given)."""
    seconds = body.get("seconds", 60)
    if seconds is None:
        seconds = 60
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 86400:
        raise BadRequest("seconds must be an integer between 1 and 86400")
    if not is_uuid(lease_id):
        raise BadRequest(f"leaseId must be a UUID, got {lease_id!r}")
    return seconds


def lease_answer(lease_id: str, renewed: int, expires: dt.datetime | None,
                 error: str | None) -> dict:
    expires_at = iso_milli(expires)
    return {"leaseId": lease_id, "success": renewed > 0, "error": error,
            "expiresAt": expires_at, "newExpiresAt": expires_at, "renewed": renewed}
