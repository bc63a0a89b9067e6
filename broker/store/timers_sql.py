"""SQL of the timers surface (queen.timers). A pending timer is a row; a delivered or
cancelled one has none. Delivery: a sweeper claims due rows ``FOR UPDATE SKIP
LOCKED`` (so exactly one broker of the cluster takes each), pushes them as messages
and deletes them, in one transaction."""

SCHEDULE = "SELECT * FROM queen.timer_schedule_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)"
"""Upsert one timer; (status, message_id, deliver_at): see the migration."""

CANCEL = "SELECT * FROM queen.timer_cancel_v1($1, $2)"
"""Cancel one timer; (status, txn)."""

CLAIM_DUE = """
SELECT t.queue_name, t.timer_key, t.partition_name, t.payload, t.is_encrypted, t.txn,
       t.message_id, t.producer_sub
FROM queen.timers t
WHERE t.deliver_at <= now()
ORDER BY t.deliver_at
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
"""Claim up to $1 due timers no other sweeper holds (not before: ``deliver_at <= now()``,
the delivering transaction's start)."""

DELETE_DELIVERED = """
DELETE FROM queen.timers t
USING unnest($1::text[], $2::text[]) AS d(q, k)
WHERE t.queue_name = d.q AND t.timer_key = d.k
"""
"""Delete the claimed timers, in the transaction that pushed them."""

NEXT_DUE = "SELECT extract(epoch FROM min(deliver_at) - clock_timestamp()) FROM queen.timers"
"""Seconds until the earliest pending timer is due (negative: overdue; NULL: none)."""

PEEK = """
SELECT t.* FROM queen.timers t WHERE t.queue_name = $1 AND t.timer_key = $2
"""

LIST = """
SELECT t.queue_name, t.timer_key, t.partition_name, t.txn, t.message_id, t.deliver_at,
       t.attempts, t.is_encrypted, t.created_at, t.updated_at
FROM queen.timers t
WHERE t.queue_name = $1 AND ($2::text IS NULL OR t.timer_key > $2)
ORDER BY t.timer_key
LIMIT $3
"""
"""A keyset page of one queue's pending timers, after key $2."""

COUNT_PREFIX = """
SELECT count(*) FROM queen.timers t WHERE t.queue_name = $1 AND starts_with(t.timer_key, $2)
"""
"""How many pending timers of queue $1 have a key starting with $2 (exact)."""
