"""A partition's messages go with it. queen.messages has no foreign key to queen.partitions
(it cost a lookup and a row lock per inserted message); a statement trigger deletes them
instead (migration 0017). Invariant: after a queue's delete (partitions cascading from it) or
a partition's own delete, no message is left whose partition does not exist, and a dead
letter of a deleted message goes too."""
from __future__ import annotations

import uuid

from broker.core.domain import QUEUE_MODE, AckRow, PushRow
from broker.core.ids import new_uuid7
from broker.store import sql

ORPHANS = """
SELECT count(*) FROM queen.messages m
WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = m.partition_id)
"""


async def fill(store, queue: str) -> None:
    await store.push([PushRow(queue=queue, partition=f"p{i % 3}", message_id=new_uuid7(),
                              transaction_id=f"tx-{i}", trace_id=None, payload={"i": i})
                      for i in range(9)])


async def test_deleting_a_queue_deletes_its_messages_and_dead_letters(store):
    queue = f"gone-{uuid.uuid4().hex[:8]}"
    await fill(store, queue)
    lease = new_uuid7()
    rows = await store.pop(queue=queue, partition="p0", namespace=None, task=None,
                           group=QUEUE_MODE, batch=1, max_partitions=1, auto_ack=False,
                           lease_id=lease)
    msg = next(r for r in rows if r["kind"] == "msg")
    await store.ack([AckRow(msg["transaction_id"], str(msg["partition_id"]), "dlq", "bad",
                            QUEUE_MODE, lease)])
    async with store.connection() as c:
        ids = await c.fetch("SELECT m.id FROM queen.messages m JOIN queen.partitions p"
                            " ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id"
                            " WHERE q.name = $1", queue)
        assert len(ids) == 9
        assert await c.fetchval("SELECT count(*) FROM queen.dead_letter_queue"
                                " WHERE message_id = $1", msg["message_id"]) == 1
        await c.fetchval(sql.DELETE_QUEUE, queue)
        assert await c.fetchval("SELECT count(*) FROM queen.messages WHERE id = ANY($1::uuid[])",
                                [r["id"] for r in ids]) == 0
        assert await c.fetchval("SELECT count(*) FROM queen.dead_letter_queue"
                                " WHERE message_id = $1", msg["message_id"]) == 0
        assert await c.fetchval(ORPHANS) == 0


async def test_deleting_one_partition_deletes_only_its_messages(store):
    queue = f"gone-{uuid.uuid4().hex[:8]}"
    await fill(store, queue)
    async with store.connection() as c:
        await c.execute("DELETE FROM queen.partitions p USING queen.queues q"
                        " WHERE q.id = p.queue_id AND q.name = $1 AND p.name = 'p1'", queue)
        left = await c.fetch("SELECT p.name, count(*) AS n FROM queen.messages m"
                             " JOIN queen.partitions p ON p.id = m.partition_id"
                             " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1"
                             " GROUP BY p.name ORDER BY p.name", queue)
        assert [(r["name"], r["n"]) for r in left] == [("p0", 3), ("p2", 3)]
        assert await c.fetchval(ORPHANS) == 0
