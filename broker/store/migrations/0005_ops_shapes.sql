-- Migration 0005: the metric tables behind the operator and analytics routes.
--
-- queen.queue_metrics     per (minute, queue, replica): what the replica's pushes,
--                         pops, acks and transactions did to the queue, pop lag, and
--                         the long polls parked on it. Written by each replica's
--                         metrics collector (counters added on upsert, the parked
--                         figures replaced: they are the minute's running average).
-- queen.partition_events  per (minute, queue): partitions created and deleted
--                         (statement triggers on queen.partitions) and the
--                         partition-count snapshot the stats job takes once a minute.
-- queen.worker_metrics_summary  lifetime totals of every replica's worker_metrics
--                         counters (one row), added in the collector's transaction.
-- All three are purged with the other metric tables after METRICS_RETENTION_DAYS
-- (the summary row is never purged).

CREATE TABLE IF NOT EXISTS queen.queue_metrics (
    bucket_time    timestamptz NOT NULL,     -- minute-truncated
    queue_name     text NOT NULL,
    hostname       text NOT NULL,
    worker_id      text NOT NULL,
    pid            integer NOT NULL,
    push_requests  bigint NOT NULL DEFAULT 0,
    push_messages  bigint NOT NULL DEFAULT 0,
    pop_requests   bigint NOT NULL DEFAULT 0,
    pop_messages   bigint NOT NULL DEFAULT 0,
    pop_empty      bigint NOT NULL DEFAULT 0,
    ack_requests   bigint NOT NULL DEFAULT 0,
    ack_success    bigint NOT NULL DEFAULT 0,
    ack_failed     bigint NOT NULL DEFAULT 0,
    transactions   bigint NOT NULL DEFAULT 0,
    lag_count      bigint NOT NULL DEFAULT 0,   -- messages delivered with a measured lag
    lag_sum_ms     double precision NOT NULL DEFAULT 0,
    lag_max_ms     double precision NOT NULL DEFAULT 0,
    parked_avg     double precision,          -- mean long polls parked on the queue this minute
    parked_max     integer,
    PRIMARY KEY (bucket_time, queue_name, hostname, worker_id, pid)
);

CREATE TABLE IF NOT EXISTS queen.partition_events (
    bucket_time         timestamptz NOT NULL,  -- minute-truncated
    queue_name          text NOT NULL,         -- '__orphaned__': deleted with their queue
    partitions_created  bigint NOT NULL DEFAULT 0,
    partitions_deleted  bigint NOT NULL DEFAULT 0,
    partition_count     bigint,                -- snapshot by the stats job; NULL if none
    PRIMARY KEY (bucket_time, queue_name)
);

CREATE TABLE IF NOT EXISTS queen.worker_metrics_summary (
    id          integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    counters    jsonb NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION queen.partition_events_created() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.partition_events AS e (bucket_time, queue_name, partitions_created)
    SELECT date_trunc('minute', now()), coalesce(q.name, '__orphaned__'), count(*)
    FROM created c LEFT JOIN queen.queues q ON q.id = c.queue_id
    GROUP BY 2
    ON CONFLICT (bucket_time, queue_name) DO UPDATE
        SET partitions_created = e.partitions_created + EXCLUDED.partitions_created;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION queen.partition_events_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.partition_events AS e (bucket_time, queue_name, partitions_deleted)
    SELECT date_trunc('minute', now()), coalesce(q.name, '__orphaned__'), count(*)
    FROM gone g LEFT JOIN queen.queues q ON q.id = g.queue_id
    GROUP BY 2
    ON CONFLICT (bucket_time, queue_name) DO UPDATE
        SET partitions_deleted = e.partitions_deleted + EXCLUDED.partitions_deleted;
    RETURN NULL;
END;
$$;

CREATE TRIGGER partitions_created_events AFTER INSERT ON queen.partitions
    REFERENCING NEW TABLE AS created FOR EACH STATEMENT
    EXECUTE FUNCTION queen.partition_events_created();

CREATE TRIGGER partitions_deleted_events AFTER DELETE ON queen.partitions
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION queen.partition_events_deleted();

CREATE INDEX IF NOT EXISTS queue_metrics_queue_idx ON queen.queue_metrics (queue_name, bucket_time);

-- POST /api/v1/messages/{partitionId}/{transactionId}/dlq: move a message to the
-- dead-letter queue for queue mode. Queue mode reads a partition in order
-- behind one cursor, so only the next message it would read can be moved: the
-- DLQ row is written and the cursor passes the message, as a 'dlq' ack would.
-- Answers 'moved', 'not_found', 'consumed' (queue mode is already past it,
-- dead-lettered included), 'leased' (handed out under a live lease) or
-- 'not_next' (an earlier message is still unread).
CREATE OR REPLACE FUNCTION queen.move_to_dlq(p_partition uuid, p_txid text, p_error text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    m  record;
    lc record;
BEGIN
    SELECT id, seq, created_at INTO m FROM queen.messages
    WHERE partition_id = p_partition AND transaction_id = p_txid;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    INSERT INTO queen.log_consumers (partition_id, consumer_group)
    VALUES (p_partition, '__QUEUE_MODE__') ON CONFLICT DO NOTHING;
    SELECT cursor_seq, lease_id, lease_expires_at, lease_last_seq INTO lc
    FROM queen.log_consumers
    WHERE partition_id = p_partition AND consumer_group = '__QUEUE_MODE__' FOR UPDATE;
    IF m.seq <= lc.cursor_seq THEN
        RETURN 'consumed';
    END IF;
    IF lc.lease_id IS NOT NULL AND lc.lease_expires_at > now()
       AND m.seq <= coalesce(lc.lease_last_seq, 0) THEN
        RETURN 'leased';
    END IF;
    IF EXISTS (SELECT 1 FROM queen.messages
               WHERE partition_id = p_partition AND seq > lc.cursor_seq AND seq < m.seq) THEN
        RETURN 'not_next';
    END IF;
    INSERT INTO queen.dead_letter_queue
        (message_id, partition_id, consumer_group, error_message, retry_count, original_created_at)
    VALUES (m.id, p_partition, '__QUEUE_MODE__', p_error, 0, m.created_at);
    UPDATE queen.log_consumers
    SET cursor_seq = m.seq, last_consumed_id = m.id, last_consumed_created_at = m.created_at,
        updated_at = now()
    WHERE partition_id = p_partition AND consumer_group = '__QUEUE_MODE__';
    RETURN 'moved';
END;
$$;
