"""The data path's compact calls (broker/store/sql.py: a column whose items all agree is sent as
one value and filled into its array by the statement; the item index is generated).

Invariant: a push or an ack stores and answers exactly what the same items would through the
functions' plain parallel arrays, whichever columns agree and whichever differ; a column
sent as one value is never applied to an item that had another."""
from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core.domain import AckRow, PushRow
from broker.core.ids import new_uuid7
from broker.store.codecs import push_arrays
from broker.store.db import Store, now_us

PLAIN_PUSH = """
SELECT idx, message_id, partition_id, status, late, peer, error
FROM queen.push_ordered_v4($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
"""


# Per column: the same value for every item, or values that differ (None among them).
COLUMNS = st.fixed_dictionaries({
    "queue": st.booleans(), "partition": st.booleans(), "trace": st.booleans(),
    "encrypted": st.booleans(), "sub": st.booleans(), "request": st.booleans(),
})


TRACE = str(uuid.uuid4())


def rows_for(tag: str, n: int, vary: dict[str, bool]) -> list[PushRow]:
    def pick(column: str, options: list, i: int):
        return options[i % len(options)] if vary[column] else options[0]

    return [PushRow(
        queue=pick("queue", [f"shape-{tag}-a", f"shape-{tag}-b"], i),
        partition=pick("partition", ["p0", "p1", "p2"], i),
        message_id=new_uuid7(), transaction_id=f"tx-{i}",
        trace_id=pick("trace", [None, TRACE], i),
        payload={"i": i}, encrypted=pick("encrypted", [False, True], i),
        producer_sub=pick("sub", [None, "alice", "bob"], i),
        request=pick("request", [1, None, 2], i)) for i in range(n)]


async def stored(store: Store, ids: list[str]) -> list[tuple]:
    async with store.connection() as c:
        got = await c.fetch(
            "SELECT m.id::text AS id, q.name AS queue, p.name AS partition, m.transaction_id,"
            " m.trace_id::text AS trace, m.is_encrypted, m.producer_sub, m.payload::text AS payload"
            " FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id"
            " JOIN queen.queues q ON q.id = p.queue_id WHERE m.id = ANY($1::uuid[])", ids)
    by_id = {r["id"]: r for r in got}
    # Queue names differ between the two runs by their tag only.
    return [(by_id[i]["queue"].rsplit("-", 1)[1], *tuple(by_id[i])[2:]) for i in ids]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(vary=COLUMNS, n=st.integers(1, 7))
async def test_a_compact_push_stores_what_plain_arrays_store(store, vary, n):
    tag = uuid.uuid4().hex[:8]
    compact_rows = rows_for(f"c{tag}", n, vary)
    plain_rows = rows_for(f"r{tag}", n, vary)
    compact = await store.push(compact_rows)
    async with store.connection() as c:
        plain = await c.fetch(PLAIN_PUSH, *push_arrays(plain_rows, [now_us()] * n, store.server_id,
                                                      store.order_wait_ms, store.settle_ms),
                              [r.request for r in plain_rows])
    assert [r["status"] for r in compact] == [r["status"] for r in plain] == ["queued"] * n
    assert [r["idx"] for r in compact] == list(range(n))
    assert [str(r["message_id"]) for r in compact] == [r.message_id for r in compact_rows]
    assert await stored(store, [r.message_id for r in compact_rows]) == \
        await stored(store, [r.message_id for r in plain_rows])


async def pop_batch(store: Store, queue: str, group: str, batch: int) -> tuple[str, list]:
    lease = new_uuid7()
    rows = await store.pop(queue=queue, partition=None, namespace=None, task=None,
                           group=group, batch=batch, max_partitions=1, auto_ack=False,
                           lease_id=lease)
    return lease, [r for r in rows if r["kind"] == "msg"]


async def test_one_ack_call_with_differing_groups_leases_statuses_and_errors(store):
    """Two groups' batches acked in one call (groups and leases differ), then a call whose
    statuses and errors differ: each item is judged with its own values."""
    queue = f"shape-ack-{uuid.uuid4().hex[:8]}"
    await store.push([PushRow(queue=queue, partition="p", message_id=new_uuid7(),
                              transaction_id=f"tx-{i}", trace_id=None, payload={"i": i})
                      for i in range(4)])
    lease1, first1 = await pop_batch(store, queue, "g1", 2)
    lease2, first2 = await pop_batch(store, queue, "g2", 2)
    acks = ([AckRow(r["transaction_id"], str(r["partition_id"]), "completed", None, "g1", lease1)
             for r in first1]
            + [AckRow(r["transaction_id"], str(r["partition_id"]), "completed", None, "g2", lease2)
               for r in first2])
    # A row for a message g2 has not been given, under g1's lease, is refused; the others
    # are not.
    stranger = AckRow("tx-2", str(first1[0]["partition_id"]), "completed", None, "g2", lease1)
    results = await store.ack([*acks, stranger])
    assert [r["success"] for r in results] == [True, True, True, True, False]

    # Each group's own batch was acked under its own lease: both move on.
    _, second2 = await pop_batch(store, queue, "g2", 2)
    assert [r["transaction_id"] for r in second2] == ["tx-2", "tx-3"]
    lease1, second1 = await pop_batch(store, queue, "g1", 2)
    assert [r["transaction_id"] for r in second1] == ["tx-2", "tx-3"]
    results = await store.ack([
        AckRow("tx-2", str(second1[0]["partition_id"]), "completed", None, "g1", lease1),
        AckRow("tx-3", str(second1[1]["partition_id"]), "failed", "boom", "g1", lease1)])
    assert [r["success"] for r in results] == [True, True]
    _, again = await pop_batch(store, queue, "g1", 2)
    assert [(r["transaction_id"], r["retry_count"]) for r in again] == [("tx-3", 1)]
