-- Migration 0007: queen.ack_messages_v2, an ack fold in time linear in its items.
--
-- Same arguments, rows and meaning as queen.ack_messages (0001_base.sql, whose
-- comment describes the statuses and the lease rules, kept here unchanged).
-- One change, found by timing folds (benchmarks/README.md): the loop over
-- (partition, consumer group) groups read each group's items by filtering all
-- of the call's items, groups x items rows per call; each group now carries
-- its items as arrays from the one grouping query.
-- Brokers of the previous release keep calling queen.ack_messages during a
-- rolling upgrade; both lock the same cursor rows in the same order, so they mix.

CREATE FUNCTION queen.ack_messages_v2(
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
        -- Each group carries its own items (arrays in input order), so the
        -- loop below reads only them: filtering all of the call's items per
        -- group cost groups x items rows (4x the CPU of separate calls for a
        -- fold of 64 groups of 100).
        SELECT x.pid, x.grp, pt.id IS NOT NULL AS known, q.name AS qn, pt.name AS pn,
               q.retry_limit,
               array_agg(x.i ORDER BY x.i) AS i_a, array_agg(x.txid ORDER BY x.i) AS txid_a,
               array_agg(x.st ORDER BY x.i) AS st_a, array_agg(x.err ORDER BY x.i) AS err_a,
               array_agg(x.lease ORDER BY x.i) AS lease_a
        FROM unnest(p_idx, p_txid, p_pid, p_status, p_error, p_group, p_lease)
             AS x(i, txid, pid, st, err, grp, lease)
        LEFT JOIN queen.partitions pt ON pt.id = x.pid
        LEFT JOIN queen.queues q ON q.id = pt.queue_id
        GROUP BY x.pid, x.grp, pt.id, q.name, pt.name, q.retry_limit
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
