-- Migration 0018: the claim and the ack planned once per connection.
--
-- A pop of one or two messages cost PostgreSQL about as much CPU as a push,
-- and a consumer at small batches pays it once per message per group. Most of
-- it was planning: pg_stat_statements (track_planning) showed two statements
-- planned anew on every call, in every connection, because their custom plans
-- looked cheaper than the generic one to the plan cache:
--
--   * pop_messages_v3's candidate query (about 150 us of a small pop's ~500):
--     its OR-ed filters ("p_queue IS NULL OR q.name = p_queue", ...) made the
--     generic plan unable to use the indexes a custom plan folds them into;
--   * ack_messages_v4's lookup of the acked messages (about 60 us of a small
--     ack's ~250): its rows are the length of the acked array, which a custom
--     plan sees and a generic one does not, for the same plan.
--
-- What changes:
--
--   * queen.claim_candidates_v1(group): the partitions a claim looks at, with
--     their queue's settings and the group's cursor, lease and policy. A
--     STABLE SQL function of one SELECT, so the planner inlines it into the
--     query that calls it and uses the indexes of that query's filters.
--   * queen.pop_messages_v5 = pop_messages_v3 with its candidates taken by one
--     of four statements, by the shape of the call (queue and partition named;
--     queue named with hinted partitions only; queue named, a scan; no queue
--     named). Each of the first three has one right generic plan, and the
--     function runs with plan_cache_mode = force_generic_plan; the fourth
--     (namespace / task pops) is planned per call with its values, as before.
--     Same arguments, rows, locks and order as pop_messages_v3.
--   * queen.ack_messages_v5 = ack_messages_v4 planned once per connection
--     (plan_cache_mode = force_generic_plan), its fast path one statement
--     instead of four: a single UPDATE of the group's cursor row checks the
--     live lease, that the items name distinct stored messages after the
--     cursor and within the lease, and moves the cursor onto the newest (its
--     lookups of the acked messages in CTEs). A row that does not qualify is
--     not updated and ack_messages_v3 takes the items, as in v4. Same
--     arguments and rows; the UPDATE locks a qualifying row as v4's SELECT
--     ... FOR UPDATE did (and rechecks it when a concurrent ack moved it
--     first), and ack_messages_v3 locks any other, as in v4.
--
-- Upgrade-safe: nothing is dropped or rewritten; brokers of the previous
-- release keep calling pop_messages_v3 and ack_messages_v4 (unchanged). The
-- name pop_messages_v4 is left unused: a development version of migration
-- 0017 had it.

-------------------------------------------------------------------------------
-- claim_candidates_v1: the partitions a claim looks at (inlined by the planner).
-------------------------------------------------------------------------------
CREATE FUNCTION queen.claim_candidates_v1(p_group text)
RETURNS TABLE (qn text, ns text, tk text, lease_time integer, delayed_processing integer,
               window_buffer integer, pid uuid, pn text, last_seq bigint,
               last_message_at timestamptz, cursor_seq bigint, lease_expires_at timestamptz,
               last_claimed_at timestamptz, conflate boolean)
LANGUAGE sql STABLE AS $$
    SELECT q.name, q.namespace, q.task, q.lease_time, q.delayed_processing, q.window_buffer,
           pt.id, pt.name, pt.last_seq, pt.last_message_at,
           l.cursor_seq, l.lease_expires_at, l.last_claimed_at,
           coalesce(gp.conflation, false)
    FROM queen.queues q
    JOIN queen.partitions pt ON pt.queue_id = q.id
    LEFT JOIN queen.log_consumers l ON l.partition_id = pt.id AND l.consumer_group = p_group
    LEFT JOIN queen.group_policies gp ON gp.queue_name = q.name AND gp.consumer_group = p_group
$$;

-------------------------------------------------------------------------------
-- pop_messages_v5: pop_messages_v3 with its candidates by the call's shape.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.pop_messages_v5(
    p_queue text, p_partition text, p_namespace text, p_task text,
    p_group text, p_batch integer, p_max_partitions integer, p_auto_ack boolean,
    p_lease_id uuid, p_hints text[], p_only boolean)
RETURNS TABLE (kind text, queue_name text, partition_name text, partition_id uuid,
               message_id uuid, transaction_id text, trace_id uuid, payload jsonb,
               is_encrypted boolean, producer_sub text, created_at timestamptz,
               seq bigint, retry_count integer, verdict text, verdict_secs double precision,
               retired bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    cands refcursor;
    c record;
    lc record;
    m record;
    budget integer := greatest(p_batch, 1);
    claimed integer := 0;
    got integer;
    last_seq_read bigint;
    last_id uuid;
    last_created timestamptz;
    start_ts timestamptz;
    start_seq bigint;
    reason text := 'empty';
    saw_candidate boolean := false;
    wildcard boolean := p_partition IS NULL AND NOT coalesce(p_only, false);
    lease_secs integer;
    next_visible timestamptz;
    passed bigint;
BEGIN
    -- The candidates, by the shape of the call: each shape is one statement whose
    -- generic plan is the right one (an index on the queue's name, then on the
    -- partition's name or the queue's partitions), so it is planned once per
    -- connection. A pop naming no queue (namespace / task) is planned per call
    -- with its values, as every shape was before.
    IF p_queue IS NOT NULL AND p_partition IS NOT NULL THEN
        OPEN cands FOR
            SELECT * FROM queen.claim_candidates_v1(p_group) k
            WHERE k.qn = p_queue AND k.pn = p_partition
              AND (NOT coalesce(p_only, false) OR k.pn = ANY(p_hints));
    ELSIF p_queue IS NOT NULL AND coalesce(p_only, false) THEN
        OPEN cands FOR
            SELECT * FROM queen.claim_candidates_v1(p_group) k
            WHERE k.qn = p_queue AND k.pn = ANY(p_hints)
            ORDER BY array_position(p_hints, k.pn) NULLS LAST,
                     coalesce(k.last_claimed_at, '-infinity'::timestamptz), k.pid
            LIMIT coalesce(array_length(p_hints, 1), 0);
    ELSIF p_queue IS NOT NULL THEN
        -- a scan only looks at partitions with something after the cursor
        OPEN cands FOR
            SELECT * FROM queen.claim_candidates_v1(p_group) k
            WHERE k.qn = p_queue AND k.last_seq > coalesce(k.cursor_seq, 0)
              AND (k.lease_expires_at IS NULL OR k.lease_expires_at <= now())
            ORDER BY array_position(p_hints, k.pn) NULLS LAST,
                     coalesce(k.last_claimed_at, '-infinity'::timestamptz), k.pid
            LIMIT greatest(p_max_partitions, 1) * 4 + 16;
    ELSE
        OPEN cands FOR EXECUTE $q$
            SELECT * FROM queen.claim_candidates_v1($1) k
            WHERE ($2 IS NULL OR k.ns = $2) AND ($3 IS NULL OR k.tk = $3)
              AND ($4 IS NULL OR k.pn = $4)
              AND (NOT $5 OR k.pn = ANY($6))
              AND (NOT $7 OR k.last_seq > coalesce(k.cursor_seq, 0))
              AND (NOT $7 OR k.lease_expires_at IS NULL OR k.lease_expires_at <= now())
            ORDER BY array_position($6, k.pn) NULLS LAST,
                     coalesce(k.last_claimed_at, '-infinity'::timestamptz), k.pid
            LIMIT CASE WHEN $4 IS NOT NULL THEN 1
                       WHEN $5 THEN coalesce(array_length($6, 1), 0)
                       ELSE greatest($8, 1) * 4 + 16 END
        $q$ USING p_group, p_namespace, p_task, p_partition, coalesce(p_only, false), p_hints,
                  wildcard, p_max_partitions;
    END IF;
    LOOP
        FETCH cands INTO c;
        EXIT WHEN NOT FOUND;
        saw_candidate := true;
        retired := NULL;
        kind := 'verdict'; queue_name := c.qn; partition_name := c.pn; partition_id := c.pid;
        message_id := NULL; transaction_id := NULL; trace_id := NULL; payload := NULL;
        is_encrypted := NULL; producer_sub := NULL; created_at := NULL; seq := NULL;
        retry_count := NULL;
        IF c.last_seq <= coalesce(c.cursor_seq, 0) AND c.cursor_seq IS NOT NULL THEN
            verdict := 'empty'; verdict_secs := NULL; RETURN NEXT;
            CONTINUE;
        END IF;
        IF c.window_buffer > 0 AND c.last_message_at IS NOT NULL
           AND c.last_message_at > now() - make_interval(secs => c.window_buffer) THEN
            reason := 'window_buffer';
            verdict := 'deferred';
            verdict_secs := extract(epoch FROM c.last_message_at
                                    + make_interval(secs => c.window_buffer) - now());
            RETURN NEXT;
            CONTINUE;
        END IF;

        -- First contact: the cursor starts per the group's subscription.
        IF c.cursor_seq IS NULL THEN
            start_seq := 0;
            IF p_group <> '__QUEUE_MODE__' THEN
                start_ts := queen.subscription_start(p_group, c.qn, c.pn, c.ns, c.tk);
                IF start_ts IS NOT NULL THEN
                    SELECT coalesce(max(mm.seq), 0) INTO start_seq
                    FROM queen.messages mm
                    WHERE mm.partition_id = c.pid AND mm.created_at <= start_ts;
                END IF;
            END IF;
            INSERT INTO queen.log_consumers AS l (partition_id, consumer_group, cursor_seq)
            VALUES (c.pid, p_group, start_seq)
            ON CONFLICT ON CONSTRAINT log_consumers_pkey DO NOTHING;
        END IF;

        -- Claim: a row another consumer is claiming right now is skipped.
        SELECT * INTO lc FROM queen.log_consumers l
        WHERE l.partition_id = c.pid AND l.consumer_group = p_group
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND OR (lc.lease_expires_at IS NOT NULL AND lc.lease_expires_at > now()) THEN
            reason := 'lease_held';
            kind := 'verdict'; verdict := 'leased';
            verdict_secs := CASE WHEN FOUND THEN extract(epoch FROM lc.lease_expires_at - now()) END;
            RETURN NEXT;
            CONTINUE;
        END IF;

        got := 0;
        passed := 0;
        FOR m IN
            (SELECT mm.id, mm.transaction_id, mm.trace_id, mm.payload, mm.is_encrypted,
                    mm.producer_sub, mm.created_at, mm.seq
             FROM queen.messages mm
             WHERE NOT c.conflate AND mm.partition_id = c.pid AND mm.seq > lc.cursor_seq
               AND (c.delayed_processing <= 0
                    OR mm.created_at <= now() - make_interval(secs => c.delayed_processing))
             ORDER BY mm.seq
             LIMIT budget)
        UNION ALL
            -- a conflating group: the newest visible message only
            (SELECT mm.id, mm.transaction_id, mm.trace_id, mm.payload, mm.is_encrypted,
                    mm.producer_sub, mm.created_at, mm.seq
             FROM queen.messages mm
             WHERE c.conflate AND mm.partition_id = c.pid AND mm.seq > lc.cursor_seq
               AND (c.delayed_processing <= 0
                    OR mm.created_at <= now() - make_interval(secs => c.delayed_processing))
             ORDER BY mm.seq DESC
             LIMIT 1)
        LOOP
            got := got + 1;
            last_seq_read := m.seq; last_id := m.id; last_created := m.created_at;
            kind := 'msg'; queue_name := c.qn; partition_name := c.pn; partition_id := c.pid;
            message_id := m.id; transaction_id := m.transaction_id; trace_id := m.trace_id;
            payload := m.payload; is_encrypted := m.is_encrypted; producer_sub := m.producer_sub;
            created_at := m.created_at; seq := m.seq; retry_count := lc.batch_retry_count;
            verdict := NULL; verdict_secs := NULL;
            IF c.conflate THEN
                passed := m.seq - 1 - lc.cursor_seq;  -- the positions behind it, retired
            END IF;
            RETURN NEXT;
        END LOOP;

        kind := 'verdict'; message_id := NULL; transaction_id := NULL; trace_id := NULL;
        payload := NULL; is_encrypted := NULL; producer_sub := NULL; created_at := NULL;
        seq := NULL; retry_count := NULL;
        IF got = 0 THEN
            verdict := 'empty'; verdict_secs := NULL;
            IF c.delayed_processing > 0 THEN
                -- messages after the cursor that are not old enough yet
                SELECT min(mm.created_at) INTO next_visible FROM queen.messages mm
                WHERE mm.partition_id = c.pid AND mm.seq > lc.cursor_seq;
                IF next_visible IS NOT NULL THEN
                    verdict := 'deferred';
                    verdict_secs := extract(epoch FROM next_visible
                                            + make_interval(secs => c.delayed_processing) - now());
                END IF;
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        lease_secs := CASE WHEN c.lease_time > 0 THEN c.lease_time ELSE 60 END;
        verdict := CASE WHEN p_auto_ack THEN 'took_autoack' ELSE 'took' END;
        verdict_secs := lease_secs;
        retired := passed;
        RETURN NEXT;
        retired := NULL;

        IF p_auto_ack THEN
            UPDATE queen.log_consumers l
            SET cursor_seq = last_seq_read, last_consumed_id = last_id,
                last_consumed_created_at = last_created, last_consumed_at = now(),
                total_messages_consumed = l.total_messages_consumed + got,
                total_batches_consumed = l.total_batches_consumed + 1,
                lease_id = NULL, lease_expires_at = NULL, lease_last_seq = NULL,
                batch_size = 0, acked_count = 0, last_claimed_at = now(), updated_at = now()
            WHERE l.partition_id = c.pid AND l.consumer_group = p_group;
        ELSE
            UPDATE queen.log_consumers l
            SET cursor_seq = greatest(l.cursor_seq, lc.cursor_seq + passed),
                lease_id = p_lease_id, lease_acquired_at = now(), last_claimed_at = now(),
                lease_expires_at = now() + make_interval(secs => lease_secs),
                lease_last_seq = last_seq_read, batch_size = got, acked_count = 0,
                updated_at = now()
            WHERE l.partition_id = c.pid AND l.consumer_group = p_group;
        END IF;

        claimed := claimed + 1;
        budget := budget - got;
        EXIT WHEN claimed >= greatest(p_max_partitions, 1) OR budget <= 0 OR p_partition IS NOT NULL;
    END LOOP;
    CLOSE cands;

    IF claimed = 0 THEN
        kind := CASE WHEN NOT saw_candidate AND p_partition IS NOT NULL THEN 'partition_not_found'
                     ELSE reason END;
        queue_name := NULL; partition_name := NULL; partition_id := NULL; message_id := NULL;
        transaction_id := NULL; trace_id := NULL; payload := NULL; is_encrypted := NULL;
        producer_sub := NULL; created_at := NULL; seq := NULL; retry_count := NULL;
        verdict := NULL; verdict_secs := NULL; retired := NULL;
        RETURN NEXT;
    END IF;
END;
$$;

-------------------------------------------------------------------------------
-- ack_messages_v5: ack_messages_v4 with its fast path in one statement.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.ack_messages_v5(
    p_idx integer[], p_txid text[], p_pid uuid[], p_status text[], p_error text[],
    p_group text[], p_lease uuid[], p_failed_to_dlq boolean)
RETURNS TABLE (idx integer, success boolean, error text, queue_name text,
               partition_name text, lease_released boolean, dlq boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    g record;
    v_last_txid text;
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
            -- One statement checks what ack_messages_v4 checked in four and moves the
            -- cursor: the live lease is the one every item names; the items name distinct
            -- stored messages after the cursor and within the lease. The cursor moves onto
            -- the newest; the lease ends with its last message. When the row does not
            -- qualify, nothing is updated and ack_messages_v3 takes the group of items.
            WITH acked AS (
                SELECT count(*) AS n, count(mm.seq) AS found, count(DISTINCT mm.seq) AS d,
                       min(mm.seq) AS lo, max(mm.seq) AS hi
                FROM unnest(g.txid_a) AS t(txid)
                LEFT JOIN queen.messages mm
                       ON mm.partition_id = g.pid AND mm.transaction_id = t.txid
            ), newest AS (
                SELECT mm.id, mm.created_at, mm.transaction_id, a.n, a.lo, a.hi
                FROM acked a JOIN queen.messages mm
                  ON mm.partition_id = g.pid AND mm.seq = a.hi
                WHERE a.found = a.n AND a.d = a.n
            )
            UPDATE queen.log_consumers l
            SET cursor_seq = nw.hi, last_consumed_id = nw.id,
                last_consumed_created_at = nw.created_at,
                lease_id = CASE WHEN nw.hi >= l.lease_last_seq THEN NULL ELSE l.lease_id END,
                lease_expires_at = CASE WHEN nw.hi >= l.lease_last_seq THEN NULL
                                        ELSE l.lease_expires_at END,
                lease_last_seq = CASE WHEN nw.hi >= l.lease_last_seq THEN NULL
                                      ELSE l.lease_last_seq END,
                lease_acquired_at = CASE WHEN nw.hi >= l.lease_last_seq THEN NULL
                                         ELSE l.lease_acquired_at END,
                batch_size = CASE WHEN nw.hi >= l.lease_last_seq THEN 0 ELSE l.batch_size END,
                acked_count = CASE WHEN nw.hi >= l.lease_last_seq THEN 0
                                   ELSE l.acked_count + nw.n END,
                batch_retry_count = CASE WHEN nw.hi >= l.lease_last_seq THEN 0
                                         ELSE l.batch_retry_count END,
                total_messages_consumed = l.total_messages_consumed + nw.n,
                total_batches_consumed = l.total_batches_consumed
                    + CASE WHEN nw.hi >= l.lease_last_seq THEN 1 ELSE 0 END,
                last_consumed_at = now(), updated_at = now()
            FROM newest nw
            WHERE l.partition_id = g.pid AND l.consumer_group = g.grp
              AND l.lease_id IS NOT NULL AND l.lease_expires_at > now()
              AND l.lease_id = ALL(g.lease_a)
              AND nw.lo > l.cursor_seq AND nw.hi <= l.lease_last_seq
            RETURNING l.lease_id IS NULL, nw.transaction_id INTO v_release, v_last_txid;
            IF FOUND THEN
                RETURN QUERY
                SELECT x.i, true, NULL::text, g.qn, g.pn,
                       v_release AND x.txid = v_last_txid, false
                FROM unnest(g.i_a, g.txid_a) AS x(i, txid);
                CONTINUE;
            END IF;
        END IF;
        RETURN QUERY
        SELECT * FROM queen.ack_messages_v3(
            g.i_a, g.txid_a, array_fill(g.pid, ARRAY[cardinality(g.i_a)]), g.st_a, g.err_a,
            array_fill(g.grp, ARRAY[cardinality(g.i_a)]), g.lease_a, p_failed_to_dlq);
    END LOOP;
END;
$$;
