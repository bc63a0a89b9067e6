"""An ack batch checks each distinct partition id and lease once (broker/http/wire/ack.py).

Invariant: the batch is accepted or refused exactly as when every item is checked on its own,
with the same rows or the same 400 message; a value that passed as one field (a partition
handle) never lets the same text pass as another (a lease)."""
from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.errors import BadRequest
from broker.http.wire.ack import parse_ack_batch, parse_ack_item

UUIDS = [str(uuid.uuid4()) for _ in range(3)]
# Partition ids and leases drawn from a few values, so that items of a batch share them.
VALUES = st.sampled_from([*UUIDS, UUIDS[0].upper(), "12345", "18446744073709551616", "x",
                          "", None, 7, {}, [], [UUIDS[0]]])  # unhashable ones too (JSON)
ITEMS = st.lists(st.fixed_dictionaries({
    "transactionId": st.sampled_from(["t1", "t2"]), "partitionId": VALUES,
    "leaseId": VALUES, "status": st.sampled_from(["completed", "failed"]),
}), max_size=6)


def outcome(parse):
    try:
        return ("rows", parse())
    except BadRequest as exc:
        return ("400", str(exc))


@settings(max_examples=400, deadline=None)
@given(ITEMS)
def test_a_batch_is_judged_as_its_items_one_by_one(items):
    body = {"acknowledgments": items, "consumerGroup": "g"}
    alone = outcome(lambda: [parse_ack_item(i, "g", batch=True, handles=True) for i in items])
    assert outcome(lambda: parse_ack_batch(body)) == alone


def test_a_handle_that_passed_as_a_partition_is_still_no_lease():
    body = {"acknowledgments": [
        {"transactionId": "t1", "partitionId": "12345", "leaseId": UUIDS[0]},
        {"transactionId": "t2", "partitionId": UUIDS[1], "leaseId": "12345"},
    ]}
    with pytest.raises(BadRequest, match="leaseId must be a UUID"):
        parse_ack_batch(body)
