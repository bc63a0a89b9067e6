-- Migration 0017: less PostgreSQL work per message on the hot paths.
--
-- Every microsecond PostgreSQL spends per message is paid once per message
-- whatever the number of brokers, so it bounds the cluster. Measured with
-- benchmarks/pg_cost.py (figures in benchmarks/README.md, "PostgreSQL's cost
-- per message"): most of it was not in the rows but in PL/pgSQL and executor
-- work around them.
--
--   * queen.push_ordered_v5 = push_ordered_v4 with a fast path for the usual
--     call: every item to one partition that exists, of a queue without
--     maxSize (or with no checked item), while the database is not settling
--     and no broker holds spooled pushes. One statement locks the partition
--     and reads its counter; a batch of one is a plain INSERT and UPDATE; a
--     larger batch is inserted as it comes, the unique key on (partition,
--     transaction id) being the duplicate check: a duplicate, stored or
--     within the call, undoes that try in its subtransaction, and the call
--     goes to push_ordered_v4 as every other call does. Same arguments, rows
--     and locking order (the fast path locks one partition, the one v4
--     would).
--   * queen.ack_messages_v4 = ack_messages_v3 with a fast path per (partition,
--     group): when every item is 'completed' under the partition's live lease,
--     names a distinct stored message after the cursor and within the lease,
--     the cursor moves in one UPDATE and the rows come from one statement.
--     Any other group of items goes to ack_messages_v3 unchanged.
--   * The foreign key queen.messages(partition_id) -> queen.partitions is
--     replaced by a statement trigger that deletes a deleted partition's
--     messages. The key was checked once per inserted row (an SPI query and a
--     row lock each: about 10 % of a 100-item push). What it guaranteed still
--     holds: every insert into queen.messages is made by a statement that
--     locks and updates the partition's row in the same transaction (the
--     counter), so a partition's delete waits for it or it finds no partition,
--     and the trigger removes what a delete leaves, cascades from queues
--     included.
--
-- Upgrade-safe: brokers of the previous release keep calling v4 and v3, which
-- are unchanged; the trigger does for them what the cascade did. The two
-- tables are locked first, in the order the data path takes them (a push
-- locks its partition's row, then inserts the message): taking them one by
-- one, as CREATE TRIGGER and ALTER TABLE would, deadlocked with the pushes
-- of brokers still serving during a rolling upgrade.

LOCK TABLE queen.partitions, queen.messages IN ACCESS EXCLUSIVE MODE;


-------------------------------------------------------------------------------
-- Messages go with their partition (the foreign key's cascade, by trigger).
-------------------------------------------------------------------------------
CREATE FUNCTION queen.partition_messages_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.messages m USING gone g WHERE m.partition_id = g.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER partitions_delete_messages AFTER DELETE ON queen.partitions
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION queen.partition_messages_deleted();

ALTER TABLE queen.messages DROP CONSTRAINT IF EXISTS messages_partition_id_fkey;

-------------------------------------------------------------------------------
-- push_ordered_v5: push_ordered_v4 with a fast path for one partition.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.push_ordered_v5(
    p_idx integer[], p_queue text[], p_partition text[], p_id uuid[], p_txid text[],
    p_trace uuid[], p_payload text[], p_encrypted boolean[], p_sub text[], p_accept bigint[],
    p_server text, p_wait_ms integer, p_settle_ms integer, p_req bigint[])
RETURNS TABLE (idx integer, message_id uuid, partition_id uuid, status text, late boolean,
               peer text, error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_pid    uuid;
    v_last   bigint;
    v_acc    bigint;
    v_limit  integer;
    v_old    uuid;
    v_n      integer;
    v_inserted boolean;
BEGIN
    -- The fast path: every item to one partition that exists, of a queue without maxSize
    -- (or with no checked item), no settling, no spool backlog anywhere.
    IF p_queue[1] = ALL(p_queue) AND p_partition[1] = ALL(p_partition) THEN
        SELECT pt.id, pt.last_seq, pt.last_accept_us, q.max_size
        INTO v_pid, v_last, v_acc, v_limit
        FROM queen.queues q
        JOIN queen.partitions pt ON pt.queue_id = q.id AND pt.name = p_partition[1]
        WHERE q.name = p_queue[1]
        FOR NO KEY UPDATE OF pt;
        IF FOUND AND (coalesce(v_limit, 0) <= 0 OR cardinality(array_remove(p_req, NULL)) = 0)
           AND NOT queen.db_settling(p_settle_ms)
           AND NOT EXISTS (SELECT 1 FROM queen.spool_backlog) THEN
            v_n := cardinality(p_idx);
            IF v_n = 1 THEN
                SELECT m.id INTO v_old FROM queen.messages m
                WHERE m.partition_id = v_pid AND m.transaction_id = p_txid[1];
                idx := p_idx[1]; partition_id := v_pid; peer := NULL; error := NULL;
                IF FOUND THEN
                    message_id := v_old; status := 'duplicate'; late := false;
                    RETURN NEXT;
                    RETURN;
                END IF;
                INSERT INTO queen.messages
                    (id, partition_id, seq, transaction_id, trace_id, payload, is_encrypted, producer_sub)
                VALUES (p_id[1], v_pid, v_last + 1, p_txid[1], p_trace[1],
                        coalesce(p_payload[1], 'null')::jsonb, coalesce(p_encrypted[1], false), p_sub[1]);
                UPDATE queen.partitions pt
                SET last_seq = v_last + 1, last_message_at = now(), last_activity = now(),
                    last_accept_us = greatest(pt.last_accept_us, p_accept[1])
                WHERE pt.id = v_pid;
                message_id := p_id[1]; status := 'queued'; late := p_accept[1] < v_acc;
                RETURN NEXT;
                RETURN;
            END IF;
            -- The usual batch: transaction ids new to the partition and distinct. The
            -- unique key is the check; a duplicate undoes the try and v4 sorts it out.
            BEGIN
                INSERT INTO queen.messages
                    (id, partition_id, seq, transaction_id, trace_id, payload, is_encrypted, producer_sub)
                SELECT x.mid, v_pid, v_last + x.o, x.txid, x.trace,
                       coalesce(x.payload, 'null')::jsonb, coalesce(x.enc, false), x.sub
                FROM unnest(p_id, p_txid, p_trace, p_payload, p_encrypted, p_sub)
                     WITH ORDINALITY AS x(mid, txid, trace, payload, enc, sub, o);
                UPDATE queen.partitions pt
                SET last_seq = v_last + v_n, last_message_at = now(), last_activity = now(),
                    last_accept_us = greatest(pt.last_accept_us, (SELECT max(a) FROM unnest(p_accept) AS a))
                WHERE pt.id = v_pid;
                v_inserted := true;
            EXCEPTION WHEN unique_violation THEN
                v_inserted := false;
            END;
            IF v_inserted THEN
                RETURN QUERY
                SELECT x.i, x.mid, v_pid, 'queued'::text, x.acc < v_acc, NULL::text, NULL::text
                FROM unnest(p_idx, p_id, p_accept) AS x(i, mid, acc);
                RETURN;
            END IF;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM queen.push_ordered_v4(p_idx, p_queue, p_partition, p_id, p_txid,
        p_trace, p_payload, p_encrypted, p_sub, p_accept, p_server, p_wait_ms, p_settle_ms, p_req);
END;
$$;


-------------------------------------------------------------------------------
-- ack_messages_v4: ack_messages_v3 with a fast path per (partition, group).
-------------------------------------------------------------------------------
CREATE FUNCTION queen.ack_messages_v4(
    p_idx integer[], p_txid text[], p_pid uuid[], p_status text[], p_error text[],
    p_group text[], p_lease uuid[], p_failed_to_dlq boolean)
RETURNS TABLE (idx integer, success boolean, error text, queue_name text,
               partition_name text, lease_released boolean, dlq boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    g record;
    lc record;
    v_n integer; v_found integer; v_distinct integer;
    v_min bigint; v_max bigint; v_last_id uuid; v_last_created timestamptz; v_last_txid text;
    v_release boolean;
    v_one boolean := (p_pid[1] = ALL(p_pid) AND p_group[1] = ALL(p_group)) IS TRUE;
BEGIN
    FOR g IN
        -- The usual call acks for one (partition, group): its arrays as they came.
        SELECT p_pid[1] AS pid, p_group[1] AS grp, pt.id IS NOT NULL AS known, q.name AS qn,
               pt.name AS pn, p_idx AS i_a, p_txid AS txid_a, p_status AS st_a,
               p_error AS err_a, p_lease AS lease_a,
               (SELECT bool_and(s IN ('completed', 'success')) FROM unnest(p_status) AS s)
                   AS all_completed
        FROM (SELECT 1) AS one
        LEFT JOIN queen.partitions pt ON pt.id = p_pid[1]
        LEFT JOIN queen.queues q ON q.id = pt.queue_id
        WHERE v_one
        UNION ALL
        SELECT x.pid, x.grp, pt.id IS NOT NULL AS known, q.name AS qn, pt.name AS pn,
               array_agg(x.i ORDER BY x.i) AS i_a, array_agg(x.txid ORDER BY x.i) AS txid_a,
               array_agg(x.st ORDER BY x.i) AS st_a, array_agg(x.err ORDER BY x.i) AS err_a,
               array_agg(x.lease ORDER BY x.i) AS lease_a,
               bool_and(x.st IN ('completed', 'success')) AS all_completed
        FROM unnest(p_idx, p_txid, p_pid, p_status, p_error, p_group, p_lease)
             AS x(i, txid, pid, st, err, grp, lease)
        LEFT JOIN queen.partitions pt ON pt.id = x.pid
        LEFT JOIN queen.queues q ON q.id = pt.queue_id
        WHERE NOT v_one
        GROUP BY x.pid, x.grp, pt.id, q.name, pt.name
        ORDER BY 1, 2
    LOOP
        IF g.known AND g.all_completed THEN
            SELECT * INTO lc FROM queen.log_consumers l
            WHERE l.partition_id = g.pid AND l.consumer_group = g.grp FOR UPDATE;
            IF FOUND AND lc.lease_id IS NOT NULL AND lc.lease_expires_at > now()
               AND lc.lease_id = ALL(g.lease_a) THEN
                SELECT count(*), count(mm.seq), count(DISTINCT mm.seq), min(mm.seq), max(mm.seq)
                INTO v_n, v_found, v_distinct, v_min, v_max
                FROM unnest(g.txid_a) AS t(txid)
                LEFT JOIN queen.messages mm
                       ON mm.partition_id = g.pid AND mm.transaction_id = t.txid;
                IF v_found = v_n AND v_distinct = v_n AND v_min > lc.cursor_seq
                   AND v_max <= lc.lease_last_seq THEN
                    SELECT mm.id, mm.created_at, mm.transaction_id
                    INTO v_last_id, v_last_created, v_last_txid
                    FROM queen.messages mm WHERE mm.partition_id = g.pid AND mm.seq = v_max;
                    -- What ack_messages_v3 does item by item, at once: the cursor moves
                    -- onto the newest acked message; the lease ends with its last one.
                    v_release := v_max >= lc.lease_last_seq;
                    UPDATE queen.log_consumers l
                    SET cursor_seq = v_max, last_consumed_id = v_last_id,
                        last_consumed_created_at = v_last_created,
                        lease_id = CASE WHEN v_release THEN NULL ELSE l.lease_id END,
                        lease_expires_at = CASE WHEN v_release THEN NULL ELSE l.lease_expires_at END,
                        lease_last_seq = CASE WHEN v_release THEN NULL ELSE l.lease_last_seq END,
                        lease_acquired_at = CASE WHEN v_release THEN NULL ELSE l.lease_acquired_at END,
                        batch_size = CASE WHEN v_release THEN 0 ELSE l.batch_size END,
                        acked_count = CASE WHEN v_release THEN 0 ELSE l.acked_count + v_n END,
                        batch_retry_count = CASE WHEN v_release THEN 0 ELSE l.batch_retry_count END,
                        total_messages_consumed = l.total_messages_consumed + v_n,
                        total_batches_consumed = l.total_batches_consumed
                            + CASE WHEN v_release THEN 1 ELSE 0 END,
                        last_consumed_at = now(), updated_at = now()
                    WHERE l.partition_id = g.pid AND l.consumer_group = g.grp;
                    RETURN QUERY
                    SELECT x.i, true, NULL::text, g.qn, g.pn,
                           v_release AND x.txid = v_last_txid, false
                    FROM unnest(g.i_a, g.txid_a) AS x(i, txid);
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        RETURN QUERY
        SELECT * FROM queen.ack_messages_v3(
            g.i_a, g.txid_a, array_fill(g.pid, ARRAY[cardinality(g.i_a)]), g.st_a, g.err_a,
            array_fill(g.grp, ARRAY[cardinality(g.i_a)]), g.lease_a, p_failed_to_dlq);
    END LOOP;
END;
$$;
