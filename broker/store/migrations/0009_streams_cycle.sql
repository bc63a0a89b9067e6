-- Streams: POST /streams/v1/cycle in one server-side function, one round trip.
--
-- Before this migration a cycle was five statements on one connection (BEGIN,
-- queen_streams.cycle_state_v1, the push function, the ack function, COMMIT).
-- queen_streams.cycle_v1 runs cycle_state_v1, queen.push_ordered_v2 and
-- queen.ack_messages_v2 (what /api/v1/push and /api/v1/ack call), in that
-- order, inside one statement: the statement is its own transaction, so the
-- cycle still commits its state ops, its sink pushes and its source ack
-- together or not at all. It calls the functions /api/v1/push and /api/v1/ack
-- run (nothing of their rules is copied here): dedup, positions in commit order
-- under the partition row locks, held partitions, lease validation, failed acks
-- to the DLQ. Each statement inside a VOLATILE plpgsql function takes a new
-- snapshot, as each statement of the old transaction did.
--
-- queen_streams.shards: one row per (query, source partition) that committed a
-- cycle, for the operator's view (cycles committed, when the last one was).
-- Written by cycle_v1 under the shard's transaction lock (which cycle_state_v1
-- takes), so it adds no lock another shard waits for. Deleted with its query
-- and with its partition (queue deletion, retention), like the state.

CREATE TABLE IF NOT EXISTS queen_streams.shards (
    query_id      uuid NOT NULL REFERENCES queen_streams.queries(id) ON DELETE CASCADE,
    partition_id  uuid NOT NULL REFERENCES queen.partitions(id) ON DELETE CASCADE,
    cycles        bigint NOT NULL DEFAULT 0,     -- committed cycles (replayed ones not counted)
    last_cycle_at timestamptz NOT NULL,          -- commit-side time of the newest one
    PRIMARY KEY (query_id, partition_id)
);
CREATE INDEX IF NOT EXISTS streams_shards_partition_idx ON queen_streams.shards (partition_id);

-------------------------------------------------------------------------------
-- queen_streams.cycle_v1: one cycle, all or nothing.
--   1. queen_streams.cycle_state_v1 (query and partition known, the shard's
--      lock, a replayed cycle recognised, the ack widened to the lease's whole
--      batch, the state ops). status <> 'ok': returned as is, nothing written.
--   2. queen.push_ordered_v2 in direct mode (p_replay false) for the sink pushes
--      (p_idx NULL or empty: none). An item answered 'held' (a spool holds its
--      partition) raises SQLSTATE QSH01 (detail: the item's idx): a cycle
--      cannot wait in a spool, so everything is rolled back.
--   3. queen.ack_messages_v2 for the source ack (p_ack_txid NULL: none), failed
--      acks straight to the DLQ. An ack it refuses (lease, message) raises
--      SQLSTATE QSA01 with its error as the message: everything is rolled back.
--   4. The shard's row in queen_streams.shards.
-- One row: status, applied, the push results as parallel arrays in input order
-- (idx, message id, status), the ack's outcome (NULLs without an ack).
-------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen_streams.cycle_v1(
    p_query uuid, p_partition uuid, p_types text[], p_keys text[], p_values text[],
    p_group text, p_ack_txid text, p_lease uuid, p_whole_batch boolean,
    p_ack_status text, p_ack_error text,
    p_idx integer[], p_queue text[], p_push_partition text[], p_id uuid[],
    p_txid text[], p_trace uuid[], p_payload text[], p_encrypted boolean[],
    p_sub text[], p_accept bigint[], p_server text, p_wait_ms integer)
RETURNS TABLE (status text, applied integer, push_idx integer[], push_message_id uuid[],
               push_status text[], ack_success boolean, ack_lease_released boolean,
               ack_dlq boolean, ack_queue text, ack_partition text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    st record;
    ar record;
    held integer;
BEGIN
    SELECT * INTO st FROM queen_streams.cycle_state_v1(
        p_query, p_partition, p_types, p_keys, p_values, p_group, p_ack_txid, p_lease,
        p_whole_batch);
    status := st.status;
    applied := st.applied;
    IF st.status <> 'ok' THEN
        RETURN NEXT;
        RETURN;
    END IF;

    IF coalesce(cardinality(p_idx), 0) > 0 THEN
        SELECT array_agg(x.idx ORDER BY x.idx), array_agg(x.message_id ORDER BY x.idx),
               array_agg(x.status ORDER BY x.idx), min(x.idx) FILTER (WHERE x.status = 'held')
        INTO push_idx, push_message_id, push_status, held
        FROM queen.push_ordered_v2(p_idx, p_queue, p_push_partition, p_id, p_txid, p_trace,
                                p_payload, p_encrypted, p_sub, p_accept, p_server, false,
                                NULL, p_wait_ms) AS x;
        IF held IS NOT NULL THEN
            RAISE EXCEPTION 'sink push % goes to a partition a spool holds', held
                USING ERRCODE = 'QSH01', DETAIL = held::text;
        END IF;
    END IF;

    IF p_ack_txid IS NOT NULL THEN
        SELECT * INTO ar FROM queen.ack_messages_v2(
            ARRAY[0], ARRAY[st.ack_txid], ARRAY[p_partition], ARRAY[p_ack_status],
            ARRAY[p_ack_error], ARRAY[p_group], ARRAY[p_lease], true);
        IF NOT ar.success THEN
            RAISE EXCEPTION '%', coalesce(ar.error, 'ack failed') USING ERRCODE = 'QSA01';
        END IF;
        ack_success := ar.success;
        ack_lease_released := ar.lease_released;
        ack_dlq := ar.dlq;
        ack_queue := ar.queue_name;
        ack_partition := ar.partition_name;
    END IF;

    INSERT INTO queen_streams.shards AS s (query_id, partition_id, cycles, last_cycle_at)
    VALUES (p_query, p_partition, 1, clock_timestamp())
    ON CONFLICT (query_id, partition_id)
    DO UPDATE SET cycles = s.cycles + 1, last_cycle_at = EXCLUDED.last_cycle_at;
    RETURN NEXT;
END;
$$;
