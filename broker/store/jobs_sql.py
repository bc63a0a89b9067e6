"""Every SQL statement of the background jobs (actors/leader_jobs.py), named and
documented. docs/behaviour.md §7; the tables' contracts are in migrations/0001_base.sql (part 2).

Three jobs:

* the retention sweep, gated by the session advisory lock 737001, runs each
  step as an autocommitting statement on one dedicated connection;
* the stats reconciler, gated by the transaction advisory lock 737002, runs
  its statements in one transaction (the lock goes with the COMMIT);
* the metrics collector, ungated, upserts this replica's own rows.
"""
from __future__ import annotations

from broker.store.figures_sql import partition_figures

RETENTION_LOCK_ID = 737001
"""Session advisory lock of the retention sweep (docs/behaviour.md §7.1)."""

STATS_LOCK_ID = 737002
"""Transaction advisory lock of the stats reconciler (docs/behaviour.md §7.2)."""

# ---------------------------------------------------------------------------
# Locks
# ---------------------------------------------------------------------------

TRY_SESSION_LOCK = "SELECT pg_try_advisory_lock($1::bigint)"
"""Take a session advisory lock without waiting: true when taken."""

SESSION_UNLOCK = "SELECT pg_advisory_unlock($1::bigint)"
"""Release a session advisory lock: false when this session did not hold it."""

TRY_XACT_LOCK = "SELECT pg_try_advisory_xact_lock($1::bigint)"
"""Take a transaction advisory lock without waiting (released at COMMIT/ROLLBACK)."""

# ---------------------------------------------------------------------------
# Retention sweep (lock 737001). Each DELETE removes at most $1 rows across all
# eligible partitions and returns (partition_id, deleted) per partition that
# lost rows; the job repeats a statement until it deletes fewer than $1.
# Message deletions mark their partitions in queen.stats_dirty (trigger), so the
# stats reconciler recounts them.
# ---------------------------------------------------------------------------

_DELETE_VICTIMS = """
, gone AS (
    DELETE FROM queen.messages m
    USING victims v
    WHERE m.id = v.id
    RETURNING m.partition_id
)
SELECT partition_id, count(*) AS deleted FROM gone GROUP BY partition_id
"""

RETENTION_DELETE_EXPIRED = """
WITH victims AS (
    SELECT m.id
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    CROSS JOIN LATERAL (
        SELECT m.id FROM queen.messages m
        WHERE m.partition_id = p.id
          AND m.created_at < now() - make_interval(secs => q.retention_seconds)
        ORDER BY m.created_at
        LIMIT $1) m
    WHERE q.retention_enabled AND q.retention_seconds > 0
    LIMIT $1
)""" + _DELETE_VICTIMS
"""Retention: on queues with retention_enabled and retention_seconds > 0, delete
up to $1 messages created more than retention_seconds ago, consumed or not."""

RETENTION_DELETE_COMPLETED = """
WITH floors AS (
    -- the least advanced cursor of every consumer group of the partition; a
    -- partition without cursor rows, or with a group still at the beginning
    -- (cursor 0), has nothing every group consumed
    SELECT p.id, q.completed_retention_seconds AS secs, min(l.cursor_seq) AS floor_seq
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    JOIN queen.log_consumers l ON l.partition_id = p.id
    WHERE q.retention_enabled AND q.completed_retention_seconds > 0
    GROUP BY p.id, q.completed_retention_seconds
    HAVING min(l.cursor_seq) > 0
), victims AS (
    SELECT m.id
    FROM floors f
    CROSS JOIN LATERAL (
        SELECT m.id FROM queen.messages m
        WHERE m.partition_id = f.id AND m.seq <= f.floor_seq
          AND m.created_at < now() - make_interval(secs => f.secs)
        ORDER BY m.seq
        LIMIT $1) m
    LIMIT $1
)""" + _DELETE_VICTIMS
"""Completed retention: on queues with retention_enabled and
completed_retention_seconds > 0, delete up to $1 messages older than that which
every consumer group of their partition has consumed (position at or before the
smallest cursor). Cursors only move forward, so a cursor read in this statement's
snapshot can only understate what was consumed: nothing unconsumed is deleted."""

RETENTION_EVICT_MAX_WAIT = """
WITH floors AS (
    SELECT p.id, q.max_wait_time_seconds AS secs,
           coalesce((SELECT min(l.cursor_seq) FROM queen.log_consumers l
                     WHERE l.partition_id = p.id), 0) AS floor_seq
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    WHERE q.max_wait_time_seconds > 0
), victims AS (
    SELECT m.id
    FROM floors f
    CROSS JOIN LATERAL (
        SELECT m.id FROM queen.messages m
        WHERE m.partition_id = f.id AND m.seq > f.floor_seq
          AND m.created_at < now() - make_interval(secs => f.secs)
        ORDER BY m.created_at
        LIMIT $1) m
    LIMIT $1
)""" + _DELETE_VICTIMS
"""Max-wait eviction: on queues with max_wait_time_seconds > 0 (retention_enabled
or not), delete up to $1 messages older than that which some consumer group has
not consumed (after the smallest cursor), or which no group has consumed (no
cursor rows: floor 0)."""

RETENTION_HISTORY_INSERT = """
INSERT INTO queen.retention_history
    (partition_id, queue_name, partition_name, messages_deleted, retention_type)
SELECT x.pid, q.name, p.name, x.n, $3
FROM unnest($1::uuid[], $2::bigint[]) AS x(pid, n)
LEFT JOIN queen.partitions p ON p.id = x.pid
LEFT JOIN queen.queues q ON q.id = p.queue_id
"""
"""One retention_history row per partition that lost rows in this cycle
($1 partition ids, $2 counts, $3 'retention' | 'completed_retention' |
'max_wait_time_eviction')."""

RETENTION_DELETE_INACTIVE_PARTITIONS = """
WITH victims AS (
    SELECT p.id
    FROM queen.partitions p
    WHERE p.created_at < now() - make_interval(days => $1)
      AND p.last_activity < now() - make_interval(days => $1)
      AND NOT EXISTS (SELECT 1 FROM queen.messages m WHERE m.partition_id = p.id)
      AND NOT EXISTS (SELECT 1 FROM queen.log_consumers l
                      WHERE l.partition_id = p.id
                        AND greatest(l.created_at, l.last_consumed_at)
                            >= now() - make_interval(days => $1))
    LIMIT $2
    FOR UPDATE OF p SKIP LOCKED
), gone AS (
    DELETE FROM queen.partitions p USING victims v WHERE p.id = v.id RETURNING p.id
)
SELECT count(*) FROM gone
"""
"""Inactive partitions: delete up to $2 partitions with no messages whose latest
activity (creation, last push or configure, cursor rows' creation and last
consumption) is older than $1 days; cursor rows and DLQ rows go by cascade. A
partition a push holds is skipped; a push arriving after the delete recreates it
(its INSERT .. ON CONFLICT waits for this statement, then inserts)."""

INACTIVE_PARTITIONS_PER_CYCLE = 1000
"""At most this many inactive partitions are dropped per retention cycle."""


def _purge(table: str, column: str) -> str:
    return f"""
DELETE FROM {table}
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {table}
    WHERE {column} < now() - make_interval(days => $1)
    LIMIT $2))
"""


PURGE_SYSTEM_METRICS = _purge("queen.system_metrics", "timestamp")
"""Delete up to $2 system_metrics rows older than $1 days."""

PURGE_WORKER_METRICS = _purge("queen.worker_metrics", "bucket_time")
"""Delete up to $2 worker_metrics rows older than $1 days."""

PURGE_RETENTION_HISTORY = _purge("queen.retention_history", "executed_at")
"""Delete up to $2 retention_history rows older than $1 days."""

KV_PURGE_DEAD = """
WITH gone AS (
    SELECT k.namespace, k.key FROM queen.kv k
    WHERE k.expires_at IS NOT NULL AND k.expires_at <= now()
    ORDER BY k.expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED
)
DELETE FROM queen.kv k USING gone g WHERE k.namespace = g.namespace AND k.key = g.key
"""
"""Delete up to $1 dead key/value rows (expired, deleted, or placeholders of writes that
did not apply). Readers never see them as live anyway; this only frees the space. A
row a writer holds is skipped (next cycle)."""

PURGE_QUEUE_METRICS = _purge("queen.queue_metrics", "bucket_time")
"""Delete up to $2 queue_metrics rows older than $1 days."""

PURGE_PARTITION_EVENTS = _purge("queen.partition_events", "bucket_time")
"""Delete up to $2 partition_events rows older than $1 days."""

METRICS_PURGES = (
    ("system_metrics", PURGE_SYSTEM_METRICS),
    ("worker_metrics", PURGE_WORKER_METRICS),
    ("retention_history", PURGE_RETENTION_HISTORY),
    ("queue_metrics", PURGE_QUEUE_METRICS),
    ("partition_events", PURGE_PARTITION_EVENTS),
)
"""The metrics purge step, table by table (docs/behaviour.md §7.1, METRICS_RETENTION_DAYS)."""

# ---------------------------------------------------------------------------
# Stats reconciler (lock 737002), one transaction per cycle, in this order:
# partitions, partition lag, orphan partitions, queues, namespaces, tasks,
# system. Semantics of the counters: migrations/0001_base.sql (queen.stats).
#
# Which partitions are recounted (all of them when $1 is true, e.g. a first
# cycle on empty stats has no partition rows, so it counts everything):
#   * no partition row yet (new partition, first cycle);
#   * partitions.last_seq differs from the row's scanned_last_seq: a push;
#   * the consumer signature differs from the row's consumer_sig: a cursor
#     moved (ack, dead-lettering), a group appeared, a lease was taken,
#     released, or expired since the count (liveness is `lease_expires_at >
#     now()` evaluated in this statement, so an expiry changes the signature
#     with no write at all);
#   * a mark in queen.stats_dirty: message or DLQ rows were deleted (retention,
#     eviction, DLQ retry, manual deletes); the marks are written by triggers in
#     the deleting transaction and consumed here in the recounting one;
#   * the queue's name/namespace/task or the partition's name changed.
# Nothing here depends on clocks or commit timing: the signature and the
# counts of a partition are taken in the same statement snapshot, and a change
# committed after that snapshot changes last_seq, the signature or leaves a
# mark, so the next cycle sees it. Every count reads real rows (index range
# counts on (partition_id, seq)), never last_seq arithmetic, so holes left by
# retention are counted right.
# ---------------------------------------------------------------------------

STATS_REFRESH_PARTITIONS = f"""
WITH dirty AS (
    DELETE FROM queen.stats_dirty RETURNING partition_id
),
cursors AS (
    SELECT l.partition_id,
           sum(hashtextextended(
                   l.consumer_group || '|' || l.cursor_seq || '|' ||
                   coalesce((CASE WHEN l.lease_expires_at > now() THEN l.lease_last_seq END)::text, '-'),
                   0)::numeric) AS sig
    FROM queen.log_consumers l
    GROUP BY l.partition_id
),
changed AS (
    SELECT p.id, p.name, p.last_seq, q.name AS queue_name, q.namespace, q.task,
           coalesce(c.sig, 0) AS sig
    FROM queen.partitions p
    JOIN queen.queues q ON q.id = p.queue_id
    LEFT JOIN cursors c ON c.partition_id = p.id
    LEFT JOIN queen.stats s ON s.stat_type = 'partition' AND s.stat_key = p.id::text
    WHERE $1::boolean
       OR s.stat_key IS NULL
       OR s.scanned_last_seq IS DISTINCT FROM p.last_seq
       OR s.consumer_sig IS DISTINCT FROM coalesce(c.sig, 0)
       OR s.queue_name IS DISTINCT FROM q.name
       OR s.namespace IS DISTINCT FROM q.namespace
       OR s.task IS DISTINCT FROM q.task
       OR s.partition_name IS DISTINCT FROM p.name
       OR p.id IN (SELECT d.partition_id FROM dirty d)
),
counted AS (
    -- the figures every surface reports (figures_sql.py), and the newest message
    SELECT ch.*, f.total, f.pending, f.processing, f.completed, f.dead_letter AS dead,
           f.oldest_pending_at AS oldest, nw.newest
    FROM changed ch
    CROSS JOIN LATERAL {partition_figures('ch.id')} f
    LEFT JOIN LATERAL (
        SELECT m.created_at AS newest FROM queen.messages m
        WHERE m.partition_id = ch.id
        ORDER BY m.seq DESC LIMIT 1) nw ON true
),
written AS (
    INSERT INTO queen.stats AS s
        (stat_type, stat_key, queue_name, namespace, task, partition_id, partition_name,
         total_messages, pending_messages, processing_messages, completed_messages,
         dead_letter_messages, oldest_pending_at, newest_message_at, max_lag_seconds,
         child_count, last_scanned_at, updated_at, scanned_last_seq, consumer_sig)
    SELECT 'partition', c.id::text, c.queue_name, c.namespace, c.task, c.id, c.name,
           c.total, c.pending, c.processing, c.completed,
           c.dead, c.oldest, c.newest,
           coalesce(greatest(extract(epoch FROM now() - c.oldest), 0), 0),
           0, now(), now(), c.last_seq, c.sig
    FROM counted c
    ON CONFLICT (stat_type, stat_key) DO UPDATE SET
        queue_name = EXCLUDED.queue_name, namespace = EXCLUDED.namespace,
        task = EXCLUDED.task, partition_id = EXCLUDED.partition_id,
        partition_name = EXCLUDED.partition_name,
        total_messages = EXCLUDED.total_messages,
        pending_messages = EXCLUDED.pending_messages,
        processing_messages = EXCLUDED.processing_messages,
        completed_messages = EXCLUDED.completed_messages,
        dead_letter_messages = EXCLUDED.dead_letter_messages,
        oldest_pending_at = EXCLUDED.oldest_pending_at,
        newest_message_at = EXCLUDED.newest_message_at,
        max_lag_seconds = EXCLUDED.max_lag_seconds,
        last_scanned_at = EXCLUDED.last_scanned_at, updated_at = EXCLUDED.updated_at,
        scanned_last_seq = EXCLUDED.scanned_last_seq, consumer_sig = EXCLUDED.consumer_sig
    RETURNING 1
)
SELECT (SELECT count(*) FROM written) AS recounted,
       (SELECT count(*) FROM dirty) AS dirty_marks
"""
"""Recount the partitions that changed (all of them when $1 is true) and upsert
their rows. oldest_pending_at is the creation time of the first message after
the least advanced cursor and newest_message_at that of the last message, by
position: a push assigns positions and clock_timestamp() creation times under
the partition row lock, so within a partition position order is creation
order. Returns (recounted, dirty_marks)."""

STATS_FRESH = """
SELECT EXISTS (SELECT 1 FROM queen.stats
               WHERE stat_type = 'system' AND stat_key = 'system'
                 AND updated_at > now() - make_interval(secs => $1))
"""
"""Did some replica finish a stats cycle within the last $1 seconds?"""

STATS_REFRESH_PARTITION_LAG = """
UPDATE queen.stats
SET max_lag_seconds = CASE WHEN oldest_pending_at IS NULL THEN 0
                           ELSE greatest(extract(epoch FROM now() - oldest_pending_at), 0) END
WHERE stat_type = 'partition'
  AND (oldest_pending_at IS NOT NULL OR max_lag_seconds IS DISTINCT FROM 0)
"""
"""max_lag_seconds of a partition row = age of its oldest pending message at the
last cycle; ages move without any write, so every row with pending messages is
refreshed (one cheap UPDATE of the stats rows, no message is read)."""

STATS_DELETE_ORPHAN_PARTITIONS = """
DELETE FROM queen.stats s
WHERE s.stat_type = 'partition'
  AND NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = s.partition_id)
"""
"""Drop partition rows whose partition was deleted (queue deletion, cleanup)."""

_ROLLUP_COLUMNS = ("total_messages", "pending_messages", "processing_messages",
                   "completed_messages", "dead_letter_messages")

_ROLLUP_UPSERT_TAIL = """
ON CONFLICT (stat_type, stat_key) DO UPDATE SET
    queue_name = EXCLUDED.queue_name, namespace = EXCLUDED.namespace, task = EXCLUDED.task,
    total_messages = EXCLUDED.total_messages,
    pending_messages = EXCLUDED.pending_messages,
    processing_messages = EXCLUDED.processing_messages,
    completed_messages = EXCLUDED.completed_messages,
    dead_letter_messages = EXCLUDED.dead_letter_messages,
    oldest_pending_at = EXCLUDED.oldest_pending_at,
    newest_message_at = EXCLUDED.newest_message_at,
    max_lag_seconds = EXCLUDED.max_lag_seconds,
    child_count = EXCLUDED.child_count,
    last_scanned_at = EXCLUDED.last_scanned_at, updated_at = EXCLUDED.updated_at
WHERE (s.queue_name, s.namespace, s.task, s.total_messages, s.pending_messages,
       s.processing_messages, s.completed_messages, s.dead_letter_messages,
       s.oldest_pending_at, s.newest_message_at, s.max_lag_seconds, s.child_count)
  IS DISTINCT FROM
      (EXCLUDED.queue_name, EXCLUDED.namespace, EXCLUDED.task, EXCLUDED.total_messages,
       EXCLUDED.pending_messages, EXCLUDED.processing_messages, EXCLUDED.completed_messages,
       EXCLUDED.dead_letter_messages, EXCLUDED.oldest_pending_at, EXCLUDED.newest_message_at,
       EXCLUDED.max_lag_seconds, EXCLUDED.child_count)
RETURNING 1
"""

_SUMS = ",\n           ".join(f"coalesce(sum(s.{c}), 0)::bigint AS {c}" for c in _ROLLUP_COLUMNS)
_INSERT_COLUMNS = """(stat_type, stat_key, queue_name, namespace, task,
         total_messages, pending_messages, processing_messages, completed_messages,
         dead_letter_messages, oldest_pending_at, newest_message_at, max_lag_seconds,
         child_count, last_scanned_at, updated_at)"""
_SELECT_SUMS = ", ".join(f"a.{c}" for c in _ROLLUP_COLUMNS)

STATS_ROLLUP_QUEUES = f"""
WITH agg AS (
    SELECT q.name, q.namespace, q.task, count(p.id) AS children,
           {_SUMS},
           min(s.oldest_pending_at) AS oldest, max(s.newest_message_at) AS newest,
           coalesce(max(s.max_lag_seconds), 0) AS lag
    FROM queen.queues q
    LEFT JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.stats s ON s.stat_type = 'partition' AND s.stat_key = p.id::text
    GROUP BY q.id, q.name, q.namespace, q.task
), written AS (
    INSERT INTO queen.stats AS s {_INSERT_COLUMNS}
    SELECT 'queue', a.name, a.name, a.namespace, a.task, {_SELECT_SUMS},
           a.oldest, a.newest, a.lag, a.children, now(), now()
    FROM agg a
    {_ROLLUP_UPSERT_TAIL}
), orphans AS (
    DELETE FROM queen.stats s
    WHERE s.stat_type = 'queue'
      AND NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = s.stat_key)
    RETURNING 1
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM orphans) AS removed
"""
"""Queue rows = sums of their partition rows (child_count = partitions); rows of
deleted queues are removed. Rows whose figures did not change are not written."""


def _rollup_by(column: str) -> str:
    return f"""
WITH agg AS (
    SELECT q.{column} AS key, count(*) AS children,
           {_SUMS},
           min(s.oldest_pending_at) AS oldest, max(s.newest_message_at) AS newest,
           coalesce(max(s.max_lag_seconds), 0) AS lag
    FROM queen.queues q
    JOIN queen.stats s ON s.stat_type = 'queue' AND s.stat_key = q.name
    WHERE q.{column} <> ''
    GROUP BY q.{column}
), written AS (
    INSERT INTO queen.stats AS s {_INSERT_COLUMNS}
    SELECT '{column}', a.key, NULL,
           {"a.key" if column == "namespace" else "NULL"},
           {"a.key" if column == "task" else "NULL"},
           {_SELECT_SUMS}, a.oldest, a.newest, a.lag, a.children, now(), now()
    FROM agg a
    {_ROLLUP_UPSERT_TAIL}
), orphans AS (
    DELETE FROM queen.stats s
    WHERE s.stat_type = '{column}'
      AND NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.{column} = s.stat_key)
    RETURNING 1
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM orphans) AS removed
"""


STATS_ROLLUP_NAMESPACES = _rollup_by("namespace")
"""Namespace rows = sums of the queue rows of that (non-empty) namespace
(child_count = queues); rows of namespaces no queue has any more are removed."""

STATS_ROLLUP_TASKS = _rollup_by("task")
"""Task rows = sums of the queue rows of that (non-empty) task (child_count =
queues); rows of tasks no queue has any more are removed."""

STATS_ROLLUP_SYSTEM = f"""
WITH a AS (
    SELECT count(*) AS children, {_SUMS},
           min(s.oldest_pending_at) AS oldest, max(s.newest_message_at) AS newest,
           coalesce(max(s.max_lag_seconds), 0) AS lag
    FROM queen.stats s WHERE s.stat_type = 'queue'
), written AS (
    INSERT INTO queen.stats AS s {_INSERT_COLUMNS}
    SELECT 'system', 'system', NULL, NULL, NULL, {_SELECT_SUMS},
           a.oldest, a.newest, a.lag, a.children, now(), now()
    FROM a
    {_ROLLUP_UPSERT_TAIL}
)
SELECT count(*) FROM written
"""
"""The single system row = sums of all queue rows (child_count = queues)."""

# ---------------------------------------------------------------------------
# Metrics collector (ungated): this replica's own rows.
# ---------------------------------------------------------------------------

UPSERT_SYSTEM_METRICS = """
INSERT INTO queen.system_metrics (timestamp, hostname, port, worker_id, sample_count, metrics)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT (timestamp, hostname, port, worker_id) DO UPDATE SET
    sample_count = EXCLUDED.sample_count,
    metrics = EXCLUDED.metrics
"""
"""This replica's row of the minute $1 ($2 hostname, $3 HTTP port, $4 worker id):
sample_count ($5, flushes in this minute) and the metrics JSON ($6) replaced."""

UPSERT_WORKER_METRICS = """
INSERT INTO queen.worker_metrics AS w
    (bucket_time, hostname, worker_id, pid, counters, gauges, updated_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, now())
ON CONFLICT (bucket_time, hostname, worker_id, pid) DO UPDATE SET
    counters = (
        SELECT coalesce(jsonb_object_agg(k.key,
                   coalesce((w.counters ->> k.key)::numeric, 0)
                   + coalesce((EXCLUDED.counters ->> k.key)::numeric, 0)), '{}'::jsonb)
        FROM (SELECT jsonb_object_keys(w.counters) AS key
              UNION SELECT jsonb_object_keys(EXCLUDED.counters)) AS k),
    gauges = EXCLUDED.gauges,
    updated_at = now()
"""
"""This replica's row of the minute $1 ($2 hostname, $3 worker id, $4 pid): the
counters ($5, flat JSON object of numbers: deltas since the previous flush) are
ADDED key by key to what the row holds; the gauges ($6) replace the old ones."""

UPSERT_QUEUE_METRICS = """
INSERT INTO queen.queue_metrics AS m
    (bucket_time, hostname, worker_id, pid, queue_name, push_requests, push_messages,
     pop_requests, pop_messages, pop_empty, ack_requests, ack_success, ack_failed,
     transactions, lag_count, lag_sum_ms, lag_max_ms, parked_avg, parked_max)
SELECT $1, $2, $3, $4, x.* FROM unnest(
    $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[],
    $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[],
    $16::float8[], $17::float8[], $18::float8[], $19::integer[]) AS x
ON CONFLICT (bucket_time, queue_name, hostname, worker_id, pid) DO UPDATE SET
    push_requests = m.push_requests + EXCLUDED.push_requests,
    push_messages = m.push_messages + EXCLUDED.push_messages,
    pop_requests = m.pop_requests + EXCLUDED.pop_requests,
    pop_messages = m.pop_messages + EXCLUDED.pop_messages,
    pop_empty = m.pop_empty + EXCLUDED.pop_empty,
    ack_requests = m.ack_requests + EXCLUDED.ack_requests,
    ack_success = m.ack_success + EXCLUDED.ack_success,
    ack_failed = m.ack_failed + EXCLUDED.ack_failed,
    transactions = m.transactions + EXCLUDED.transactions,
    lag_count = m.lag_count + EXCLUDED.lag_count,
    lag_sum_ms = m.lag_sum_ms + EXCLUDED.lag_sum_ms,
    lag_max_ms = greatest(m.lag_max_ms, EXCLUDED.lag_max_ms),
    parked_avg = coalesce(EXCLUDED.parked_avg, m.parked_avg),
    parked_max = coalesce(EXCLUDED.parked_max, m.parked_max)
"""
"""This replica's per-queue rows of the minute $1 ($2 hostname, $3 worker id, $4
pid), one per queue in $5: the counters $6..$16 (deltas since the previous
flush, in the order of telemetry.QUEUE_COUNTERS) are added, the lag maximum
$17 raised, the parked mean / maximum of the minute ($18, $19) replaced (NULL
keeps what the row holds)."""

UPSERT_METRICS_SUMMARY = """
INSERT INTO queen.worker_metrics_summary AS s (id, counters, updated_at)
VALUES (1, $1::jsonb, now())
ON CONFLICT (id) DO UPDATE SET
    counters = (
        SELECT coalesce(jsonb_object_agg(k.key,
                   coalesce((s.counters ->> k.key)::numeric, 0)
                   + coalesce((EXCLUDED.counters ->> k.key)::numeric, 0)), '{}'::jsonb)
        FROM (SELECT jsonb_object_keys(s.counters) AS key
              UNION SELECT jsonb_object_keys(EXCLUDED.counters)) AS k),
    updated_at = now()
"""
"""Lifetime totals: the counter deltas $1 of one flush added to the single row."""

PARTITION_COUNT_SNAPSHOT = """
INSERT INTO queen.partition_events AS e (bucket_time, queue_name, partition_count)
SELECT date_trunc('minute', now()), s.stat_key, s.child_count
FROM queen.stats s
WHERE s.stat_type = 'queue'
ON CONFLICT (bucket_time, queue_name) DO UPDATE SET partition_count = EXCLUDED.partition_count
    WHERE e.partition_count IS DISTINCT FROM EXCLUDED.partition_count
"""
"""Every queue's partition count from its fresh stats row, as the minute's figure: the
newest count of the minute (a row is rewritten only when the count changed). The first
count of the minute went stale when partitions were created later in the same minute."""
