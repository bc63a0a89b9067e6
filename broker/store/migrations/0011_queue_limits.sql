-- Migration 0011: the queue options maxSize and retryDelay are applied.
--
-- Before: both were stored and reported, and nothing acted on them: a queue with
-- maxSize 2 took every push, and a failed message came back at once whatever
-- retryDelay said.
--
-- After:
--   * queen.push_ordered_v4 = push_ordered_v3 plus the maxSize check. Items of
--     a queue with max_size > 0 are admitted one push request at a time
--     (p_req: the request each item came in; NULL = not checked) in the order
--     of the call: a request's fresh items of that queue (not already stored,
--     first of their transactionId in the request) are refused together when
--     the queue's depth plus them would pass max_size. Refused items are
--     neither staged nor inserted and answer status 'refused' with the text
--     "Queue '<name>' would exceed max capacity (<max>). Current: <depth>,
--     Batch: <n>".
--     The depth of a queue: per partition, the messages after the least
--     advanced cursor of the consumers that read it (queue mode being one; a
--     partition no one read counts whole: broker/store/figures_sql.py's
--     pending + processing), summed, plus the queue's rows waiting in
--     queen.staged. It is computed as last_seq - max(least cursor, first
--     stored seq - 1): two index probes per partition, no count of messages,
--     and only for queues with max_size > 0. Retention and eviction delete the
--     oldest messages, so the positions after the cursor are stored ones; a
--     message deleted in the middle by an operator is counted until the
--     cursors pass it (an over-count: it refuses early, never late).
--     Concurrent pushes to one limited queue take transaction advisory lock
--     (737011, hashtext(queue name)) after their partition locks, so two
--     commits cannot both pass the same room.
--     Not checked (p_req NULL): pushes that were acknowledged before they get
--     here and so must not be lost: spooled pushes (merged by merge_staged,
--     which does not look at max_size), a quarantined event replayed, a timer
--     delivered, a dead letter an operator retries. They count in the depth
--     once stored, so later checked pushes are refused until consumers catch
--     up.
--   * queen.ack_messages_v3 = ack_messages_v2 plus retryDelay: a failed ack
--     below retryLimit (the partition's batch comes back to that group) holds
--     the partition for that group for retry_delay ms: the lease id goes,
--     lease_expires_at is set to the end of the delay, which every pop
--     (pop_messages, of this release and the previous ones) already reads as
--     "leased until". Dead-lettering, 'retry' and lease expiry do not delay.
--   * retryDelay defaults to 0 (immediate redelivery, what the broker always
--     did). Queues holding the old default 1000, which never had an effect,
--     are set to 0, so no queue's behaviour changes by this migration; a
--     queue configured with any other retryDelay gets it applied from now on.
--
-- Brokers of the previous release keep calling push_ordered_v3 and
-- ack_messages_v2 during a rolling upgrade: their pushes are not checked
-- against maxSize and their failed acks do not delay. Both pairs lock the same
-- rows in the same order, so they mix.

ALTER TABLE queen.queues ALTER COLUMN retry_delay SET DEFAULT 0;
UPDATE queen.queues SET retry_delay = 0 WHERE retry_delay = 1000;

-------------------------------------------------------------------------------
-- push_ordered_v4: push_ordered_v3 with queues' max_size enforced.
--
-- Arguments: v3's, plus p_req (the push request of each item, NULL: not
-- checked against max_size). Rows: v3's (status 'queued', 'duplicate',
-- 'staged') plus 'refused', and a column error (the refusal's text).
-------------------------------------------------------------------------------
CREATE FUNCTION queen.push_ordered_v4(
    p_idx integer[], p_queue text[], p_partition text[], p_id uuid[],
    p_txid text[], p_trace uuid[], p_payload text[], p_encrypted boolean[],
    p_sub text[], p_accept bigint[], p_server text, p_wait_ms integer, p_settle_ms integer,
    p_req bigint[])
RETURNS TABLE (idx integer, message_id uuid, partition_id uuid, status text, late boolean,
               peer text, error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_wanted  integer;
    v_locked  integer;
    v_staged  integer[];
    v_base    bigint;
    v_lq      text[];     -- the call's queues with max_size > 0 (checked items only) ...
    v_lid     uuid[];     -- ... their ids,
    v_lmax    integer[];  -- ... their max_size,
    v_dep     bigint[];   -- ... and their depth, growing as requests are admitted
    v_name    text;
    v_qid     uuid;
    v_depth   bigint;
    v_grp     record;
    v_k       integer;
    v_refused integer[] := '{}';
    v_errors  text[] := '{}';   -- parallel to v_refused
BEGIN
    SELECT count(DISTINCT (x.qn, x.pn)) INTO v_wanted FROM unnest(p_queue, p_partition) AS x(qn, pn);
    SELECT count(*) INTO v_locked FROM (
        SELECT 1 FROM queen.partitions pt
        WHERE pt.id IN (
            SELECT p2.id FROM unnest(p_queue, p_partition) AS x(qn, pn)
            JOIN queen.queues q ON q.name = x.qn
            JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn)
        ORDER BY pt.id
        FOR NO KEY UPDATE) l;

    IF v_locked < v_wanted THEN
        INSERT INTO queen.queues AS q (name, namespace, task)
        SELECT DISTINCT n, split_part(n, '.', 1), split_part(n, '.', 2)
        FROM unnest(p_queue) AS n ORDER BY 1
        ON CONFLICT (name) DO NOTHING;

        INSERT INTO queen.partitions AS pt (queue_id, name)
        SELECT DISTINCT q.id, x.pn
        FROM unnest(p_queue, p_partition) AS x(qn, pn)
        JOIN queen.queues q ON q.name = x.qn
        ORDER BY 1, 2
        ON CONFLICT (queue_id, name) DO NOTHING;

        PERFORM 1 FROM queen.partitions pt
        WHERE pt.id IN (
            SELECT p2.id FROM unnest(p_queue, p_partition) AS x(qn, pn)
            JOIN queen.queues q ON q.name = x.qn
            JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn)
        ORDER BY pt.id
        FOR NO KEY UPDATE;
    END IF;

    -- maxSize: the usual case finds no limited queue and costs this one lookup.
    SELECT array_agg(q.name ORDER BY q.name), array_agg(q.id ORDER BY q.name),
           array_agg(q.max_size ORDER BY q.name)
    INTO v_lq, v_lid, v_lmax
    FROM queen.queues q
    WHERE q.max_size > 0
      AND q.name IN (SELECT DISTINCT x.qn FROM unnest(p_queue, p_req) AS x(qn, req)
                     WHERE x.req IS NOT NULL);
    IF v_lq IS NOT NULL THEN
        -- One checked push at a time per limited queue, after the partition
        -- locks (a transaction holding a queue's lock never waits for a
        -- partition), in name order.
        FOREACH v_name IN ARRAY v_lq LOOP
            PERFORM pg_advisory_xact_lock(737011, hashtext(v_name));
        END LOOP;
        -- New statements: they see what committed while we waited. One statement per
        -- queue, with scalar parameters, so its plan is cached, not planned per call.
        v_dep := array_fill(0::bigint, ARRAY[cardinality(v_lq)]);
        FOR v_k IN 1 .. cardinality(v_lq) LOOP
            v_name := v_lq[v_k];
            v_qid := v_lid[v_k];
            SELECT coalesce(sum(p.last_seq - greatest(c.min_cursor,
                                                      coalesce(f.first_seq - 1, p.last_seq))), 0)
                   + coalesce((SELECT sum(sp.staged) FROM queen.staged_partitions sp
                               WHERE sp.queue_name = v_name), 0)
            INTO v_depth
            FROM queen.partitions p
            CROSS JOIN LATERAL (SELECT coalesce(min(l.cursor_seq), 0) AS min_cursor
                                FROM queen.log_consumers l WHERE l.partition_id = p.id) c
            LEFT JOIN LATERAL (SELECT m.seq AS first_seq FROM queen.messages m
                               WHERE m.partition_id = p.id AND p.last_seq > c.min_cursor
                               ORDER BY m.seq LIMIT 1) f ON true
            WHERE p.queue_id = v_qid;
            v_dep[v_k] := v_depth;
        END LOOP;

        FOR v_grp IN
            WITH it AS (
                SELECT x.i, x.qn, x.req, x.txid, p2.id AS pid
                FROM unnest(p_idx, p_queue, p_partition, p_txid, p_req) AS x(i, qn, pn, txid, req)
                JOIN queen.queues q ON q.name = x.qn
                JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn
                WHERE x.req IS NOT NULL AND x.qn = ANY(v_lq)),
            marked AS (
                SELECT it.*,
                       row_number() OVER (PARTITION BY it.pid, it.txid, it.req ORDER BY it.i) AS copy_no,
                       EXISTS (SELECT 1 FROM queen.messages m
                               WHERE m.partition_id = it.pid AND m.transaction_id = it.txid) AS stored
                FROM it)
            SELECT mk.qn, mk.req, array_agg(mk.i ORDER BY mk.i) AS items,
                   count(*) FILTER (WHERE mk.copy_no = 1 AND NOT mk.stored) AS n
            FROM marked mk
            GROUP BY mk.qn, mk.req
            ORDER BY min(mk.i), mk.qn
        LOOP
            v_k := array_position(v_lq, v_grp.qn);
            IF v_grp.n > 0 AND v_dep[v_k] + v_grp.n > v_lmax[v_k] THEN
                v_refused := v_refused || v_grp.items;
                v_errors := v_errors || array_fill(
                    format('Queue ''%s'' would exceed max capacity (%s). Current: %s, Batch: %s',
                           v_grp.qn, v_lmax[v_k], v_dep[v_k], v_grp.n),
                    ARRAY[cardinality(v_grp.items)]);
            ELSE
                v_dep[v_k] := v_dep[v_k] + v_grp.n;
            END IF;
        END LOOP;
    END IF;

    -- From here on v3, over the items not refused.
    IF queen.db_settling(p_settle_ms) THEN
        SELECT coalesce(array_agg(s.i ORDER BY s.i), '{}') INTO v_staged
        FROM unnest(p_idx) AS s(i) WHERE s.i <> ALL(v_refused);
    ELSIF EXISTS (SELECT 1 FROM queen.spool_backlog) THEN  -- the usual case: empty
        SELECT array_agg(y.i ORDER BY y.i) INTO v_staged
        FROM unnest(p_idx, p_queue, p_partition) AS y(i, qn, pn)
        WHERE y.i <> ALL(v_refused)
          AND EXISTS (SELECT 1 FROM queen.spool_backlog b
                      WHERE b.queue_name = y.qn AND b.partition_name = y.pn
                        AND b.server_id <> p_server
                        AND NOT queen.spool_server_dead(b.server_id, p_server, p_wait_ms));
    END IF;
    v_staged := coalesce(v_staged, '{}');

    IF cardinality(v_staged) > 0 THEN
        PERFORM queen.stage_count(array_agg(x.qn), array_agg(x.pn), array_agg(1::bigint))
        FROM unnest(p_idx, p_queue, p_partition) AS x(i, qn, pn)
        WHERE x.i = ANY(v_staged);
        -- rec_no keeps the call's item order among rows of one accept time
        v_base := nextval('queen.staged_direct_seq') * 1000000;
        INSERT INTO queen.staged
            (accept_us, spool_id, file_ms, file_seq, rec_no, queue_name, partition_name,
             message_id, transaction_id, trace_id, payload, is_encrypted, producer_sub)
        SELECT x.acc, p_server, 0, 0, v_base + x.i, x.qn, x.pn, x.mid, x.txid, x.trace,
               coalesce(x.payload, 'null')::jsonb, coalesce(x.enc, false), x.sub
        FROM unnest(p_idx, p_queue, p_partition, p_id, p_txid, p_trace, p_payload, p_encrypted,
                    p_sub, p_accept)
             AS x(i, qn, pn, mid, txid, trace, payload, enc, sub, acc)
        WHERE x.i = ANY(v_staged);
    END IF;

    RETURN QUERY
    WITH items AS (
        SELECT x.*, p2.id AS pid, x.acc < p2.last_accept_us AS is_late
        FROM unnest(p_idx, p_queue, p_partition, p_id, p_txid, p_trace, p_payload, p_encrypted,
                    p_sub, p_accept)
             AS x(i, qn, pn, mid, txid, trace, payload, enc, sub, acc)
        JOIN queen.queues q ON q.name = x.qn
        JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn
        WHERE x.i <> ALL(v_staged) AND x.i <> ALL(v_refused)
    ),
    ranked AS (
        SELECT it.*,
               first_value(it.i) OVER w AS first_i,
               first_value(it.mid) OVER w AS first_mid,
               (SELECT m.id FROM queen.messages m
                WHERE m.partition_id = it.pid AND m.transaction_id = it.txid) AS old_id
        FROM items it
        WINDOW w AS (PARTITION BY it.pid, it.txid ORDER BY it.i)
    ),
    fresh AS (
        SELECT r.*, row_number() OVER (PARTITION BY r.pid ORDER BY r.i) AS rn
        FROM ranked r
        WHERE r.old_id IS NULL AND r.i = r.first_i
    ),
    bumped AS (
        UPDATE queen.partitions pt
        SET last_seq = pt.last_seq + c.n, last_message_at = now(), last_activity = now(),
            last_accept_us = greatest(pt.last_accept_us, c.acc)
        FROM (SELECT fr.pid, count(*) AS n, max(fr.acc) AS acc FROM fresh fr GROUP BY fr.pid) c
        WHERE pt.id = c.pid
        RETURNING pt.id, pt.last_seq - c.n AS base
    ),
    inserted AS (
        INSERT INTO queen.messages AS m
            (id, partition_id, seq, transaction_id, trace_id, payload, is_encrypted, producer_sub)
        SELECT fr.mid, fr.pid, b.base + fr.rn, fr.txid, fr.trace,
               coalesce(fr.payload, 'null')::jsonb, coalesce(fr.enc, false), fr.sub
        FROM fresh fr JOIN bumped b ON b.id = fr.pid
    )
    SELECT r.i,
           coalesce(r.old_id, r.first_mid),
           r.pid,
           CASE WHEN r.old_id IS NULL AND r.i = r.first_i THEN 'queued' ELSE 'duplicate' END,
           r.is_late AND r.old_id IS NULL AND r.i = r.first_i,
           NULL::text,
           NULL::text
    FROM ranked r
    UNION ALL
    SELECT s.i, x.mid, NULL::uuid, 'staged', false, NULL::text, NULL::text
    FROM unnest(v_staged) AS s(i)
    JOIN unnest(p_idx, p_id) AS x(i, mid) ON x.i = s.i
    UNION ALL
    SELECT rf.i, NULL::uuid, NULL::uuid, 'refused', false, NULL::text, rf.err
    FROM unnest(v_refused, v_errors) AS rf(i, err)
    ORDER BY 1;
END;
$$;

-------------------------------------------------------------------------------
-- ack_messages_v3: ack_messages_v2 with the queue's retryDelay applied.
--
-- Same arguments and rows as v2 (0007; its statuses and lease rules in
-- 0001_base.sql). One change: when a failed ack below retryLimit released the
-- group's lease (the batch comes back from that message), the (partition,
-- group) row keeps no lease id but lease_expires_at = now() + retry_delay ms,
-- when retry_delay > 0: no pop hands the partition to that group before then
-- (a pop reads it as leased, verdict 'leased' with the seconds left, so parked
-- pops re-check when it ends). Other groups are not held.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.ack_messages_v3(
    p_idx integer[], p_txid text[], p_pid uuid[], p_status text[], p_error text[],
    p_group text[], p_lease uuid[], p_failed_to_dlq boolean)
RETURNS TABLE (idx integer, success boolean, error text, queue_name text,
               partition_name text, lease_released boolean, dlq boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    g record;
    it record;
    lc record;
    cur bigint; cur_id uuid; cur_created timestamptz;
    l_id uuid; l_exp timestamptz; l_last bigint;
    retries integer; acked integer; consumed integer; released_by_failure boolean;
    did_release boolean;
BEGIN
    FOR g IN
        SELECT x.pid, x.grp, pt.id IS NOT NULL AS known, q.name AS qn, pt.name AS pn,
               q.retry_limit, q.retry_delay,
               array_agg(x.i ORDER BY x.i) AS i_a, array_agg(x.txid ORDER BY x.i) AS txid_a,
               array_agg(x.st ORDER BY x.i) AS st_a, array_agg(x.err ORDER BY x.i) AS err_a,
               array_agg(x.lease ORDER BY x.i) AS lease_a
        FROM unnest(p_idx, p_txid, p_pid, p_status, p_error, p_group, p_lease)
             AS x(i, txid, pid, st, err, grp, lease)
        LEFT JOIN queen.partitions pt ON pt.id = x.pid
        LEFT JOIN queen.queues q ON q.id = pt.queue_id
        GROUP BY x.pid, x.grp, pt.id, q.name, pt.name, q.retry_limit, q.retry_delay
        ORDER BY x.pid, x.grp
    LOOP
        IF NOT g.known THEN
            RETURN QUERY
            SELECT x.i, false, 'Message not found'::text, NULL::text, NULL::text, false, false
            FROM unnest(g.i_a) AS x(i);
            CONTINUE;
        END IF;

        INSERT INTO queen.log_consumers AS l (partition_id, consumer_group)
        VALUES (g.pid, g.grp)
        ON CONFLICT ON CONSTRAINT log_consumers_pkey DO NOTHING;
        SELECT * INTO lc FROM queen.log_consumers l
        WHERE l.partition_id = g.pid AND l.consumer_group = g.grp FOR UPDATE;

        cur := lc.cursor_seq; cur_id := lc.last_consumed_id; cur_created := lc.last_consumed_created_at;
        l_id := lc.lease_id; l_exp := lc.lease_expires_at; l_last := lc.lease_last_seq;
        retries := lc.batch_retry_count; acked := lc.acked_count; consumed := 0;
        released_by_failure := false;

        FOR it IN
            SELECT x.i, x.st, x.err, x.lease, mm.id AS mid, mm.seq AS mseq, mm.created_at AS mcreated
            FROM unnest(g.i_a, g.txid_a, g.st_a, g.err_a, g.lease_a) AS x(i, txid, st, err, lease)
            LEFT JOIN queen.messages mm ON mm.partition_id = g.pid AND mm.transaction_id = x.txid
            ORDER BY mm.seq NULLS FIRST, x.i
        LOOP
            idx := it.i; queue_name := g.qn; partition_name := g.pn;
            success := true; error := NULL; lease_released := false; dlq := false;
            did_release := false;

            IF it.mid IS NULL THEN
                success := false; error := 'Message not found';
            ELSIF it.mseq <= cur THEN
                NULL;  -- already acknowledged (or dead-lettered): success again
            ELSIF released_by_failure AND (it.lease IS NULL OR it.lease = lc.lease_id) THEN
                -- an earlier failure in this call already sent the batch back
                lease_released := true;
            ELSIF it.lease IS NOT NULL AND (l_id IS DISTINCT FROM it.lease OR l_exp IS NULL OR l_exp <= now()) THEN
                success := false; error := 'Invalid or expired lease';
            ELSIF it.st IN ('completed', 'success') THEN
                cur := it.mseq; cur_id := it.mid; cur_created := it.mcreated;
                acked := acked + 1; consumed := consumed + 1;
            ELSIF it.st = 'retry' THEN
                did_release := true;
            ELSIF it.st = 'failed' AND NOT p_failed_to_dlq AND retries < g.retry_limit THEN
                retries := retries + 1; did_release := true; released_by_failure := true;
            ELSIF it.st IN ('failed', 'dlq') THEN
                INSERT INTO queen.dead_letter_queue
                    (message_id, partition_id, consumer_group, error_message, retry_count, original_created_at)
                VALUES (it.mid, g.pid, g.grp,
                        coalesce(it.err, CASE WHEN it.st = 'failed' AND NOT p_failed_to_dlq
                                              THEN 'Retries exhausted' ELSE 'Unknown error' END),
                        retries, it.mcreated);
                cur := it.mseq; cur_id := it.mid; cur_created := it.mcreated;
                acked := acked + 1; retries := 0; dlq := true;
                IF p_failed_to_dlq THEN did_release := true; END IF;
            ELSE
                success := false; error := 'Invalid status: ' || coalesce(it.st, 'null');
            END IF;

            IF success AND l_id IS NOT NULL AND (did_release OR (l_last IS NOT NULL AND cur >= l_last)) THEN
                l_id := NULL; l_exp := NULL; l_last := NULL; acked := 0;
                IF NOT did_release THEN retries := 0; END IF;
                lease_released := true;
            END IF;
            RETURN NEXT;
        END LOOP;

        -- retryDelay: the failed batch comes back to this group no sooner than this.
        IF released_by_failure AND l_id IS NULL AND g.retry_delay > 0 THEN
            l_exp := now() + make_interval(secs => g.retry_delay / 1000.0);
        END IF;

        UPDATE queen.log_consumers l
        SET cursor_seq = cur, last_consumed_id = cur_id, last_consumed_created_at = cur_created,
            lease_id = l_id, lease_expires_at = l_exp, lease_last_seq = l_last,
            lease_acquired_at = CASE WHEN l_id IS NULL THEN NULL ELSE l.lease_acquired_at END,
            batch_size = CASE WHEN l_id IS NULL THEN 0 ELSE l.batch_size END,
            acked_count = acked, batch_retry_count = retries,
            total_messages_consumed = l.total_messages_consumed + consumed,
            total_batches_consumed = l.total_batches_consumed
                + CASE WHEN lc.lease_id IS NOT NULL AND l_id IS NULL THEN 1 ELSE 0 END,
            last_consumed_at = CASE WHEN consumed > 0 THEN now() ELSE l.last_consumed_at END,
            updated_at = now()
        WHERE l.partition_id = g.pid AND l.consumer_group = g.grp;
    END LOOP;
END;
$$;
