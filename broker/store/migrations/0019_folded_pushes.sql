-- Migration 0019: a fast path for pushes to several partitions in one call.
--
-- A broker folds the pushes that arrive while its earlier round trips are in
-- flight into one call of the push function (actors/batcher.py), so under
-- load most calls carry the items of several requests, to several
-- partitions. push_ordered_v5's fast path (migration 0017) takes only calls
-- to one partition; every folded call went to push_ordered_v4, which probes
-- the dedup key once per item, sorts the call twice for its window
-- functions and runs seven statements before the insert. PostgreSQL's CPU per
-- message of a call of 100 items over 16 partitions was 2.7x that of 100
-- items to one partition (37.5 against 13.7 us).
--
-- What changes:
--
--   * queen.push_ordered_v6: a call to one partition goes to push_ordered_v5
--     (its paths as before), and a call to several existing partitions takes
--     a fast path of its own: one statement locks the call's
--     partitions in id order (as v4 does) and reads, per partition, its last
--     seq, its newest accept time and the call's items to it, and whether a
--     checked item's queue has maxSize, the database settles or a spool
--     backlog exists; one statement inserts the items (seq: the partition's
--     last seq plus the item's rank among the call's items to it, in item
--     order) and moves the partitions' counters. The unique keys are the
--     duplicate check, and a subtransaction undoes a try that meets one, as in
--     v5's one-partition batch. Anything else (a new partition, maxSize,
--     settling, a backlog, a duplicate) goes to push_ordered_v4, as before.
--     One-partition calls stay with v5: the rank's sort would cost them 2-3 us
--     per message more than v5's ordinality, and the nested call costs no CPU
--     measurable per message (three alternating rounds each).
--     Same arguments, rows, locks and order as push_ordered_v5.
--
-- Upgrade-safe: nothing is dropped or rewritten; brokers of the previous
-- release keep calling push_ordered_v5 (unchanged).

CREATE FUNCTION queen.push_ordered_v6(
    p_idx integer[], p_queue text[], p_partition text[], p_id uuid[], p_txid text[],
    p_trace uuid[], p_payload text[], p_encrypted boolean[], p_sub text[], p_accept bigint[],
    p_server text, p_wait_ms integer, p_settle_ms integer, p_req bigint[])
RETURNS TABLE (idx integer, message_id uuid, partition_id uuid, status text, late boolean,
               peer text, error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_qn       text[];    -- per partition of the call: its queue's name ...
    v_pn       text[];    -- ... its name,
    v_pids     uuid[];    -- ... its id,
    v_lasts    bigint[];  -- ... its last seq before the call,
    v_accs     bigint[];  -- ... its newest accept time before the call,
    v_ns       bigint[];  -- ... the call's items to it,
    v_maccs    bigint[];  -- ... and their newest accept time
    v_found    bigint;    -- the call's items to partitions that exist
    v_limited  boolean;
    v_clear    boolean;
    v_inserted boolean;
BEGIN
    IF p_queue[1] = ALL(p_queue) AND p_partition[1] = ALL(p_partition) THEN
        -- One partition: v5's paths (a nested call costs no measurable CPU).
        RETURN QUERY SELECT * FROM queen.push_ordered_v5(p_idx, p_queue, p_partition, p_id,
            p_txid, p_trace, p_payload, p_encrypted, p_sub, p_accept, p_server, p_wait_ms,
            p_settle_ms, p_req);
        RETURN;
    END IF;
    -- Any other call: its existing partitions locked in id order and read in one
    -- statement, with what decides whether the fast path may take the call.
    SELECT array_agg(l.qn), array_agg(l.pn), array_agg(l.id), array_agg(l.last_seq),
           array_agg(l.last_accept_us), array_agg(l.n), array_agg(l.macc),
           bool_or(l.limited), sum(l.n),
           NOT queen.db_settling(p_settle_ms) AND NOT EXISTS (SELECT 1 FROM queen.spool_backlog)
    INTO v_qn, v_pn, v_pids, v_lasts, v_accs, v_ns, v_maccs, v_limited, v_found, v_clear
    FROM (
        SELECT g.qn, g.pn, pt.id, pt.last_seq, pt.last_accept_us, g.n, g.macc,
               q.max_size > 0 AND g.checked AS limited
        FROM (SELECT x.qn, x.pn, count(*) AS n, max(x.acc) AS macc,
                     bool_or(x.req IS NOT NULL) AS checked
              FROM unnest(p_queue, p_partition, p_accept, p_req) AS x(qn, pn, acc, req)
              GROUP BY x.qn, x.pn) g
        JOIN queen.queues q ON q.name = g.qn
        JOIN queen.partitions pt ON pt.queue_id = q.id AND pt.name = g.pn
        ORDER BY pt.id
        FOR NO KEY UPDATE OF pt) l;
    IF v_found = cardinality(p_idx) AND NOT v_limited AND v_clear THEN
        -- The unique keys are the duplicate check; a duplicate undoes the try and
        -- v4 sorts it out.
        BEGIN
            WITH ins AS (
                INSERT INTO queen.messages
                    (id, partition_id, seq, transaction_id, trace_id, payload, is_encrypted,
                     producer_sub)
                SELECT x.mid, k.pid, k.last + row_number() OVER (PARTITION BY k.pid ORDER BY x.i),
                       x.txid, x.trace, coalesce(x.payload, 'null')::jsonb,
                       coalesce(x.enc, false), x.sub
                FROM unnest(p_idx, p_queue, p_partition, p_id, p_txid, p_trace, p_payload,
                            p_encrypted, p_sub)
                     AS x(i, qn, pn, mid, txid, trace, payload, enc, sub)
                JOIN unnest(v_qn, v_pn, v_pids, v_lasts) AS k(qn, pn, pid, last)
                  ON k.qn = x.qn AND k.pn = x.pn)
            UPDATE queen.partitions pt
            SET last_seq = k.last + k.n, last_message_at = now(), last_activity = now(),
                last_accept_us = greatest(pt.last_accept_us, k.macc)
            FROM unnest(v_pids, v_lasts, v_ns, v_maccs) AS k(pid, last, n, macc)
            WHERE pt.id = k.pid;
            v_inserted := true;
        EXCEPTION WHEN unique_violation THEN
            v_inserted := false;
        END;
        IF v_inserted THEN
            RETURN QUERY
            SELECT x.i, x.mid, k.pid, 'queued'::text, x.acc < k.acc, NULL::text, NULL::text
            FROM unnest(p_idx, p_queue, p_partition, p_id, p_accept) AS x(i, qn, pn, mid, acc)
            JOIN unnest(v_qn, v_pn, v_pids, v_accs) AS k(qn, pn, pid, acc)
              ON k.qn = x.qn AND k.pn = x.pn
            ORDER BY x.i;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM queen.push_ordered_v4(p_idx, p_queue, p_partition, p_id, p_txid,
        p_trace, p_payload, p_encrypted, p_sub, p_accept, p_server, p_wait_ms, p_settle_ms, p_req);
END;
$$;
