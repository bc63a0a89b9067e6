"""The dead-letter queue on the wire (docs/wire-contract.md §12): a page of dead letters and
the answer of a retry."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from broker.core.times import iso_milli


def dlq_page(rows: Sequence[Mapping[str, Any]], payloads: Sequence[Any], total: int,
             limit: int, offset: int) -> dict:
    """``GET /api/v1/dlq`` (§12.1): ``payloads`` are the rows' payloads, decrypted."""
    return {"messages": [_dead_letter(r, data) for r, data in zip(rows, payloads)],
            "total": total, "pagination": {"limit": limit, "offset": offset}}


def _dead_letter(r: Mapping[str, Any], data: Any) -> dict:
    return {
        "id": str(r["id"]), "transactionId": r["transaction_id"],
        "partitionId": str(r["partition_id"]), "queue": r["queue"],
        "partition": r["partition"], "consumerGroup": r["consumer_group"],
        "errorMessage": r["error_message"], "retryCount": r["retry_count"], "data": data,
        "producerSub": r["producer_sub"], "createdAt": iso_milli(r["created_at"]),
        "failedAt": iso_milli(r["failed_at"]),
    }


def retry_answer(transaction_id: str, dead: Sequence[Mapping[str, Any]], copy_txid: str,
                 pushed: Mapping[str, Any]) -> dict:
    """``POST /api/v1/messages/{partitionId}/{transactionId}/retry`` (§12.2): ``dead`` are
    the dead letter's rows (one per consumer group), ``pushed`` the copy's."""
    return {"retried": True, "transactionId": transaction_id,
            "consumerGroup": dead[0]["consumer_group"],
            "consumerGroups": sorted({r["consumer_group"] for r in dead}),
            "newTransactionId": copy_txid, "messageId": str(pushed["message_id"])}
