-- Migration 0013: conflation, last-value delivery for a consumer group.
--
-- A consumer group may conflate on a queue: each pop of a partition delivers
-- only the newest visible message, and the messages behind it are retired:
-- the group's cursor passes them, and they are never delivered to that group,
-- dead-lettered or counted as failures. The policy belongs to the (queue,
-- consumer group) and is stored when the group first pops the queue through a
-- broker of this release (with conflation=true, or without it: then false);
-- from then on the stored policy applies to every pop of that group on that
-- queue, whatever the request says. Deleting the group with its metadata
-- forgets it.
--
--   * queen.group_policies: (queue name, consumer group) -> conflation.
--   * queen.pop_messages_v2 = pop_messages plus the group's policy per queue:
--     a conflating partition yields its newest visible message (delayed
--     processing still applies; newer invisible ones wait for a later pop),
--     the claim moves the cursor to just behind it, in the same transaction
--     as the lease, and the 'took' verdict row's new column retired says how
--     many positions were passed. The lease, its ack and its failure are those
--     of a batch of one: an ack moves the cursor onto the message and releases
--     the lease; a failed ack below retryLimit brings the partition back, and
--     the next pop delivers the newest message again (which may be a newer
--     one, retiring the failed one); at retryLimit the message is
--     dead-lettered as any other. With autoAck the cursor moves onto the
--     delivered message at once. Non-conflating groups get exactly what
--     pop_messages gives.
--
-- Brokers of the previous release keep calling pop_messages, which does not
-- read queen.group_policies: their pops of a conflating group deliver every
-- message, until they are upgraded.

CREATE TABLE queen.group_policies (
    queue_name     text NOT NULL,
    consumer_group text NOT NULL,
    conflation     boolean NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_name, consumer_group)
);

-------------------------------------------------------------------------------
-- pop_messages_v2: pop_messages with each queue's conflation policy for the
-- group applied (see above). Arguments and rows as pop_messages, plus the
-- column retired (verdict 'took' / 'took_autoack' rows: positions a
-- conflating claim passed; 0 otherwise; NULL on other rows).
-------------------------------------------------------------------------------
CREATE FUNCTION queen.pop_messages_v2(
    p_queue text, p_partition text, p_namespace text, p_task text,
    p_group text, p_batch integer, p_max_partitions integer, p_auto_ack boolean,
    p_lease_id uuid, p_hints text[], p_only boolean)
RETURNS TABLE (kind text, queue_name text, partition_name text, partition_id uuid,
               message_id uuid, transaction_id text, trace_id uuid, payload jsonb,
               is_encrypted boolean, producer_sub text, created_at timestamptz,
               seq bigint, retry_count integer, verdict text, verdict_secs double precision,
               retired bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
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
    FOR c IN
        SELECT q.name AS qn, q.namespace AS ns, q.task AS tk, q.lease_time, q.delayed_processing,
               q.window_buffer, pt.id AS pid, pt.name AS pn, pt.last_seq, pt.last_message_at,
               l.cursor_seq, l.lease_expires_at, coalesce(gp.conflation, false) AS conflate
        FROM queen.queues q
        JOIN queen.partitions pt ON pt.queue_id = q.id
        LEFT JOIN queen.log_consumers l ON l.partition_id = pt.id AND l.consumer_group = p_group
        LEFT JOIN queen.group_policies gp ON gp.queue_name = q.name AND gp.consumer_group = p_group
        WHERE (p_queue IS NULL OR q.name = p_queue)
          AND (p_queue IS NOT NULL OR p_namespace IS NULL OR q.namespace = p_namespace)
          AND (p_queue IS NOT NULL OR p_task IS NULL OR q.task = p_task)
          AND (p_partition IS NULL OR pt.name = p_partition)
          AND (NOT coalesce(p_only, false) OR pt.name = ANY(p_hints))
          -- a scan only looks at partitions with something after the cursor
          AND (NOT wildcard OR pt.last_seq > coalesce(l.cursor_seq, 0))
          AND (NOT wildcard OR l.lease_expires_at IS NULL OR l.lease_expires_at <= now())
        ORDER BY array_position(p_hints, pt.name) NULLS LAST,
                 coalesce(l.lease_acquired_at, '-infinity'::timestamptz), pt.id
        LIMIT CASE WHEN p_partition IS NOT NULL THEN 1
                   WHEN p_only THEN coalesce(array_length(p_hints, 1), 0)
                   ELSE greatest(p_max_partitions, 1) * 4 + 16 END
    LOOP
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
                batch_size = 0, acked_count = 0, updated_at = now()
            WHERE l.partition_id = c.pid AND l.consumer_group = p_group;
        ELSE
            UPDATE queen.log_consumers l
            SET cursor_seq = greatest(l.cursor_seq, lc.cursor_seq + passed),
                lease_id = p_lease_id, lease_acquired_at = now(),
                lease_expires_at = now() + make_interval(secs => lease_secs),
                lease_last_seq = last_seq_read, batch_size = got, acked_count = 0,
                updated_at = now()
            WHERE l.partition_id = c.pid AND l.consumer_group = p_group;
        END IF;

        claimed := claimed + 1;
        budget := budget - got;
        EXIT WHEN claimed >= greatest(p_max_partitions, 1) OR budget <= 0 OR p_partition IS NOT NULL;
    END LOOP;

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
