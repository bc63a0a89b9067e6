"""The one definition of a partition's message figures (total / pending / processing /
completed / dead-lettered), as SQL. Every surface that reports them derives from this
statement: the live operator routes (broker/store/sql.py, broker/store/ops_sql.py) and the
stats job that fills queen.stats (broker/store/jobs_sql.py), whose queue, namespace, task
and system rows are sums of its partition rows.

The consumers of a partition are the consumer groups with a cursor row on it, queue mode
(``__QUEUE_MODE__``) being one of them; a partition no one has popped yet is read as if
queue mode stood at its beginning. Each stored message is counted once, in one state:

* dead-lettered: some consumer dead-lettered it (it has a dead_letter_queue row);
* completed: every consumer's cursor is past it (and it is not dead-lettered);
* processing: handed out under a live lease of some consumer, not yet acked;
* pending: the rest, i.e. some consumer still has to take it.

So total = pending + processing + completed + dead-lettered, in a partition and in every
sum of partitions. With one consumer these are that consumer's own figures; with several,
a message stays pending or processing until the least advanced consumer is done with it.
Counts read real rows (range counts on the (partition_id, seq) index), so holes left by
retention or deletes are counted right.
"""
from __future__ import annotations


def partition_figures(pid: str) -> str:
    """A one-row subquery of the figures of partition ``pid`` (an SQL expression): total,
    pending, processing, completed, dead_letter, oldest_pending_at (creation time of the
    first message after the least advanced cursor) and min_cursor (that cursor). Use it as ``CROSS JOIN LATERAL {partition_figures('p.id')} f``."""
    return f"""(
    SELECT t.total, a.after_cursor - pr.processing - dl.dead_after AS pending,
           pr.processing, t.total - a.after_cursor - (dl.dead_letter - dl.dead_after) AS completed,
           dl.dead_letter, op.oldest_pending_at, c.min_cursor
    FROM (SELECT coalesce(min(l.cursor_seq), 0) AS min_cursor,
                 min(l.cursor_seq) FILTER (WHERE l.lease_expires_at > now()) AS lease_from,
                 max(l.lease_last_seq) FILTER (WHERE l.lease_expires_at > now()) AS lease_to
          FROM queen.log_consumers l WHERE l.partition_id = {pid}) c
    CROSS JOIN LATERAL (
        SELECT count(*) AS total FROM queen.messages m WHERE m.partition_id = {pid}) t
    CROSS JOIN LATERAL (
        SELECT count(*) AS after_cursor FROM queen.messages m
        WHERE m.partition_id = {pid} AND m.seq > c.min_cursor) a
    CROSS JOIN LATERAL (
        -- distinct messages inside (cursor, lease_last_seq] of some live lease
        SELECT count(*) AS processing FROM queen.messages m
        WHERE c.lease_to IS NOT NULL AND m.partition_id = {pid}
          AND m.seq > c.lease_from AND m.seq <= c.lease_to
          AND EXISTS (SELECT 1 FROM queen.log_consumers l
                      WHERE l.partition_id = {pid} AND l.lease_expires_at > now()
                        AND m.seq > l.cursor_seq AND m.seq <= l.lease_last_seq)
          AND NOT EXISTS (SELECT 1 FROM queen.dead_letter_queue d WHERE d.message_id = m.id)) pr
    CROSS JOIN LATERAL (
        SELECT count(DISTINCT d.message_id) AS dead_letter,
               count(DISTINCT d.message_id) FILTER (WHERE m.seq > c.min_cursor) AS dead_after
        FROM queen.dead_letter_queue d JOIN queen.messages m ON m.id = d.message_id
        WHERE d.partition_id = {pid}) dl
    LEFT JOIN LATERAL (
        SELECT m.created_at AS oldest_pending_at FROM queen.messages m
        WHERE m.partition_id = {pid} AND m.seq > c.min_cursor
        ORDER BY m.seq LIMIT 1) op ON true
)"""
