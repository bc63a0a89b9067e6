-- Operator-side tables: statistics, retention history, metrics, traces.
-- Applied after schema.sql, idempotently, under the boot lock.

-- Pre-aggregated counters, maintained by the stats reconciler (lock 737002).
-- stat_type: 'partition' (stat_key = partition id), 'queue' (queue name),
-- 'namespace', 'task', 'system' (stat_key = 'system').
-- The figures are those of broker/store/figures_sql.py (one definition for every
-- surface): each stored message counted once, in one state, against the partition's
-- consumers (the groups with a cursor row, queue mode included):
--   total         messages stored (= pending + processing + completed + dead_letter)
--   pending       not yet taken by some consumer (after the least advanced cursor,
--                 not under a live lease, not dead-lettered)
--   processing    handed out under a live lease (any consumer) and not yet acked
--   completed     every consumer is past it, not dead-lettered
--   dead_letter   messages some consumer dead-lettered
CREATE TABLE IF NOT EXISTS queen.stats (
    stat_type           text NOT NULL,
    stat_key            text NOT NULL,
    queue_name          text,
    namespace           text,
    task                text,
    partition_id        uuid,
    partition_name      text,
    total_messages      bigint NOT NULL DEFAULT 0,
    pending_messages    bigint NOT NULL DEFAULT 0,
    processing_messages bigint NOT NULL DEFAULT 0,
    completed_messages  bigint NOT NULL DEFAULT 0,
    dead_letter_messages bigint NOT NULL DEFAULT 0,
    oldest_pending_at   timestamptz,
    newest_message_at   timestamptz,
    max_lag_seconds     double precision,
    child_count         bigint NOT NULL DEFAULT 0,   -- partitions (queue row), queues (ns/task/system)
    last_scanned_at     timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stat_type, stat_key)
);
SELECT queen.ensure_index('stats_queue_idx', $ddl$CREATE INDEX IF NOT EXISTS stats_queue_idx ON queen.stats (queue_name)$ddl$);

-- One row per partition and kind that lost rows to the retention sweep.
CREATE TABLE IF NOT EXISTS queen.retention_history (
    id               bigserial PRIMARY KEY,
    partition_id     uuid,
    queue_name       text,
    partition_name   text,
    messages_deleted bigint NOT NULL,
    retention_type   text NOT NULL,   -- 'retention' | 'completed_retention' | 'max_wait_time_eviction'
    executed_at      timestamptz NOT NULL DEFAULT now()
);
SELECT queen.ensure_index('retention_history_executed_idx', $ddl$CREATE INDEX IF NOT EXISTS retention_history_executed_idx ON queen.retention_history (executed_at)$ddl$);

-- Written by every replica, ungated, keyed by host/port/worker.
CREATE TABLE IF NOT EXISTS queen.system_metrics (
    timestamp    timestamptz NOT NULL,   -- minute-truncated
    hostname     text NOT NULL,
    port         integer NOT NULL,
    worker_id    text NOT NULL,
    sample_count integer NOT NULL DEFAULT 1,
    metrics      jsonb NOT NULL,
    PRIMARY KEY (timestamp, hostname, port, worker_id)
);

CREATE TABLE IF NOT EXISTS queen.worker_metrics (
    bucket_time timestamptz NOT NULL,    -- minute-truncated
    hostname    text NOT NULL,
    worker_id   text NOT NULL,
    pid         integer NOT NULL,
    counters    jsonb NOT NULL DEFAULT '{}',  -- added on upsert
    gauges      jsonb NOT NULL DEFAULT '{}',  -- replaced on upsert
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bucket_time, hostname, worker_id, pid)
);

-- Per-message trace events (POST /api/v1/traces).
CREATE TABLE IF NOT EXISTS queen.message_traces (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    message_id     uuid NOT NULL REFERENCES queen.messages(id) ON DELETE CASCADE,
    partition_id   uuid NOT NULL,
    transaction_id text NOT NULL,
    consumer_group text NOT NULL DEFAULT '__QUEUE_MODE__',
    event_type     text NOT NULL DEFAULT 'info',
    data           jsonb NOT NULL DEFAULT '{}',
    worker_id      text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
SELECT queen.ensure_index('message_traces_message_idx', $ddl$CREATE INDEX IF NOT EXISTS message_traces_message_idx ON queen.message_traces (message_id, created_at)$ddl$);

CREATE TABLE IF NOT EXISTS queen.message_trace_names (
    trace_id   uuid NOT NULL REFERENCES queen.message_traces(id) ON DELETE CASCADE,
    trace_name text NOT NULL,
    PRIMARY KEY (trace_id, trace_name)
);
SELECT queen.ensure_index('message_trace_names_name_idx', $ddl$CREATE INDEX IF NOT EXISTS message_trace_names_name_idx ON queen.message_trace_names (trace_name)$ddl$);

-- ---------------------------------------------------------------------------
-- Additions for the background jobs (actors/leader_jobs.py, store/jobs_sql.py).
-- ---------------------------------------------------------------------------

-- What a partition row of queen.stats was counted against, so the stats
-- reconciler recounts a partition only when one of these moved:
--   scanned_last_seq  partitions.last_seq at the count (every push moves it)
--   consumer_sig      sum of a 64-bit hash of (group, cursor_seq, lease_last_seq
--                     of a live lease) over the partition's cursor rows (acks,
--                     nacks, dead-lettering, new groups, leases taken, released
--                     or expired all change it)
-- Both are NULL on queue/namespace/task/system rows.
-- Added only when missing: ALTER TABLE takes an exclusive lock even when IF NOT
-- EXISTS finds the column, and a booting broker then deadlocked with a running
-- broker's stats cycle.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'queen.stats'::regclass
                   AND attname = 'scanned_last_seq' AND NOT attisdropped) THEN
        ALTER TABLE queen.stats ADD COLUMN scanned_last_seq bigint;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'queen.stats'::regclass
                   AND attname = 'consumer_sig' AND NOT attisdropped) THEN
        ALTER TABLE queen.stats ADD COLUMN consumer_sig numeric;
    END IF;
END;
$$;

-- Partitions that lost message or dead-letter rows since the stats reconciler
-- last looked (retention, eviction, queue deletion, any manual DELETE). Filled
-- by the statement triggers below in the deleting transaction itself, so a
-- deletion can never be committed without its mark; consumed (deleted) by the
-- reconciler in the transaction that recounts those partitions. No foreign
-- key: a mark may outlive its partition (the reconciler then drops the row).
CREATE TABLE IF NOT EXISTS queen.stats_dirty (
    partition_id uuid PRIMARY KEY,
    marked_at    timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION queen.mark_stats_dirty() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.stats_dirty (partition_id)
    SELECT DISTINCT g.partition_id FROM gone g
    ON CONFLICT (partition_id) DO NOTHING;
    RETURN NULL;
END;
$$;

-- Created once (not replaced at every boot: CREATE TRIGGER locks the table).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'messages_mark_stats_dirty'
                     AND tgrelid = 'queen.messages'::regclass) THEN
        CREATE TRIGGER messages_mark_stats_dirty
            AFTER DELETE ON queen.messages
            REFERENCING OLD TABLE AS gone
            FOR EACH STATEMENT EXECUTE FUNCTION queen.mark_stats_dirty();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'dlq_mark_stats_dirty'
                     AND tgrelid = 'queen.dead_letter_queue'::regclass) THEN
        CREATE TRIGGER dlq_mark_stats_dirty
            AFTER DELETE ON queen.dead_letter_queue
            REFERENCING OLD TABLE AS gone
            FOR EACH STATEMENT EXECUTE FUNCTION queen.mark_stats_dirty();
    END IF;
END;
$$;
