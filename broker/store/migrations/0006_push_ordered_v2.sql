-- Migration 0006: queen.push_ordered_v2, the push path with less work per call.
--
-- Same arguments, rows and meaning as queen.push_ordered (0001_base.sql, whose
-- comment describes the spool-backlog rules, kept here unchanged). The changes
-- come from profiling a push (pg_stat_statements, auto_explain; benchmarks/README.md):
--   * the partition locks are taken first; the existence check that preceded
--     them (one more statement with the same joins) now runs only when a
--     partition is missing, i.e. on a queue's or partition's first push;
--   * queen.messages is probed once per item, not twice (the dedup anti-join,
--     then again for duplicates' ids), and the answer is computed from the
--     items alone: joining it with the inserted rows cost a nested loop of
--     items x inserted rows (the planner guesses one row for each), 10,000
--     comparisons for 100 items, a million for a fold of 1,000.
-- Brokers of the previous release keep calling queen.push_ordered during a
-- rolling upgrade; both lock the same rows in the same order, so they mix.

CREATE FUNCTION queen.push_ordered_v2(
    p_idx integer[], p_queue text[], p_partition text[], p_id uuid[],
    p_txid text[], p_trace uuid[], p_payload text[], p_encrypted boolean[],
    p_sub text[], p_accept bigint[], p_server text, p_replay boolean, p_next bigint[],
    p_wait_ms integer)
RETURNS TABLE (idx integer, message_id uuid, partition_id uuid, status text, late boolean,
               peer text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_wanted integer;     -- distinct (queue, partition) pairs of the call
    v_locked integer;     -- of those, partition rows found and locked
    v_backlog boolean;
    v_blocked integer[];  -- items not inserted (held or waiting) ...
    v_peers text[];       -- ... and whom each is held or waiting for
BEGIN
    -- Lock every touched partition row (in id order: concurrent pushes never
    -- deadlock). The usual case, every partition exists, is this one statement;
    -- only when one is missing are queues and partitions created and the
    -- locks taken again (the ones held are re-taken at no cost).
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

    -- New statements from here on: each sees every push and every backlog row
    -- committed while we waited for the locks above.
    v_backlog := EXISTS (SELECT 1 FROM queen.spool_backlog);  -- the usual case: empty

    IF v_backlog THEN
        IF p_replay THEN
            SELECT array_agg(x.i ORDER BY x.i), array_agg(x.peer ORDER BY x.i)
            INTO v_blocked, v_peers
            FROM (SELECT y.i, (SELECT b.server_id FROM queen.spool_backlog b
                               WHERE b.queue_name = y.qn AND b.partition_name = y.pn
                                 AND b.server_id <> p_server
                                 AND (b.oldest_accept_us, b.server_id) < (y.acc, p_server)
                                 AND NOT queen.spool_server_dead(b.server_id, p_server, p_wait_ms)
                               ORDER BY b.oldest_accept_us LIMIT 1) AS peer
                  FROM unnest(p_idx, p_queue, p_partition, p_accept) AS y(i, qn, pn, acc)) x
            WHERE x.peer IS NOT NULL;
            IF v_blocked IS NOT NULL THEN
                -- From a partition's first blocked item on, its later items wait too
                -- (this broker's own order); other partitions' items go ahead.
                SELECT array_agg(z.i ORDER BY z.i), array_agg(z.peer ORDER BY z.i)
                INTO v_blocked, v_peers
                FROM (SELECT y.i, p.peer,
                             bool_or(p.peer IS NOT NULL)
                                 OVER (PARTITION BY y.qn, y.pn ORDER BY y.i) AS behind
                      FROM unnest(p_idx, p_queue, p_partition) AS y(i, qn, pn)
                      LEFT JOIN unnest(v_blocked, v_peers) AS p(i, peer) ON p.i = y.i) z
                WHERE z.behind;
            END IF;
        ELSE
            SELECT array_agg(x.i ORDER BY x.i), array_agg(x.peer ORDER BY x.i)
            INTO v_blocked, v_peers
            FROM (SELECT y.i, (SELECT b.server_id FROM queen.spool_backlog b
                               WHERE b.queue_name = y.qn AND b.partition_name = y.pn
                                 AND b.server_id <> p_server
                                 AND NOT queen.spool_server_dead(b.server_id, p_server, p_wait_ms)
                               LIMIT 1) AS peer
                  FROM unnest(p_idx, p_queue, p_partition) AS y(i, qn, pn)) x
            WHERE x.peer IS NOT NULL;
            IF v_blocked IS NOT NULL THEN
                -- held: this broker now holds those partitions, from each item's accept time
                PERFORM queen.spool_beat(p_server, p_wait_ms);
                INSERT INTO queen.spool_backlog AS b
                    (queue_name, partition_name, server_id, oldest_accept_us)
                SELECT x.qn, x.pn, p_server, min(x.acc)
                FROM unnest(p_idx, p_queue, p_partition, p_accept) AS x(i, qn, pn, acc)
                WHERE x.i = ANY(v_blocked)
                GROUP BY x.qn, x.pn
                ON CONFLICT (queue_name, partition_name, server_id)
                DO UPDATE SET oldest_accept_us = least(b.oldest_accept_us, excluded.oldest_accept_us);
            END IF;
        END IF;
    END IF;
    v_blocked := coalesce(v_blocked, '{}');

    IF p_replay AND v_backlog THEN
        PERFORM queen.spool_beat(p_server, p_wait_ms);
        UPDATE queen.spool_backlog b
        SET oldest_accept_us = n.nxt
        FROM (SELECT DISTINCT ON (x.qn, x.pn) x.qn, x.pn, x.nxt
              FROM unnest(p_idx, p_queue, p_partition, p_next) AS x(i, qn, pn, nxt)
              WHERE x.i <> ALL(v_blocked)
              ORDER BY x.qn, x.pn, x.i DESC) n
        WHERE b.server_id = p_server AND b.queue_name = n.qn AND b.partition_name = n.pn;
    END IF;

    RETURN QUERY
    WITH items AS (
        SELECT x.*, p2.id AS pid, x.acc < p2.last_accept_us AS is_late
        FROM unnest(p_idx, p_queue, p_partition, p_id, p_txid, p_trace, p_payload, p_encrypted,
                    p_sub, p_accept)
             AS x(i, qn, pn, mid, txid, trace, payload, enc, sub, acc)
        JOIN queen.queues q ON q.name = x.qn
        JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn
        WHERE x.i <> ALL(v_blocked)
    ),
    ranked AS (
        -- Each item with the first occurrence of its (partition, transaction
        -- id) in this call (the first one wins), and the one probe of
        -- queen.messages per item (a scalar subquery: an index probe, whatever
        -- the planner guesses of the arrays' lengths).
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
        -- Runs to completion though nothing below reads it (PostgreSQL runs
        -- every data-modifying WITH); under the partition locks each fresh
        -- item is inserted or the call fails, so its id is known in advance.
        -- Joining the answer with this CTE instead cost items x inserted
        -- comparisons (a nested loop: the planner guesses 1 row).
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
           NULL::text
    FROM ranked r
    UNION ALL
    SELECT h.i, NULL::uuid, NULL::uuid, CASE WHEN p_replay THEN 'waiting' ELSE 'held' END,
           false, h.peer
    FROM unnest(v_blocked, v_peers) AS h(i, peer)
    ORDER BY 1;
END;
$$;
