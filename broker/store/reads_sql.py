"""SQL of the offset reads (POST /api/v1/fetch) and of partition discovery
(POST /api/v1/partitions/changed). Neither takes a lease or moves a cursor."""

FETCH = "SELECT * FROM queen.fetch_v1($1, $2, $3, $4, $5, $6)"
"""Entries (parallel arrays: queue, partition, offset, byte budget), the call's byte
budget and the most records per entry; see queen.fetch_v1 in the migrations."""

SAFE_TIME = """
SELECT least(clock_timestamp(),
             (SELECT min(a.xact_start) FROM pg_stat_activity a
              WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                AND a.xact_start IS NOT NULL)) AS safe
"""
"""The discovery answer's ``safeTime``, read BEFORE the scan, in a statement of its own.

A push stamps ``partitions.last_message_at`` with ``now()``, its transaction's start
time, and becomes visible only when it commits. A write the scan (a later snapshot)
does not see belongs to a transaction that had not committed when the scan began: if
it had started before this statement, it was open here, so its start (= its stamp) is
at or after this minimum; if it started after, its stamp is after this clock reading.
Either way its stamp is >= safeTime, and a next call with ``since = safeTime`` finds it.
Long transactions hold safeTime back; they never make it unsafe. (pg_stat_activity
shows ``xact_start`` of other roles' sessions only to members of pg_read_all_stats:
the broker's own role is the one that writes.)"""

CHANGED_PARTITIONS = """
SELECT pt.id, pt.name, pt.last_seq, pt.last_message_at, pt.created_at,
       (SELECT min(m.seq) FROM queen.messages m WHERE m.partition_id = pt.id) AS first_seq
FROM queen.partitions pt
WHERE pt.queue_id = $1
  AND ($2::timestamptz IS NULL OR pt.last_message_at >= $2)
  AND ($3::timestamptz IS NULL OR (pt.created_at, pt.id) > ($3, $4::uuid))
ORDER BY pt.created_at, pt.id
LIMIT $5
"""
"""One page of a queue's partitions written at or after $2 (NULL: all of them), in
creation order, after the page cursor ($3, $4)."""

QUEUE_ID = "SELECT id FROM queen.queues WHERE name = $1"
