"""SQL of the operator routes (docs/wire-contract.md §10.4–§10.7, §11, §13, §14, §15):
named, documented statements, like broker/store/sql.py.

Message figures (total / pending / processing / completed / dead-lettered) come from
broker/store/figures_sql.py, the one definition every surface and the stats job share;
they are exact row counts.

Lags. "Messages after a cursor" (a group's offset lag, the depth route) is counted on the
unique (partition_id, seq) index when the range is at most EXACT_COUNT_LIMIT positions
(exact whatever was deleted), and taken as ``last_seq - cursor`` beyond that (exact unless
rows inside the range were deleted; an upper bound otherwise), so the cost stays bounded
on a large backlog.
"""
from __future__ import annotations

from broker.store.figures_sql import partition_figures

EXACT_COUNT_LIMIT = 10_000
"""Longest position range counted row by row (see the module docstring)."""


def after(pid: str, last_seq: str, cursor: str) -> str:
    """SQL for 'messages of partition ``pid`` after position ``cursor``'
    (bounded-cost count; see the module docstring)."""
    return f"""(CASE WHEN {last_seq} <= {cursor} THEN 0::bigint
      WHEN {last_seq} - {cursor} <= {EXACT_COUNT_LIMIT}
      THEN (SELECT count(*) FROM queen.messages mx WHERE mx.partition_id = {pid} AND mx.seq > {cursor})
      ELSE ({last_seq} - {cursor})::bigint END)"""


# -- stats table ---------------------------------------------------------------

STATS_STATE = """
SELECT (SELECT extract(epoch FROM now() - max(s.updated_at))::float8 FROM queen.stats s) AS age,
       EXISTS (SELECT 1 FROM queen.stats s WHERE s.stat_type = 'system') AS ready
"""
"""Seconds since the newest queen.stats row was written (NULL when empty), and
whether the stats job has produced its roll-up yet (a 'system' row exists).
Routes read counters from queen.stats once ``ready``, and compute them from the
base tables before that."""


# -- per-partition counters from the base tables ----------------------------------

_PARTITION_COUNTS = f"""
SELECT q.id AS queue_id, q.name AS queue_name, q.namespace, q.task, q.priority,
       q.created_at AS queue_created_at,
       p.id AS partition_id, p.name AS partition_name, p.created_at, p.last_seq,
       p.last_message_at, p.last_activity,
       coalesce(f.min_cursor, 0) AS eff_cursor,
       coalesce(f.total, 0) AS total, coalesce(f.pending, 0) AS pending,
       coalesce(f.processing, 0) AS processing, coalesce(f.completed, 0) AS completed,
       coalesce(f.dead_letter, 0) AS dead_letter, f.oldest_pending_at
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN LATERAL {partition_figures('p.id')} f ON p.id IS NOT NULL
"""
# One row per partition (a queue without partitions gives one row with NULL
# partition columns and zero counters), with the figures of
# broker/store/figures_sql.py: the same statement the stats job counts with.

PARTITIONS_LIVE = f"""
WITH pc AS ({_PARTITION_COUNTS}
    WHERE p.id IS NOT NULL AND ($1::text IS NULL OR q.name = $1)
)
SELECT * FROM pc
WHERE pending >= $2
ORDER BY queue_name, partition_name
LIMIT $3 OFFSET $4
"""
"""GET /resources/partitions: partitions (of queue $1, or all) with at least
$2 pending messages, exact counters from the base tables; page $3/$4."""


def _dimension_live(dim: str) -> str:
    return f"""
WITH pc AS ({_PARTITION_COUNTS})
SELECT {dim} AS key, count(DISTINCT queue_id) AS queues, count(partition_id) AS partitions,
       sum(total)::bigint AS total, sum(pending)::bigint AS pending,
       sum(processing)::bigint AS processing, sum(completed)::bigint AS completed,
       sum(dead_letter)::bigint AS dead_letter
FROM pc WHERE {dim} <> ''
GROUP BY {dim} ORDER BY {dim}
"""


def _dimension_from_stats(dim: str) -> str:
    return f"""
WITH base AS (
    SELECT q.{dim} AS key, count(DISTINCT q.id) AS queues, count(p.id) AS partitions
    FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id
    WHERE q.{dim} <> '' GROUP BY q.{dim}
)
SELECT b.key, b.queues, b.partitions,
       coalesce(s.total_messages, 0) AS total, coalesce(s.pending_messages, 0) AS pending,
       coalesce(s.processing_messages, 0) AS processing,
       coalesce(s.completed_messages, 0) AS completed,
       coalesce(s.dead_letter_messages, 0) AS dead_letter
FROM base b
LEFT JOIN queen.stats s ON s.stat_type = '{dim}' AND s.stat_key = b.key
ORDER BY b.key
"""


NAMESPACES_LIVE = _dimension_live("namespace")
"""Namespaces (non-empty) with queue/partition counts and message counters
computed from the base tables (before the stats job has run)."""
NAMESPACES_FROM_STATS = _dimension_from_stats("namespace")
"""Namespaces with queue/partition counts from the catalog and message counters
from queen.stats ('namespace' rows)."""
TASKS_LIVE = _dimension_live("task")
"""Tasks, like NAMESPACES_LIVE."""
TASKS_FROM_STATS = _dimension_from_stats("task")
"""Tasks, like NAMESPACES_FROM_STATS ('task' rows)."""

_SCOPE = """($1::text IS NULL OR q.name = $1)
  AND ($2::text IS NULL OR q.namespace = $2)
  AND ($3::text IS NULL OR q.task = $3)"""

MESSAGE_TOTALS_LIVE = f"""
WITH pc AS ({_PARTITION_COUNTS} WHERE {_SCOPE})
SELECT count(DISTINCT queue_id) AS queues, count(partition_id) AS partitions,
       coalesce(sum(total), 0)::bigint AS total, coalesce(sum(pending), 0)::bigint AS pending,
       coalesce(sum(processing), 0)::bigint AS processing,
       coalesce(sum(completed), 0)::bigint AS completed,
       coalesce(sum(dead_letter), 0)::bigint AS dead_letter
FROM pc
"""
"""Message counters over the queues matching queue $1 / namespace $2 / task $3
(NULL = any), from the base tables."""

MESSAGE_TOTALS_FROM_STATS = f"""
SELECT count(DISTINCT q.id) AS queues,
       (SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        WHERE {_SCOPE}) AS partitions,
       coalesce(sum(s.total_messages), 0)::bigint AS total,
       coalesce(sum(s.pending_messages), 0)::bigint AS pending,
       coalesce(sum(s.processing_messages), 0)::bigint AS processing,
       coalesce(sum(s.completed_messages), 0)::bigint AS completed,
       coalesce(sum(s.dead_letter_messages), 0)::bigint AS dead_letter
FROM queen.queues q
LEFT JOIN queen.stats s ON s.stat_type = 'queue' AND s.stat_key = q.name
WHERE {_SCOPE}
"""
"""The same counters summed from queen.stats 'queue' rows."""

CATALOG_COUNTS = """
SELECT (SELECT count(*) FROM queen.queues) AS queues,
       (SELECT count(*) FROM queen.partitions) AS partitions,
       (SELECT count(DISTINCT namespace) FROM queen.queues WHERE namespace <> '') AS namespaces,
       (SELECT count(DISTINCT task) FROM queen.queues WHERE task <> '') AS tasks
"""
"""How many queues, partitions, namespaces and tasks exist (overview)."""

QUEUES_LIVE = f"""
WITH pc AS ({_PARTITION_COUNTS}
    WHERE ($1::text IS NULL OR q.namespace = $1) AND ($2::text IS NULL OR q.task = $2))
SELECT queue_id AS id, queue_name AS name, namespace, task, priority,
       queue_created_at AS created_at, count(partition_id) AS partitions,
       sum(total)::bigint AS total, sum(pending)::bigint AS pending,
       sum(processing)::bigint AS processing, sum(completed)::bigint AS completed,
       sum(dead_letter)::bigint AS dead_letter,
       count(*) OVER () AS full_count
FROM pc
GROUP BY queue_id, queue_name, namespace, task, priority, queue_created_at
ORDER BY queue_created_at DESC, queue_name
LIMIT $3 OFFSET $4
"""
"""GET /status/queues before the stats job ran: queues (namespace $1, task $2)
newest first with live counters; page $3/$4."""

QUEUES_FROM_STATS = """
SELECT q.id, q.name, q.namespace, q.task, q.priority, q.created_at,
       (SELECT count(*) FROM queen.partitions p WHERE p.queue_id = q.id) AS partitions,
       coalesce(s.total_messages, 0) AS total, coalesce(s.pending_messages, 0) AS pending,
       coalesce(s.processing_messages, 0) AS processing,
       coalesce(s.completed_messages, 0) AS completed,
       coalesce(s.dead_letter_messages, 0) AS dead_letter,
       count(*) OVER () AS full_count
FROM queen.queues q
LEFT JOIN queen.stats s ON s.stat_type = 'queue' AND s.stat_key = q.name
WHERE ($1::text IS NULL OR q.namespace = $1) AND ($2::text IS NULL OR q.task = $2)
ORDER BY q.created_at DESC, q.name
LIMIT $3 OFFSET $4
"""
"""GET /status/queues from queen.stats 'queue' rows; page $3/$4."""

QUEUE_PARTITIONS_LIVE = f"""
WITH pc AS ({_PARTITION_COUNTS} WHERE q.name = $1 AND p.id IS NOT NULL)
SELECT pc.*, g.total_messages_consumed, g.total_batches_consumed, g.last_consumed_at,
       g.cursor_updated_at, g.qm_cursor, g.pending_cursor_at, pc.last_message_at AS newest_at
FROM pc
LEFT JOIN LATERAL (
    SELECT sum(l.total_messages_consumed)::bigint AS total_messages_consumed,
           sum(l.total_batches_consumed)::bigint AS total_batches_consumed,
           max(l.last_consumed_at) AS last_consumed_at, max(l.updated_at) AS cursor_updated_at,
           max(l.cursor_seq) FILTER (WHERE l.consumer_group = '__QUEUE_MODE__') AS qm_cursor,
           max(c.created_at) FILTER (WHERE l.cursor_seq < pc.last_seq) AS pending_cursor_at
    FROM queen.log_consumers l
    LEFT JOIN queen.messages c ON c.partition_id = l.partition_id AND c.seq = l.cursor_seq
    WHERE l.partition_id = pc.partition_id
) g ON true
ORDER BY pc.partition_name
"""
"""GET /status/queues/{q}: every partition of queue $1 with exact counters, its
consumer groups' accounting summed (each group once), the newest cursor position
among groups with something left to read, and the newest message time."""

# -- depth --------------------------------------------------------------------------

QUEUE_DEPTH = f"""
SELECT p.name AS partition, p.id, p.last_seq,
       {after('p.id', 'p.last_seq', 'c.cursor')} AS pending
FROM queen.queues q
JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.log_consumers g ON g.partition_id = p.id AND g.consumer_group = $2
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN $2::text IS NULL THEN
            (SELECT coalesce(min(l.cursor_seq), 0)
             FROM queen.log_consumers l WHERE l.partition_id = p.id)
        WHEN g.partition_id IS NOT NULL THEN g.cursor_seq
        ELSE coalesce((SELECT max(m.seq) FROM queen.messages m
                       WHERE m.partition_id = p.id
                         AND m.created_at <= queen.subscription_start($2, q.name, p.name,
                                                                      q.namespace, q.task)), 0)
    END AS cursor
) c
WHERE q.name = $1
ORDER BY p.name
"""
"""Backlog per partition of queue $1: after group $2's cursor (a partition the
group never touched starts where its subscription says: exactly where its
first pop would), or after the least advanced cursor of the partition's consumers
(queue mode included) when $2 is NULL: the lag, in-flight messages included."""

QUEUE_EXISTS = "SELECT id FROM queen.queues WHERE name = $1"
"""The id of queue $1 (NULL: no such queue)."""

QUEUE_CATALOG = "SELECT name, namespace, task FROM queen.queues"
"""Every queue's namespace and task (to place subscriptions)."""

# -- consumer groups ----------------------------------------------------------------

CURSOR_ROWS = f"""
SELECT l.consumer_group, q.name AS queue_name, q.namespace, q.task,
       p.name AS partition_name, p.id AS partition_id, p.last_seq,
       l.cursor_seq, l.lease_id, l.lease_expires_at,
       coalesce(l.lease_expires_at > now(), false) AS lease_active,
       l.total_messages_consumed, l.total_batches_consumed, l.last_consumed_at,
       l.created_at, l.updated_at,
       {after('p.id', 'p.last_seq', 'l.cursor_seq')} AS offset_lag,
       o.created_at AS oldest_unconsumed_at,
       coalesce(extract(epoch FROM now() - o.created_at), 0)::float8 AS time_lag_seconds
FROM queen.log_consumers l
JOIN queen.partitions p ON p.id = l.partition_id
JOIN queen.queues q ON q.id = p.queue_id
LEFT JOIN LATERAL (
    SELECT m.created_at FROM queen.messages m
    WHERE m.partition_id = p.id AND m.seq > l.cursor_seq
    ORDER BY m.seq LIMIT 1
) o ON true
WHERE ($1::text IS NULL OR l.consumer_group = $1)
  AND ($2::text IS NULL OR q.name = $2)
  AND ($3::float8 IS NULL OR o.created_at < now() - make_interval(secs => $3))
ORDER BY l.consumer_group, q.name, p.name
"""
"""Every cursor row (of group $1, queue $2; NULL = all) with its offset lag
(positions after the cursor) and time lag (age of the oldest unconsumed
message, 0 when caught up); with $3, only rows whose oldest unconsumed
message is older than $3 seconds."""

SUBSCRIPTIONS = """
SELECT consumer_group, queue_name, partition_name, namespace, task,
       subscription_mode, subscription_timestamp, created_at
FROM queen.consumer_groups_metadata
WHERE ($1::text IS NULL OR consumer_group = $1)
ORDER BY consumer_group, queue_name, partition_name, namespace, task
"""
"""Stored subscriptions (of group $1, or all)."""

DELETE_GROUP_CURSORS = """
DELETE FROM queen.log_consumers l
USING queen.partitions p, queen.queues q
WHERE l.partition_id = p.id AND p.queue_id = q.id
  AND l.consumer_group = $1 AND ($2::text IS NULL OR q.name = $2)
RETURNING q.name AS queue_name, p.name AS partition_name, p.last_seq
"""
"""Drop group $1's cursor and lease rows (on queue $2, or every queue): its next
pop re-seeds each partition from its subscription."""

DELETE_GROUP_METADATA = """
DELETE FROM queen.consumer_groups_metadata
WHERE consumer_group = $1 AND ($2::text IS NULL OR queue_name = $2)
"""
"""Drop group $1's subscriptions (those naming queue $2, or all of them)."""

GROUP_CONFLATES = """
SELECT conflation FROM queen.group_policies WHERE queue_name = $1 AND consumer_group = $2
"""
"""Whether group $2 conflates on queue $1 (no row: it does not)."""

DELETE_GROUP_POLICIES = """
DELETE FROM queen.group_policies
WHERE consumer_group = $1 AND ($2::text IS NULL OR queue_name = $2)
"""
"""Drop group $1's conflation policies (on queue $2, or every queue): its next pop declares
anew (migration 0013)."""

UPDATE_SUBSCRIPTION = """
UPDATE queen.consumer_groups_metadata SET subscription_timestamp = $2
WHERE consumer_group = $1
"""
"""Rewrite where group $1 starts on partitions it has not consumed yet."""

# The lease's columns, cleared. log_consumers.last_claimed_at is left alone on purpose: the
# scan's claim order (migration 0015) must survive every release, an operator's too.
_RELEASE = """lease_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
    lease_last_seq = NULL, batch_size = 0, acked_count = 0, batch_retry_count = 0,
    updated_at = now()"""

SEEK_QUEUE = f"""
WITH target AS (
    SELECT l.partition_id, l.consumer_group, p.name AS partition_name, p.last_seq,
           l.cursor_seq AS old_seq,
           CASE WHEN $3::boolean THEN p.last_seq
                ELSE coalesce((SELECT max(m.seq) FROM queen.messages m
                               WHERE m.partition_id = p.id AND m.created_at <= $4), 0)
           END AS seq
    FROM queen.log_consumers l
    JOIN queen.partitions p ON p.id = l.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = $2 AND l.consumer_group = $1
    FOR UPDATE OF l
)
UPDATE queen.log_consumers l
SET cursor_seq = t.seq, last_consumed_id = tm.id, last_consumed_created_at = tm.created_at,
    {_RELEASE}
FROM target t
LEFT JOIN queen.messages tm ON tm.partition_id = t.partition_id AND tm.seq = t.seq
WHERE l.partition_id = t.partition_id AND l.consumer_group = t.consumer_group
RETURNING t.partition_name, t.old_seq, t.seq, t.last_seq
"""
"""Seek group $1 on queue $2: each existing cursor row moves to the partition's
newest position ($3 = toEnd) or to the last position created at or before $4
(0 when none); its lease is released. Partitions without a row are left alone."""

SEEK_PARTITION = f"""
WITH pt AS (
    SELECT p.id, p.last_seq FROM queen.partitions p
    JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = $2 AND p.name = $3
)
INSERT INTO queen.log_consumers AS l
    (partition_id, consumer_group, cursor_seq, last_consumed_id, last_consumed_created_at)
SELECT pt.id, $1, pt.last_seq, m.id, m.created_at
FROM pt LEFT JOIN queen.messages m ON m.partition_id = pt.id AND m.seq = pt.last_seq
ON CONFLICT ON CONSTRAINT log_consumers_pkey DO UPDATE SET
    cursor_seq = EXCLUDED.cursor_seq, last_consumed_id = EXCLUDED.last_consumed_id,
    last_consumed_created_at = EXCLUDED.last_consumed_created_at,
    {_RELEASE}
RETURNING l.cursor_seq, l.last_consumed_id, l.last_consumed_created_at
"""
"""Move group $1's cursor on partition $3 of queue $2 to its newest message,
releasing the lease (the row is created when the group had none). No row
returned: no such partition."""

# -- messages ----------------------------------------------------------------------

_MESSAGE_SCOPE = """($1::text IS NULL OR q.name = $1)
      AND ($2::text IS NULL OR p.name = $2)
      AND ($3::text IS NULL OR q.namespace = $3)
      AND ($4::text IS NULL OR q.task = $4)"""

MESSAGES_PAGE = f"""
WITH parts AS (
    SELECT p.id, p.name, q.name AS queue_name, q.namespace, q.task, q.priority,
           qm.cursor_seq AS qm_cursor,
           CASE WHEN qm.lease_expires_at > now() THEN qm.lease_last_seq END AS qm_lease_last,
           qm.lease_expires_at AS qm_lease_expires
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.log_consumers qm
           ON qm.partition_id = p.id AND qm.consumer_group = '__QUEUE_MODE__'
    WHERE {_MESSAGE_SCOPE}
), rows AS (
    SELECT m.id, m.transaction_id, m.partition_id, m.trace_id, m.producer_sub, m.created_at,
           m.seq, pt.name AS partition, pt.queue_name, pt.namespace, pt.task, pt.priority,
           CASE WHEN pt.qm_cursor IS NULL THEN NULL
                WHEN m.seq <= pt.qm_cursor THEN 'completed'
                WHEN m.seq <= pt.qm_lease_last THEN 'processing'
                ELSE 'pending' END AS queue_status,
           CASE WHEN m.seq > pt.qm_cursor AND m.seq <= pt.qm_lease_last
                THEN pt.qm_lease_expires END AS lease_expires_at,
           EXISTS (SELECT 1 FROM queen.dead_letter_queue d WHERE d.message_id = m.id) AS dead,
           b.groups AS bus_groups,
           (SELECT count(*) FROM queen.log_consumers l
            WHERE l.partition_id = m.partition_id AND l.consumer_group <> '__QUEUE_MODE__'
              AND l.cursor_seq >= m.seq) AS consumed_by,
           EXISTS (SELECT 1 FROM queen.log_consumers l
                   WHERE l.partition_id = m.partition_id
                     AND l.consumer_group <> '__QUEUE_MODE__' AND l.lease_expires_at > now()
                     AND m.seq > l.cursor_seq AND m.seq <= l.lease_last_seq) AS bus_processing
    FROM parts pt
    JOIN queen.messages m ON m.partition_id = pt.id
    CROSS JOIN LATERAL (
        SELECT count(*) AS groups FROM queen.log_consumers l
        WHERE l.partition_id = pt.id AND l.consumer_group <> '__QUEUE_MODE__'
    ) b
    WHERE ($5::timestamptz IS NULL OR m.created_at >= $5)
      AND ($6::timestamptz IS NULL OR m.created_at <= $6)
), st AS (
    SELECT r.*, CASE WHEN r.dead THEN 'dead_letter'
                     WHEN r.queue_status IS NOT NULL THEN r.queue_status
                     WHEN r.bus_groups > 0 AND r.consumed_by >= r.bus_groups THEN 'completed'
                     WHEN r.bus_processing THEN 'processing'
                     ELSE 'pending' END AS status
    FROM rows r
)
SELECT * FROM st
WHERE ($7::text IS NULL OR status = $7)
ORDER BY created_at DESC, id DESC
LIMIT $8 OFFSET $9
"""
"""One page of messages, newest first, filtered by queue $1, partition $2,
namespace $3, task $4, created_at in [$5, $6] (NULL = open) and status $7.
Status: 'dead_letter' when any group dead-lettered it (it has a DLQ row, as the
reference answers: the dashboard's dead_letter filter and its purge button rely on
it, also on a partition that queue mode shares with bus groups); else against queue mode's cursor and lease when the
partition has a queue-mode row; else 'completed' once every bus group passed
it, 'processing' under a live bus lease, 'pending' otherwise."""

MESSAGES_MODE = f"""
SELECT coalesce(bool_or(l.consumer_group = '__QUEUE_MODE__'), false) AS has_queue_mode,
       count(DISTINCT l.consumer_group) FILTER (WHERE l.consumer_group <> '__QUEUE_MODE__')
           AS bus_groups
FROM queen.queues q
JOIN queen.partitions p ON p.queue_id = q.id
JOIN queen.log_consumers l ON l.partition_id = p.id
WHERE {_MESSAGE_SCOPE}
"""
"""Whether the partitions in scope are read in queue mode, and by how many
named (bus) groups."""

MESSAGE_DETAIL = """
SELECT m.id, m.transaction_id, m.partition_id, m.trace_id, m.payload, m.is_encrypted,
       m.producer_sub, m.created_at, m.seq,
       p.name AS partition, q.name AS queue_name, q.namespace, q.task,
       q.lease_time, q.retry_limit, q.retry_delay, q.ttl, q.priority
FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE m.partition_id = $1 AND m.transaction_id = $2
"""
"""One message by (partition id, transaction id), with its queue's options."""

MESSAGE_GROUPS = """
SELECT l.consumer_group, l.cursor_seq, l.lease_expires_at, l.lease_last_seq,
       coalesce(l.lease_expires_at > now(), false) AS lease_active
FROM queen.log_consumers l WHERE l.partition_id = $1
ORDER BY l.consumer_group
"""
"""Every group's cursor and lease on partition $1."""

MESSAGE_DEAD_LETTERS = """
SELECT consumer_group, error_message, retry_count, failed_at
FROM queen.dead_letter_queue WHERE message_id = $1
ORDER BY failed_at DESC
"""
"""Dead-letter rows of message $1, newest first."""

MOVE_TO_DLQ = "SELECT queen.move_to_dlq($1::uuid, $2, $3)"
"""Dead-letter message ($1, $2) for queue mode with error $3 (see migration
0003_ops_shapes.sql for the answers)."""

DELETE_MESSAGE = """
DELETE FROM queen.messages WHERE partition_id = $1 AND transaction_id = $2 RETURNING id
"""
"""Delete one message; its DLQ rows and traces go by cascade."""

# -- traces ------------------------------------------------------------------------

INSERT_TRACE = """
WITH msg AS (
    SELECT id, partition_id FROM queen.messages
    WHERE partition_id = queen.partition_ref($1::text) AND transaction_id = $2
), t AS (
    INSERT INTO queen.message_traces
        (message_id, partition_id, transaction_id, consumer_group, event_type, data, worker_id)
    SELECT msg.id, msg.partition_id, $2, $3, $4, $5, $6 FROM msg
    RETURNING id
), n AS (
    INSERT INTO queen.message_trace_names (trace_id, trace_name)
    SELECT t.id, x.name FROM t, unnest($7::text[]) AS x(name)
    ON CONFLICT DO NOTHING
)
SELECT id FROM t
"""
"""Record a trace event on a message (and its names); no row: no such message. The partition
is named by its UUID or its handle (a framed pop's)."""

_TRACE_COLUMNS = """t.id, t.message_id, t.partition_id, t.transaction_id, t.consumer_group,
       t.event_type, t.data, t.worker_id, t.created_at,
       array(SELECT n2.trace_name FROM queen.message_trace_names n2
             WHERE n2.trace_id = t.id ORDER BY n2.trace_name) AS names"""

TRACES_FOR_MESSAGE = f"""
SELECT m.id AS mid, {_TRACE_COLUMNS}
FROM queen.messages m
LEFT JOIN queen.message_traces t ON t.message_id = m.id
WHERE m.partition_id = $1 AND m.transaction_id = $2
ORDER BY t.created_at, t.id
"""
"""A message's trace events, oldest first; no row: no such message, one row
with NULL trace columns: no traces."""

_TRACES_BY_NAME_FILTER = """
FROM queen.message_trace_names n
JOIN queen.message_traces t ON t.id = n.trace_id
WHERE n.trace_name = $1
  AND ($2::timestamptz IS NULL OR t.created_at >= $2)
  AND ($3::timestamptz IS NULL OR t.created_at <= $3)
"""

TRACES_BY_NAME_COUNT = "SELECT count(*) " + _TRACES_BY_NAME_FILTER
"""How many trace events carry name $1 (created in [$2, $3])."""

TRACES_BY_NAME = f"""
SELECT {_TRACE_COLUMNS}, p.name AS partition, q.name AS queue, m.payload
FROM queen.message_trace_names n
JOIN queen.message_traces t ON t.id = n.trace_id
LEFT JOIN queen.messages m ON m.id = t.message_id
LEFT JOIN queen.partitions p ON p.id = t.partition_id
LEFT JOIN queen.queues q ON q.id = p.queue_id
WHERE n.trace_name = $1
  AND ($2::timestamptz IS NULL OR t.created_at >= $2)
  AND ($3::timestamptz IS NULL OR t.created_at <= $3)
ORDER BY t.created_at, t.id
LIMIT $4 OFFSET $5
"""
"""One page of the trace events carrying name $1 (created in [$2, $3]), oldest
first, with their queue, partition and the message's stored payload (an
encrypted queue's envelope stays encrypted)."""

TRACE_NAMES = """
SELECT n.trace_name, count(*) AS trace_count, count(DISTINCT t.message_id) AS message_count,
       min(t.created_at) AS first_seen, max(t.created_at) AS last_seen,
       count(*) OVER () AS full_count
FROM queen.message_trace_names n
JOIN queen.message_traces t ON t.id = n.trace_id
WHERE ($1::text IS NULL OR strpos(lower(n.trace_name), lower($1)) > 0)
GROUP BY n.trace_name
ORDER BY max(t.created_at) DESC, n.trace_name
LIMIT $2 OFFSET $3
"""
"""Trace names (containing $1, case-insensitively), most recently used first."""

# -- status / analytics --------------------------------------------------------------

def bucket(col: str, minutes_param: str) -> str:
    """SQL flooring timestamp ``col`` to a bucket of ``minutes_param`` minutes (UTC epoch aligned)."""
    return (f"to_timestamp(floor(extract(epoch FROM {col}) / ({minutes_param} * 60))"
            f" * ({minutes_param} * 60))")


INGEST_SERIES = f"""
SELECT {bucket('m.created_at', '$4::integer')} AS ts, count(*) AS n
FROM queen.queues q
JOIN queen.partitions p ON p.queue_id = q.id
JOIN queen.messages m ON m.partition_id = p.id
WHERE {_SCOPE}
  AND m.created_at >= $5 AND m.created_at <= $6
GROUP BY 1 ORDER BY 1
"""
"""Messages pushed per bucket ($4 minutes) in [$5, $6], for queue $1 /
namespace $2 / task $3."""

DLQ_SERIES = f"""
SELECT {bucket('d.failed_at', '$4::integer')} AS ts, count(*) AS n
FROM queen.dead_letter_queue d
JOIN queen.partitions p ON p.id = d.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE {_SCOPE}
  AND d.failed_at >= $5 AND d.failed_at <= $6
GROUP BY 1 ORDER BY 1
"""
"""Dead letters filed per bucket, same scope and range as INGEST_SERIES."""

PROCESSED_SERIES = f"""
SELECT {bucket('w.bucket_time', '$1::integer')} AS ts,
       coalesce(sum(c.value::numeric), 0)::float8 AS n
FROM queen.worker_metrics w
CROSS JOIN LATERAL jsonb_each_text(w.counters) c
WHERE w.bucket_time >= $2 AND w.bucket_time <= $3
  AND c.key = ANY($4::text[]) AND c.value ~ '^-?[0-9]+(\\.[0-9]+)?$'
GROUP BY 1 ORDER BY 1
"""
"""Messages acknowledged per bucket ($1 minutes) in [$2, $3], cluster-wide: the
collector's worker_metrics counters named in $4 (PROCESSED_COUNTERS), summed."""

PROCESSED_COUNTERS = ["messages.acked_completed", "messages.acked_success", "messages.dlq"]
"""worker_metrics counters (flattened telemetry, actors/leader_jobs.py) that
count processed messages: acks that completed or dead-lettered a message."""


LEASES = f"""
SELECT count(*) AS active, count(DISTINCT l.partition_id) AS partitions,
       coalesce(sum(l.batch_size), 0)::bigint AS batch_size,
       coalesce(sum(l.acked_count), 0)::bigint AS acked
FROM queen.log_consumers l
JOIN queen.partitions p ON p.id = l.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE l.lease_id IS NOT NULL AND l.lease_expires_at > now() AND {_SCOPE}
"""
"""Live leases in scope (queue $1 / namespace $2 / task $3)."""

DLQ_SUMMARY = f"""
SELECT count(*) AS total, count(DISTINCT d.partition_id) AS partitions,
       count(*) FILTER (WHERE d.failed_at >= $4 AND d.failed_at <= $5) AS in_range
FROM queen.dead_letter_queue d
JOIN queen.partitions p ON p.id = d.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE {_SCOPE}
"""
"""Dead letters in scope: total, partitions affected, filed within [$4, $5]."""

DLQ_TOP_ERRORS = f"""
SELECT coalesce(d.error_message, '') AS error, count(*) AS n
FROM queen.dead_letter_queue d
JOIN queen.partitions p ON p.id = d.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE {_SCOPE} AND d.failed_at >= $4 AND d.failed_at <= $5
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10
"""
"""The ten most frequent dead-letter errors within [$4, $5]."""

DLQ_BY_QUEUE = """
SELECT q.name AS queue, count(*) AS n
FROM queen.dead_letter_queue d
JOIN queen.partitions p ON p.id = d.partition_id
JOIN queen.queues q ON q.id = p.queue_id
GROUP BY q.name ORDER BY q.name
"""
"""Dead letters per queue (prometheus queen_dlq_depth_by_queue)."""

QUEUE_STATS_ROWS = """
SELECT stat_key AS queue, total_messages AS total, pending_messages AS pending,
       processing_messages AS processing, completed_messages AS completed,
       dead_letter_messages AS dead_letter
FROM queen.stats WHERE stat_type = 'queue' ORDER BY stat_key
"""
"""Per-queue message figures from queen.stats (/metrics, /metrics/prometheus)."""

LIVE_LEASE_COUNT = """
SELECT count(*) FROM queen.log_consumers WHERE lease_id IS NOT NULL AND lease_expires_at > now()
"""
"""Live (partition, group) leases, cluster-wide (on the partial lease index)."""


