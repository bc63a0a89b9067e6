"""The data path's SQL statements, as named and documented blocks (operator
queries are in ops_sql.py, the leader jobs' in jobs_sql.py, the message
figures in figures_sql.py, the schema in the numbered migrations/).

The heavy lifting of push, pop and ack lives in server-side functions
(migrations/0001_base.sql, part 3) so that each request is a single round trip.
"""
from broker.store.figures_sql import partition_figures

# The data path's calls are written compactly: asyncpg checks every element of an array
# argument against three collections.abc ABCs (a Python-level call each) before encoding it,
# so a column whose elements are all equal goes as one scalar and the statement fills the
# array (array_fill), and the item index is generated (generate_series). $1 is the item
# count; an ``$a::t[], $s::t`` pair is (array, NULL) or (NULL, the one value). One prepared
# statement serves both forms. Measured on push_ordered_v4 at 100 items: 325 -> 189 us of
# client CPU per call and 10 % less wall time (benchmarks/README.md, "The hot path, change by change").

PUSH_ORDERED = """
SELECT idx, message_id, partition_id, status, late, peer, error
FROM queen.push_ordered_v6(
    ARRAY(SELECT generate_series(0, $1 - 1)),
    coalesce($2::text[], array_fill($3::text, ARRAY[$1])),
    coalesce($4::text[], array_fill($5::text, ARRAY[$1])),
    $6::uuid[], $7::text[],
    coalesce($8::uuid[], array_fill(NULL::uuid, ARRAY[$1])),
    $9::text[],
    coalesce($10::boolean[], array_fill(false, ARRAY[$1])),
    coalesce($11::text[], array_fill($12::text, ARRAY[$1])),
    array_fill($13::bigint, ARRAY[$1]),
    $14, $15, $16,
    coalesce($17::bigint[], array_fill($18::bigint, ARRAY[$1])))
"""
"""Insert items (parallel arrays, compact: see above; args from ``codecs.push_call``),
aware of staging and of the cluster-wide spool backlog, checking queues' maxSize; one row
per item: 'queued', 'duplicate', 'staged' (into queen.staged, behind earlier staged or
spooled pushes to its partition, or while the database settles after a restart;
queen.merge_staged moves it on), or 'refused' (its request's items would take the queue's
depth past maxSize; ``error`` says so). Items with a NULL request ($17/$18) are not checked
(migrations/0011_queue_limits.sql). A call whose items go to existing partitions of queues
without maxSize takes a fast path: push_ordered_v5's for one partition (migration 0017), v6's
for several, as a folded call's usually are (migration 0019)."""

UPLOAD_LEDGER = """
INSERT INTO queen.uploaded_files (spool_id, file_ms, file_seq, events)
VALUES ($1, $2, $3, $4)
ON CONFLICT (spool_id, file_ms, file_seq) DO NOTHING
RETURNING true
"""
"""Record a spool file's upload, first in its transaction; no row: uploaded before."""

STAGED_COLUMNS = ("accept_us", "spool_id", "file_ms", "file_seq", "rec_no", "queue_name",
                  "partition_name", "message_id", "transaction_id", "trace_id", "payload",
                  "is_encrypted", "producer_sub")
"""The columns of queen.staged an upload COPYs, in this order."""

STAGE_COUNT = "SELECT queen.stage_count($1, $2, $3)"
"""Count newly staged rows per (queue, partition), and hold those partitions."""

PRUNE_UPLOADED = """
DELETE FROM queen.uploaded_files
WHERE spool_id = $1 AND (file_ms, file_seq) < ($2, $3)
"""
"""Forget a spool's uploaded files older than the one being uploaded: the drain goes
oldest first and stops at a file it cannot finish, so those are gone from its disk."""

MERGE_STAGED = """
SELECT queue_name, partition_name, partition_id, merged, duplicates, late
FROM queen.merge_staged($1, $2, $3, $4)
"""
"""One merge batch (see queen.merge_staged): one row per (queue, partition) touched."""

STAGING_SUMMARY = """
SELECT coalesce(sum(staged), 0)::bigint AS events, count(*) AS partitions
FROM queen.staged_partitions
"""
"""Staged events not merged yet, and over how many partitions."""

SPOOL_REGISTER = "SELECT queen.spool_register($1, $2, $3, $4, $5)"
"""Replace this broker's rows in queen.spool_backlog (NULL arrays: heartbeat only)."""

SPOOL_BACKLOG_SUMMARY = """
SELECT b.server_id, count(*) AS partitions, min(b.oldest_accept_us) AS oldest_accept_us,
       max(s.seen_at) AS seen_at
FROM queen.spool_backlog b LEFT JOIN queen.spool_servers s USING (server_id)
GROUP BY b.server_id ORDER BY b.server_id
"""
"""Which brokers hold spooled pushes for how many partitions (the maintenance body)."""

POP = """
SELECT kind, queue_name, partition_name, partition_id, message_id, transaction_id, trace_id,
       payload::text AS payload, is_encrypted, producer_sub,
       (extract(epoch FROM created_at) * 1000000)::bigint AS created_us, seq, retry_count,
       verdict, verdict_secs, retired
FROM queen.pop_messages_v5($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) WITH ORDINALITY AS p
ORDER BY p.ordinality
"""
"""Claim partitions and read messages, conflating for groups whose policy says so (see
queen.pop_messages_v2, migration 0013), the partitions the group claimed least recently
first (queen.pop_messages_v3, migration 0015), its statements planned once per connection
(queen.pop_messages_v5, migration 0018). Each payload comes as its JSON text, which both pop
answers put in as it is, and each creation time as microseconds since the Unix epoch (an
integer costs asyncpg far less to read than a datetime, and the answers want text or
microseconds, never a datetime)."""

GROUP_POLICY = """
WITH stored AS (
    INSERT INTO queen.group_policies (queue_name, consumer_group, conflation)
    VALUES ($1, $2, $3)
    ON CONFLICT (queue_name, consumer_group) DO NOTHING
    RETURNING conflation
)
SELECT conflation FROM stored
UNION ALL
SELECT conflation FROM queen.group_policies WHERE queue_name = $1 AND consumer_group = $2
LIMIT 1
"""
"""A group's conflation policy on a queue: stored on first contact as declared ($3), then
what is stored (migration 0013)."""

GROUP_POLICY_SCOPE = """
WITH matched AS (
    SELECT name FROM queen.queues
    WHERE ($1::text IS NULL OR namespace = $1) AND ($2::text IS NULL OR task = $2)
), stored AS (
    INSERT INTO queen.group_policies (queue_name, consumer_group, conflation)
    SELECT name, $3, $4 FROM matched
    ON CONFLICT (queue_name, consumer_group) DO NOTHING
    RETURNING conflation
)
SELECT coalesce(bool_or(NOT p.conflation), false) AS any_plain
FROM (SELECT conflation FROM stored
      UNION ALL
      SELECT gp.conflation FROM queen.group_policies gp JOIN matched m ON m.name = gp.queue_name
      WHERE gp.consumer_group = $3) AS p
"""
"""A discovery pop's declaration ($4) stored for group $3 on every queue of namespace $1 /
task $2 that has none; whether any of them is stored as not conflating (migration 0013)."""

PARTITION_HANDLES = "SELECT id, handle FROM queen.partitions WHERE id = ANY($1::uuid[])"
"""The u64 handles of partitions (migration 0012), by id."""

PENDING_PARTITIONS = """
SELECT pt.name
FROM queen.queues q
JOIN queen.partitions pt ON pt.queue_id = q.id
LEFT JOIN queen.log_consumers l ON l.partition_id = pt.id AND l.consumer_group = $2
WHERE q.name = $1 AND pt.last_seq > coalesce(l.cursor_seq, 0)
ORDER BY pt.last_message_at
LIMIT $3
"""
"""Partitions of a queue with something beyond a group's cursor (or no cursor
yet): the hot-list's cold start and periodic reseed."""

_ACK_CALL = """
SELECT * FROM queen.ack_messages_v5(
    ARRAY(SELECT generate_series(0, $1 - 1)), $2::text[], {partitions},
    coalesce($4::text[], array_fill($5::text, ARRAY[$1])),
    coalesce($6::text[], array_fill($7::text, ARRAY[$1])),
    coalesce($8::text[], array_fill($9::text, ARRAY[$1])),
    coalesce($10::uuid[], array_fill($11::uuid, ARRAY[$1])),
    $12)
"""

ACK = _ACK_CALL.format(partitions="$3::uuid[]")
"""Apply acknowledgements (parallel arrays, compact as PUSH_ORDERED; args from
``codecs.ack_call``); one row per item. A (partition, group) whose items all complete its live
lease is applied in one UPDATE (queen.ack_messages_v4, migration 0017), which also checks
them (queen.ack_messages_v5, migration 0018). A failed ack that sends a batch back holds the
partition for that group for the queue's retryDelay."""

ACK_BY_REF = _ACK_CALL.format(partitions="queen.partition_refs($3::text[])")
"""ACK for a batch in which some partition is named by its handle (a framed pop's), not its
UUID: queen.partition_refs resolves them in the statement (migration 0012)."""

ENSURE_SUBSCRIPTION = """
INSERT INTO queen.consumer_groups_metadata
    (consumer_group, queue_name, partition_name, namespace, task,
     subscription_mode, subscription_timestamp)
VALUES ($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now()))
ON CONFLICT (consumer_group, queue_name, partition_name, namespace, task) DO NOTHING
"""
"""Store a named group's subscription the first time it is seen; never change it."""

EXTEND_LEASE = """
UPDATE queen.log_consumers
SET lease_expires_at = greatest(lease_expires_at, now() + make_interval(secs => $2)),
    updated_at = now()
WHERE lease_id = $1 AND lease_expires_at > now()
RETURNING lease_expires_at
"""
"""Renew every still-live (partition, group) row holding this lease."""

EXPIRE_ORPHANED_LEASES = """
UPDATE queen.log_consumers
SET lease_expires_at = now(), updated_at = now()
WHERE lease_id = ANY($1::uuid[]) AND lease_expires_at > now()
"""
"""End leases no consumer ever received: a pop whose connection was lost after
PostgreSQL may have committed its claim (the client got a 503, or the long poll
went on with a new lease id). Their partitions are claimable again at once
instead of after the lease time."""

LEASE_KNOWN = "SELECT EXISTS (SELECT 1 FROM queen.log_consumers WHERE lease_id = $1)"
"""Does any (partition, group) row still name this lease (live or expired)?"""

LIVE_LEASES = """
SELECT DISTINCT lease_id FROM queen.log_consumers
WHERE lease_id = ANY($1::uuid[]) AND lease_expires_at > now()
"""
"""Which of these lease ids are live right now."""

QUEUE_ENCRYPTION_FLAGS = """
SELECT name, encryption_enabled FROM queen.queues WHERE name = ANY($1::text[])
"""

SYSTEM_FLAGS = """
SELECT key, coalesce((value->>'enabled')::boolean, false) AS enabled
FROM queen.system_state WHERE key IN ('maintenance_mode', 'pop_maintenance_mode')
"""
"""Both maintenance flags (a missing or malformed value reads as off)."""

SET_SYSTEM_FLAG = """
INSERT INTO queen.system_state (key, value, updated_at)
VALUES ($1, jsonb_build_object('enabled', $2::boolean), now())
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
"""
"""Persist one maintenance flag ('maintenance_mode' | 'pop_maintenance_mode')."""

QUEUE_OPTIONS = (
    # (wire name, column, SQL type, default)
    ("priority", "priority", "integer", 0),
    ("leaseTime", "lease_time", "integer", 300),
    ("retryLimit", "retry_limit", "integer", 3),
    ("retryDelay", "retry_delay", "integer", 0),  # 1000 before 0011, never applied
    ("maxSize", "max_size", "integer", 0),
    ("ttl", "ttl", "integer", 3600),
    # Dead-lettering past retryLimit is always on: true is the truth (migration 0016), and
    # configure never stores false (broker/http/wire/queues.py).
    ("deadLetterQueue", "dead_letter_queue", "boolean", True),
    ("dlqAfterMaxRetries", "dlq_after_max_retries", "boolean", True),
    ("delayedProcessing", "delayed_processing", "integer", 0),
    ("windowBuffer", "window_buffer", "integer", 0),
    ("retentionSeconds", "retention_seconds", "integer", 0),
    ("completedRetentionSeconds", "completed_retention_seconds", "integer", 0),
    ("retentionEnabled", "retention_enabled", "boolean", False),
    ("encryptionEnabled", "encryption_enabled", "boolean", False),
    ("maxWaitTimeSeconds", "max_wait_time_seconds", "integer", 0),
)
"""Every queue option: its wire name, column, type and default."""


def _configure_queue_sql() -> str:
    # $1 name, $2 namespace, $3 task, then one parameter per option. A NULL
    # parameter means "left out": a new queue takes the default, an existing
    # queue keeps its current value.
    cols = ", ".join(col for _, col, _, _ in QUEUE_OPTIONS)
    values = ", ".join(f"coalesce(${i}::{typ}, {str(d).lower()})"
                       for i, (_, _, typ, d) in enumerate(QUEUE_OPTIONS, start=4))
    updates = ",\n        ".join(f"{col} = coalesce(${i}::{typ}, q.{col})"
                                  for i, (_, col, typ, _) in enumerate(QUEUE_OPTIONS, start=4))
    return f"""
WITH q AS (
    INSERT INTO queen.queues AS q (name, namespace, task, {cols})
    VALUES ($1, coalesce($2::text, split_part($1, '.', 1)), coalesce($3::text, split_part($1, '.', 2)),
            {values})
    ON CONFLICT (name) DO UPDATE SET
        namespace = coalesce($2::text, q.namespace),
        task = coalesce($3::text, q.task),
        {updates},
        updated_at = now()
    RETURNING q.*
), p AS (
    INSERT INTO queen.partitions (queue_id, name)
    SELECT id, 'Default' FROM q
    ON CONFLICT (queue_id, name) DO UPDATE SET last_activity = now()
    RETURNING id
)
SELECT q.*, p.id AS default_partition_id FROM q, p
"""


CONFIGURE_QUEUE = _configure_queue_sql()
"""Upsert a queue (options left out keep their values; a new queue gets the
defaults) and make sure its Default partition exists."""

QUEUE_BY_NAME = "SELECT * FROM queen.queues WHERE name = $1"

QUEUE_EXISTS = "SELECT EXISTS (SELECT 1 FROM queen.queues WHERE name = $1)"

DELETE_QUEUE = """
WITH gone AS (DELETE FROM queen.queues WHERE name = $1 RETURNING 1)
SELECT count(*) > 0 FROM gone
"""
"""Delete a queue; partitions, messages, cursors and DLQ rows go by cascade."""

_FIGURE_SUMS = """coalesce(sum(f.total), 0)::bigint AS total,
       coalesce(sum(f.pending), 0)::bigint AS pending,
       coalesce(sum(f.processing), 0)::bigint AS processing,
       coalesce(sum(f.completed), 0)::bigint AS completed,
       coalesce(sum(f.dead_letter), 0)::bigint AS dead_letter"""

LIST_QUEUES = f"""
SELECT q.id, q.name, q.namespace, q.task, q.priority, q.created_at,
       count(p.id) AS partitions, {_FIGURE_SUMS}
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN LATERAL {partition_figures('p.id')} f ON p.id IS NOT NULL
GROUP BY q.id
ORDER BY q.created_at DESC
"""
"""Queues, newest first, with exact (not cached) message figures (figures_sql.py)."""

QUEUE_PARTITION_STATS = f"""
SELECT p.id, p.name, p.created_at, p.last_seq,
       f.total, f.pending, f.processing, f.completed, f.dead_letter,
       (SELECT min(m.created_at) FROM queen.messages m WHERE m.partition_id = p.id) AS oldest,
       (SELECT max(m.created_at) FROM queen.messages m WHERE m.partition_id = p.id) AS newest
FROM queen.partitions p
CROSS JOIN LATERAL {partition_figures('p.id')} f
WHERE p.queue_id = $1
ORDER BY p.name
"""
"""Per-partition message figures of a queue (figures_sql.py), exact."""

_DLQ_FILTER = """
FROM queen.dead_letter_queue d
JOIN queen.messages m ON m.id = d.message_id
JOIN queen.partitions p ON p.id = d.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE ($1::text IS NULL OR q.name = $1)
  AND ($2::text IS NULL OR p.name = $2)
  AND ($3::text IS NULL OR d.consumer_group = $3)
  AND ($4::timestamptz IS NULL OR d.failed_at >= $4)
  AND ($5::timestamptz IS NULL OR d.failed_at <= $5)
"""

DLQ_COUNT = "SELECT count(*) " + _DLQ_FILTER
"""How many dead letters match the filters (queue, partition, group, from, to)."""

DLQ_PAGE = """
SELECT d.id, m.transaction_id, d.partition_id, q.name AS queue, p.name AS partition,
       d.consumer_group, d.error_message, d.retry_count, m.payload, m.is_encrypted,
       m.producer_sub, m.created_at, d.failed_at
""" + _DLQ_FILTER + """
ORDER BY d.failed_at DESC, d.id
LIMIT $6 OFFSET $7
"""
"""One page of dead letters, newest failure first."""

RETRY_DLQ = """
WITH dead AS (
    DELETE FROM queen.dead_letter_queue d
    USING queen.messages m
    WHERE d.message_id = m.id AND m.partition_id = $1::uuid AND m.transaction_id = $2
    RETURNING d.consumer_group, m.id AS message_id
)
SELECT dead.consumer_group, m.transaction_id, m.trace_id, m.payload, m.is_encrypted,
       m.producer_sub, p.name AS partition, q.name AS queue
FROM dead
JOIN queen.messages m ON m.id = dead.message_id
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
"""
"""Remove a message's dead-letter rows; returns what is needed to push a copy."""
