-- Streams: the state behind /streams/v1 (the official clients' streaming SDK).
--
-- The SDK computes windows and reductions client-side; the broker keeps each
-- query's identity and its per-(query, source partition) key/value state, and
-- commits a cycle's state changes together with its sink pushes and its source
-- ack in one transaction (broker/service/streams.py).
--
-- Cleanup: a state row references its source partition, so deleting a queue
-- (or a partition, by retention) deletes the stream state of its partitions
-- with it; deleting a query deletes its state (ON DELETE CASCADE).

CREATE SCHEMA IF NOT EXISTS queen_streams;

CREATE TABLE IF NOT EXISTS queen_streams.queries (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name         text NOT NULL UNIQUE,          -- the SDK's query_id: the durable identity
    source_queue text NOT NULL,
    sink_queue   text,
    config_hash  text NOT NULL,                 -- the pipeline's shape; a change needs reset
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- The partition lock a push takes is FOR NO KEY UPDATE, which does not conflict with
-- the FOR KEY SHARE this foreign key takes: state writes never wait for pushes to the
-- source partition.
CREATE TABLE IF NOT EXISTS queen_streams.state (
    query_id     uuid NOT NULL REFERENCES queen_streams.queries(id) ON DELETE CASCADE,
    partition_id uuid NOT NULL REFERENCES queen.partitions(id) ON DELETE CASCADE,
    key          text NOT NULL,
    value        jsonb NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, partition_id, key)
);
-- Cascaded deletes from queen.partitions find their rows through this index.
CREATE INDEX IF NOT EXISTS streams_state_partition_idx ON queen_streams.state (partition_id);

-------------------------------------------------------------------------------
-- queen_streams.register_query_v1: POST /streams/v1/queries in one round trip.
-- New name: created (fresh). Same name and hash: the existing query (idempotent).
-- Same name, other hash: conflict, unless p_reset, which deletes the query's
-- state and lets the new hash (and source/sink) take over. A reset with an
-- unchanged hash changes nothing (the SDK sends reset on every start when asked).
-------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen_streams.register_query_v1(
    p_name text, p_source text, p_sink text, p_hash text, p_reset boolean)
RETURNS TABLE (query_id uuid, name text, config_hash text, fresh boolean,
               did_reset boolean, conflict boolean, existing_hash text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q record;
BEGIN
    INSERT INTO queen_streams.queries AS x (name, source_queue, sink_queue, config_hash)
    VALUES (p_name, p_source, p_sink, p_hash)
    ON CONFLICT (name) DO NOTHING
    RETURNING x.id, x.name, x.config_hash INTO q;
    IF FOUND THEN
        RETURN QUERY SELECT q.id, q.name, q.config_hash, true, false, false, NULL::text;
        RETURN;
    END IF;
    SELECT x.id, x.name, x.config_hash INTO q
    FROM queen_streams.queries x WHERE x.name = p_name FOR UPDATE;
    IF q.config_hash = p_hash THEN
        RETURN QUERY SELECT q.id, q.name, q.config_hash, false, false, false, NULL::text;
    ELSIF NOT p_reset THEN
        RETURN QUERY SELECT q.id, q.name, q.config_hash, false, false, true, q.config_hash;
    ELSE
        DELETE FROM queen_streams.state s WHERE s.query_id = q.id;
        UPDATE queen_streams.queries x
        SET config_hash = p_hash, source_queue = p_source, sink_queue = p_sink, updated_at = now()
        WHERE x.id = q.id;
        RETURN QUERY SELECT q.id, q.name, p_hash, false, true, false, NULL::text;
    END IF;
END;
$$;

-------------------------------------------------------------------------------
-- queen_streams.cycle_state_v1: the first statement of a cycle's transaction
-- (POST /streams/v1/cycle); pushes and the ack follow on the same connection.
--   * status 'unknown_query' / 'unknown_partition': nothing done; the caller aborts.
--   * Takes the (query, partition) shard's transaction lock, so a cycle and an
--     idle flush of the same shard commit one after the other.
--   * With p_ack_txid: when that message is at or behind the group's cursor the
--     cycle was committed before (a retry whose answer was lost) and status is
--     'replayed': the caller commits nothing more. Without it (an idle flush), the
--     same when the cycle deletes keys it does not upsert and none of the rows it
--     deletes exists any more. When p_lease is the group's
--     live lease and p_whole_batch, ack_txid is the newest message that lease
--     handed out on the partition: a cycle acknowledges the whole batch it
--     popped there (the SDK orders a batch by createdAt and id, which need not be
--     commit order for pushes made concurrently).
--   * Otherwise applies the ops: per key the last op wins (ops are in order);
--     values arrive as JSON text (serialized and checked by the broker).
-------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen_streams.cycle_state_v1(
    p_query uuid, p_partition uuid, p_types text[], p_keys text[], p_values text[],
    p_group text, p_ack_txid text, p_lease uuid, p_whole_batch boolean)
RETURNS TABLE (status text, applied integer, ack_txid text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    acked_seq bigint;
    lc record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen_streams.queries q WHERE q.id = p_query) THEN
        RETURN QUERY SELECT 'unknown_query'::text, 0, p_ack_txid;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM queen.partitions pt WHERE pt.id = p_partition) THEN
        RETURN QUERY SELECT 'unknown_partition'::text, 0, p_ack_txid;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_query::text || ':' || p_partition::text, 737100));
    ack_txid := p_ack_txid;
    IF p_ack_txid IS NULL
       AND EXISTS (SELECT 1 FROM unnest(p_types, p_keys) AS o(t, k)
                   WHERE o.t = 'delete'
                     AND o.k <> ALL (SELECT u.k FROM unnest(p_types, p_keys) AS u(t, k)
                                     WHERE u.t = 'upsert'))
       AND NOT EXISTS (
        SELECT 1 FROM queen_streams.state s
        JOIN unnest(p_types, p_keys) AS o(t, k) ON o.t = 'delete' AND s.key = o.k
        WHERE s.query_id = p_query AND s.partition_id = p_partition) THEN
        -- An idle flush emits the windows it deletes (keys it deletes and does not
        -- upsert): when every row it deletes is gone already, those windows were
        -- emitted before (a retry whose answer was lost, or another worker's flush).
        RETURN QUERY SELECT 'replayed'::text, 0, p_ack_txid;
        RETURN;
    END IF;
    IF p_ack_txid IS NOT NULL THEN
        SELECT m.seq INTO acked_seq FROM queen.messages m
        WHERE m.partition_id = p_partition AND m.transaction_id = p_ack_txid;
        SELECT l.cursor_seq, l.lease_id, l.lease_expires_at, l.lease_last_seq INTO lc
        FROM queen.log_consumers l
        WHERE l.partition_id = p_partition AND l.consumer_group = p_group;
        IF acked_seq IS NOT NULL AND lc.cursor_seq IS NOT NULL AND acked_seq <= lc.cursor_seq THEN
            RETURN QUERY SELECT 'replayed'::text, 0, p_ack_txid;
            RETURN;
        END IF;
        IF p_whole_batch AND acked_seq IS NOT NULL AND p_lease IS NOT NULL
           AND lc.lease_id = p_lease AND lc.lease_expires_at > now()
           AND lc.lease_last_seq > acked_seq THEN
            SELECT m.transaction_id INTO ack_txid FROM queen.messages m
            WHERE m.partition_id = p_partition AND m.seq = lc.lease_last_seq;
            ack_txid := coalesce(ack_txid, p_ack_txid);
        END IF;
    END IF;

    WITH ops AS (
        SELECT o.t, o.k, o.v, o.n
        FROM unnest(p_types, p_keys, p_values) WITH ORDINALITY AS o(t, k, v, n)
    ), last_op AS (
        SELECT DISTINCT ON (ops.k) ops.t, ops.k, ops.v FROM ops ORDER BY ops.k, ops.n DESC
    ), gone AS (
        DELETE FROM queen_streams.state s
        USING last_op
        WHERE last_op.t = 'delete' AND s.query_id = p_query AND s.partition_id = p_partition
          AND s.key = last_op.k
    )
    INSERT INTO queen_streams.state AS s (query_id, partition_id, key, value, updated_at)
    SELECT p_query, p_partition, last_op.k, coalesce(last_op.v::jsonb, '{}'::jsonb), now()
    FROM last_op WHERE last_op.t = 'upsert'
    ON CONFLICT (query_id, partition_id, key)
    DO UPDATE SET value = EXCLUDED.value, updated_at = now();

    status := 'ok';
    applied := coalesce(array_length(p_types, 1), 0);
    RETURN NEXT;
END;
$$;

-------------------------------------------------------------------------------
-- queen_streams.state_get_v1: POST /streams/v1/state/get, folded: parallel
-- arrays, one element per request (p_idx); keys of request i are the p_key_idx
-- = i entries of p_keys (none: every row of the shard). Filters AND together:
-- keys, key prefix, and ripe_at (rows whose value's windowEnd <= it: the
-- idle flush's closed windows). A request of an unknown query reads no rows.
-------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen_streams.state_get_v1(
    p_idx integer[], p_query uuid[], p_partition uuid[], p_prefix text[], p_ripe bigint[],
    p_key_idx integer[], p_keys text[])
RETURNS TABLE (idx integer, key text, value jsonb, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    WITH req AS (
        SELECT r.i, r.q, r.p, r.prefix, r.ripe
        FROM unnest(p_idx, p_query, p_partition, p_prefix, p_ripe) AS r(i, q, p, prefix, ripe)
    ), wanted AS (
        SELECT w.i, w.k FROM unnest(p_key_idx, p_keys) AS w(i, k)
    )
    SELECT req.i, s.key, s.value, s.updated_at
    FROM req
    JOIN queen_streams.state s ON s.query_id = req.q AND s.partition_id = req.p
    WHERE (NOT EXISTS (SELECT 1 FROM wanted WHERE wanted.i = req.i)
           OR s.key IN (SELECT wanted.k FROM wanted WHERE wanted.i = req.i))
      AND (req.prefix IS NULL OR starts_with(s.key, req.prefix))
      AND (req.ripe IS NULL
           OR (jsonb_typeof(s.value -> 'windowEnd') = 'number'
               AND (s.value ->> 'windowEnd')::numeric <= req.ripe))
    ORDER BY req.i, s.key
$$;
