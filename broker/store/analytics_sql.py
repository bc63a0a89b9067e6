"""SQL of the status and analytics routes that read the metrics collector's tables
(queen.worker_metrics, queen.queue_metrics, queen.system_metrics,
queen.partition_events, queen.worker_metrics_summary) and the retention history.

Buckets: every statement takes the bucket width in minutes and floors the
minute rows to it on the UTC epoch (1, 5, 15, 60 and 360 minutes all line up
with the hour; 360-minute buckets start at 00, 06, 12 and 18 UTC). A row is in
range when ``from <= minute <= to``. No gap filling: a bucket appears only when
a row falls into it.
"""
from __future__ import annotations

from broker.store.ops_sql import bucket


def _w(key: str) -> str:
    """A worker_metrics counter as a number (0 when the row never counted it)."""
    return f"coalesce((w.counters ->> '{key}')::numeric, 0)"


def _g(key: str) -> str:
    """A worker_metrics minute gauge (NULL: not sampled in that minute)."""
    return f"(w.gauges ->> '{key}')::float8"


WORKER_SERIES = f"""
WITH w AS (
    SELECT {bucket('w.bucket_time', '$1::integer')} AS ts, w.*
    FROM queen.worker_metrics w
    WHERE w.bucket_time >= $2 AND w.bucket_time <= $3
      AND ($4::text IS NULL OR w.hostname = $4) AND ($5::integer IS NULL OR w.pid = $5)
), lag AS (
    SELECT {bucket('m.bucket_time', '$1::integer')} AS ts, max(m.lag_max_ms) AS max_lag
    FROM queen.queue_metrics m
    WHERE m.bucket_time >= $2 AND m.bucket_time <= $3
      AND ($4::text IS NULL OR m.hostname = $4) AND ($5::integer IS NULL OR m.pid = $5)
    GROUP BY 1
)
SELECT w.ts,
       sum({_w('ops.push_messages')})::bigint AS push_messages,
       sum({_w('ops.pop_messages')})::bigint AS pop_messages,
       sum({_w('ops.ack_success')} + {_w('ops.ack_failed')})::bigint AS ack_messages,
       sum({_w('ops.push_requests')})::bigint AS push_requests,
       sum({_w('ops.pop_requests')})::bigint AS pop_requests,
       sum({_w('ops.ack_requests')})::bigint AS ack_requests,
       sum({_w('ops.ack_success')})::bigint AS ack_success,
       sum({_w('ops.ack_failed')})::bigint AS ack_failed,
       sum({_w('ops.transactions')})::bigint AS transactions,
       sum({_w('ops.db_errors')})::bigint AS db_errors,
       sum({_w('messages.dlq')})::bigint AS dlq,
       sum({_w('ops.lag_count')})::bigint AS lag_count,
       sum({_w('ops.lag_sum_ms')})::float8 AS lag_sum_ms,
       coalesce(max(lag.max_lag), 0)::float8 AS max_lag_ms,
       avg({_g('event_loop_lag_avg_ms')}) AS loop_lag_avg,
       max({_g('event_loop_lag_max_ms')}) AS loop_lag_max,
       avg({_g('free_slots_avg')}) AS free_slots_avg,
       min({_g('free_slots_min')}) AS free_slots_min,
       max({_g('db_pool_size')}) AS pool_size,
       avg({_g('job_queue_avg')}) AS job_queue_avg,
       max({_g('job_queue_max')}) AS job_queue_max,
       max({_g('backoff_max')}) AS backoff_max
FROM w LEFT JOIN lag ON lag.ts = w.ts
GROUP BY w.ts
ORDER BY w.ts DESC
"""
"""W per bucket ($1 minutes) in [$2, $3] (hostname $4, pid $5; NULL = all), newest
first: counters summed over replicas, minute gauges averaged / maximised /
minimised, the pop lag maximum from queue_metrics."""

SYSTEM_SERIES = f"""
SELECT {bucket('s.timestamp', '$1::integer')} AS ts,
       avg((s.metrics #>> '{{cpu,user_us,avg}}')::float8) AS cpu_user,
       avg((s.metrics #>> '{{cpu,system_us,avg}}')::float8) AS cpu_sys,
       avg((s.metrics #>> '{{memory,rss_bytes,avg}}')::float8) AS rss,
       avg((s.metrics #>> '{{database,pool_active,avg}}')::float8) AS pool_active,
       avg((s.metrics #>> '{{database,pool_idle,avg}}')::float8) AS pool_idle,
       avg((s.metrics #>> '{{database,pool_size,avg}}')::float8) AS pool_size
FROM queen.system_metrics s
WHERE s.timestamp >= $2 AND s.timestamp <= $3
GROUP BY 1
"""
"""S per bucket ($1 minutes) in [$2, $3]: the replicas' minute averages of CPU
(percent x 100), RSS (bytes) and pool figures, averaged (NULL: not sampled)."""

QUEUE_SERIES = f"""
WITH m AS (
    SELECT m.bucket_time, {bucket('m.bucket_time', '$1::integer')} AS ts, m.queue_name,
           sum(m.push_requests) AS push_requests, sum(m.push_messages) AS push_messages,
           sum(m.pop_messages) AS pop_messages, sum(m.pop_empty) AS pop_empty,
           sum(m.ack_requests) AS ack_requests, sum(m.ack_success) AS ack_success,
           sum(m.ack_failed) AS ack_failed, sum(m.transactions) AS transactions,
           sum(m.lag_count) AS lag_count, sum(m.lag_sum_ms) AS lag_sum_ms,
           max(m.lag_max_ms) AS lag_max_ms, sum(m.parked_avg) AS parked
    FROM queen.queue_metrics m
    WHERE m.bucket_time >= $2 AND m.bucket_time <= $3
      AND ($4::text IS NULL OR m.queue_name = $4)
    GROUP BY m.bucket_time, m.queue_name
), mb AS (
    SELECT ts, queue_name,
           sum(push_requests)::bigint AS push_requests, sum(push_messages)::bigint AS push_messages,
           sum(pop_messages)::bigint AS pop_messages, sum(pop_empty)::bigint AS pop_empty,
           sum(ack_requests)::bigint AS ack_requests, sum(ack_success)::bigint AS ack_success,
           sum(ack_failed)::bigint AS ack_failed, sum(transactions)::bigint AS transactions,
           sum(lag_count)::bigint AS lag_count, sum(lag_sum_ms)::float8 AS lag_sum_ms,
           max(lag_max_ms)::float8 AS lag_max_ms, avg(coalesce(parked, 0))::float8 AS parked
    FROM m GROUP BY ts, queue_name
), e AS (
    SELECT {bucket('e.bucket_time', '$1::integer')} AS ts, e.queue_name,
           sum(e.partitions_created)::bigint AS created, sum(e.partitions_deleted)::bigint AS deleted,
           max(e.partition_count)::bigint AS partition_count
    FROM queen.partition_events e
    WHERE e.bucket_time >= $2 AND e.bucket_time <= $3
      AND ($4::text IS NULL OR e.queue_name = $4)
    GROUP BY 1, 2
)
SELECT coalesce(mb.ts, e.ts) AS ts, coalesce(mb.queue_name, e.queue_name) AS queue_name,
       coalesce(mb.push_requests, 0) AS push_requests, coalesce(mb.push_messages, 0) AS push_messages,
       coalesce(mb.pop_messages, 0) AS pop_messages, coalesce(mb.pop_empty, 0) AS pop_empty,
       coalesce(mb.ack_requests, 0) AS ack_requests, coalesce(mb.ack_success, 0) AS ack_success,
       coalesce(mb.ack_failed, 0) AS ack_failed, coalesce(mb.transactions, 0) AS transactions,
       coalesce(mb.lag_count, 0) AS lag_count, coalesce(mb.lag_sum_ms, 0) AS lag_sum_ms,
       coalesce(mb.lag_max_ms, 0) AS lag_max_ms, coalesce(mb.parked, 0) AS parked,
       coalesce(e.created, 0) AS created, coalesce(e.deleted, 0) AS deleted, e.partition_count
FROM mb FULL JOIN e ON e.ts = mb.ts AND e.queue_name = mb.queue_name
ORDER BY 1, 2
"""
"""Q per (bucket $1 minutes, queue) in [$2, $3] (queue $4; NULL = all), bucket then
queue ascending: counters summed over replicas; parked = per minute the sum of
the replicas' means, averaged over the bucket's minutes; partition events and
the highest partition-count snapshot."""

QUEUE_SCOPE_NAMES = """
SELECT name FROM queen.queues
WHERE ($1::text IS NULL OR name = $1) AND ($2::text IS NULL OR namespace = $2)
  AND ($3::text IS NULL OR task = $3)
"""
"""Existing queues matching queue $1 / namespace $2 / task $3 (Mode B of /status)."""

QUEUE_LAG_ROWS = """
SELECT m.queue_name, sum(m.pop_messages)::bigint AS pop_count,
       coalesce(round(sum(m.lag_sum_ms) / nullif(sum(m.lag_count), 0)), 0)::bigint AS avg_lag,
       round(max(m.lag_max_ms))::bigint AS max_lag, m.bucket_time
FROM queen.queue_metrics m
WHERE m.bucket_time >= $1 AND m.bucket_time <= $2 AND ($3::text IS NULL OR m.queue_name = $3)
GROUP BY m.bucket_time, m.queue_name
ORDER BY m.bucket_time DESC, m.queue_name
"""
"""Q minute rows in [$1, $2] (queue $3), summed over replicas, newest first."""

QUEUE_LAG_TOTALS = """
SELECT m.queue_name, sum(m.pop_messages)::bigint AS pop_count,
       coalesce(round(sum(m.lag_sum_ms) / nullif(sum(m.lag_count), 0)), 0)::bigint AS avg_lag,
       round(max(m.lag_max_ms))::bigint AS max_lag
FROM queen.queue_metrics m
WHERE m.bucket_time >= $1 AND m.bucket_time <= $2
GROUP BY m.queue_name
ORDER BY 2 DESC, 1
"""
"""Q over [$1, $2] per queue, by pops delivered (descending)."""

PARKED_REPLICAS = f"""
SELECT {bucket('m.bucket_time', '$1::integer')} AS ts, m.queue_name, m.hostname, m.pid,
       m.worker_id, round(avg(m.parked_avg)::numeric, 2)::float8 AS parked
FROM queen.queue_metrics m
WHERE m.bucket_time >= $2 AND m.bucket_time <= $3 AND ($4::text IS NULL OR m.queue_name = $4)
  AND m.parked_avg IS NOT NULL
GROUP BY 1, 2, 3, 4, 5
ORDER BY 1, 2, 3, 4
"""
"""P per (bucket $1 minutes, queue, replica) in [$2, $3] (queue $4): the mean of
the replica's per-minute parked averages."""

RETENTION_SERIES = f"""
SELECT {bucket('r.executed_at', '$1::integer')} AS ts,
       coalesce(sum(r.messages_deleted) FILTER (WHERE r.retention_type = 'retention'), 0)::bigint
           AS retention,
       coalesce(sum(r.messages_deleted) FILTER (WHERE r.retention_type = 'completed_retention'),
                0)::bigint AS completed,
       coalesce(sum(r.messages_deleted)
                FILTER (WHERE r.retention_type = 'max_wait_time_eviction'), 0)::bigint AS eviction,
       coalesce(sum(r.messages_deleted), 0)::bigint AS total, count(*) AS events
FROM queen.retention_history r
WHERE r.executed_at >= $2 AND r.executed_at <= $3 AND ($4::text IS NULL OR r.queue_name = $4)
  AND r.retention_type NOT LIKE '\\_\\_%\\_\\_'
GROUP BY 1 ORDER BY 1
"""
"""Retention events per bucket ($1 minutes) in [$2, $3] (queue $4), by type,
ascending; types named __x__ are left out."""

SYSTEM_ROWS = """
SELECT timestamp, hostname, port, worker_id, sample_count, metrics
FROM queen.system_metrics
WHERE timestamp >= $1 AND timestamp <= $2
  AND ($3::text IS NULL OR hostname = $3) AND ($4::text IS NULL OR worker_id = $4)
ORDER BY hostname, port, worker_id, timestamp
LIMIT 200000
"""
"""S rows in [$1, $2] (hostname $3, worker id $4), by replica then time."""

WORKERS_RECENT = f"""
SELECT w.hostname, w.pid, max(w.worker_id) AS worker_name,
       round(avg({_g('event_loop_lag_avg_ms')}))::bigint AS loop_lag_avg,
       round(max({_g('event_loop_lag_max_ms')}))::bigint AS loop_lag_max,
       round(min({_g('free_slots_min')}))::bigint AS free_slots,
       round(max({_g('db_pool_size')}))::bigint AS db_connections,
       round(max({_g('job_queue_max')}))::bigint AS job_queue,
       round(max({_g('backoff_max')}))::bigint AS backoff,
       sum({_w('ops.push_messages')} + {_w('ops.ack_success')} + {_w('ops.ack_failed')})::bigint
           AS processed,
       max(w.bucket_time) AS last_seen
FROM queen.worker_metrics w
WHERE w.bucket_time >= date_trunc('minute', now()) - make_interval(mins => $1)
GROUP BY w.hostname, w.pid
ORDER BY w.hostname, w.pid
"""
"""W rows of the last $1 minutes, per replica process (hostname, pid)."""

SUMMARY = """
SELECT counters, extract(epoch FROM now() - updated_at)::float8 AS age
FROM queen.worker_metrics_summary WHERE id = 1
"""
"""T: lifetime counters of every replica and seconds since the last flush."""

STATUS_QUEUES = """
SELECT q.id, q.name, q.namespace, q.task, s.child_count AS partitions,
       s.completed_messages AS consumed
FROM queen.queues q
JOIN queen.stats s ON s.stat_type = 'queue' AND s.stat_key = q.name
WHERE s.total_messages > 0
  AND ($1::text IS NULL OR q.name = $1) AND ($2::text IS NULL OR q.namespace = $2)
  AND ($3::text IS NULL OR q.task = $3)
ORDER BY q.name
"""
"""Queues with messages (queue $1 / namespace $2 / task $3), from the stats rows."""

RECENT_W = """
SELECT coalesce(sum((counters ->> 'ops.push_messages')::numeric), 0)::float8 AS pushed,
       coalesce(sum(coalesce((counters ->> 'ops.ack_success')::numeric, 0)
                    + coalesce((counters ->> 'ops.ack_failed')::numeric, 0)), 0)::float8 AS acked,
       coalesce(sum((counters ->> 'ops.lag_count')::numeric), 0)::float8 AS lag_count,
       coalesce(sum((counters ->> 'ops.lag_sum_ms')::numeric), 0)::float8 AS lag_sum_ms
FROM queen.worker_metrics
WHERE bucket_time >= date_trunc('minute', now()) - interval '5 minutes'
"""
"""W of the last 5 minutes: messages pushed and acked, pop lag (overview)."""

RECENT_MAX_LAG = """
SELECT coalesce(max(lag_max_ms), 0)::float8 FROM queen.queue_metrics
WHERE bucket_time >= date_trunc('minute', now()) - interval '5 minutes'
"""
"""The highest pop lag of the last 5 minutes (ms)."""

# -- postgres-stats: a snapshot of the broker's own database ----------------------

def _ratio(hits: str, reads: str) -> str:
    return (f"CASE WHEN ({hits} + {reads}) > 0 THEN round(100.0 * {hits} / ({hits} + {reads}), 2)"
            f"::float8 END")


PG_DATABASE_CACHE = f"""
SELECT datname AS database, blks_read AS disk_reads, blks_hit AS cache_hits,
       {_ratio('blks_hit', 'blks_read')} AS ratio
FROM pg_stat_database WHERE datname = current_database()
"""
"""Block reads and hits of the whole database."""

PG_TABLE_CACHE = f"""
SELECT schemaname AS schema, relname AS "table", coalesce(heap_blks_read, 0) AS disk_reads,
       coalesce(heap_blks_hit, 0) AS cache_hits,
       {_ratio('coalesce(heap_blks_hit, 0)', 'coalesce(heap_blks_read, 0)')} AS ratio
FROM pg_statio_user_tables WHERE schemaname = 'queen'
ORDER BY disk_reads DESC, relname
"""
"""Heap block reads and hits per table of the queen schema."""

PG_INDEX_CACHE = f"""
SELECT schemaname AS schema, relname AS "table", indexrelname AS index,
       coalesce(idx_blks_read, 0) AS disk_reads, coalesce(idx_blks_hit, 0) AS cache_hits,
       {_ratio('coalesce(idx_blks_hit, 0)', 'coalesce(idx_blks_read, 0)')} AS ratio
FROM pg_statio_user_indexes WHERE schemaname = 'queen'
ORDER BY disk_reads DESC, indexrelname
LIMIT 20
"""
"""The 20 indexes of the queen schema with the most block reads."""

PG_DEAD_TUPLES = """
SELECT schemaname AS schema, relname AS "table", n_dead_tup AS dead, n_live_tup AS live,
       CASE WHEN n_live_tup > 0 THEN round(100.0 * n_dead_tup / n_live_tup, 2)::float8 END AS pct,
       last_vacuum, last_autovacuum
FROM pg_stat_user_tables WHERE schemaname = 'queen' AND n_dead_tup > 0
ORDER BY n_dead_tup DESC LIMIT 15
"""
"""The 15 tables with the most dead tuples."""

PG_HOT_UPDATES = """
SELECT schemaname AS schema, relname AS "table", n_tup_upd AS updates, n_tup_hot_upd AS hot,
       round(100.0 * n_tup_hot_upd / n_tup_upd, 2)::float8 AS pct
FROM pg_stat_user_tables WHERE schemaname = 'queen' AND n_tup_upd > 0
ORDER BY n_tup_upd DESC LIMIT 15
"""
"""The 15 most updated tables, with their HOT share."""

PG_ACTIVE_QUERIES = """
SELECT pid, extract(epoch FROM now() - query_start)::float8 AS duration, state,
       left(query, 200) AS query, wait_event_type, wait_event
FROM pg_stat_activity
WHERE state IS NOT NULL AND state <> 'idle' AND pid <> pg_backend_pid()
  AND query_start < now() - interval '1 second'
ORDER BY query_start LIMIT 10
"""
"""Backends busy for more than a second (all databases), oldest first."""

PG_AUTOVACUUM = """
SELECT relname AS "table", last_autovacuum, n_dead_tup AS dead, autovacuum_count,
       autoanalyze_count
FROM pg_stat_user_tables WHERE schemaname = 'queen' AND n_dead_tup > 1000
ORDER BY n_dead_tup DESC LIMIT 10
"""
"""Tables with more than 1000 dead tuples."""

PG_BUFFER_CONFIG = """
SELECT setting AS shared_buffers,
       pg_size_pretty(setting::bigint * current_setting('block_size')::bigint) AS size
FROM pg_settings WHERE name = 'shared_buffers'
"""
"""shared_buffers in pages (text) and as a size."""

PG_HAS_BUFFERCACHE = "SELECT 1 FROM pg_extension WHERE extname = 'pg_buffercache'"
"""Whether pg_buffercache is installed (bufferUsage is [] without it)."""

PG_BUFFER_USAGE = """
SELECT c.relname AS object, pg_size_pretty(count(*) * current_setting('block_size')::bigint)
           AS buffered_size,
       count(*) * current_setting('block_size')::bigint AS buffered_bytes,
       round(100.0 * count(*) / (SELECT setting::bigint FROM pg_settings
                                 WHERE name = 'shared_buffers'), 2)::float8 AS pct
FROM pg_buffercache b JOIN pg_class c ON b.relfilenode = pg_relation_filenode(c.oid)
WHERE b.reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY c.relname ORDER BY count(*) DESC LIMIT 20
"""
"""The 20 relations with the most pages in shared buffers."""

PG_TABLE_SIZES = """
SELECT c.relname AS "table",
       pg_size_pretty(pg_total_relation_size(c.oid)) AS total_size,
       pg_total_relation_size(c.oid) AS total_bytes,
       pg_size_pretty(pg_relation_size(c.oid)) AS table_size,
       pg_relation_size(c.oid) AS table_bytes,
       pg_size_pretty(pg_indexes_size(c.oid)) AS index_size,
       pg_indexes_size(c.oid) AS index_bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'queen' AND c.relkind = 'r'
ORDER BY pg_total_relation_size(c.oid) DESC LIMIT 20
"""
"""The 20 largest ordinary tables of the queen schema."""
