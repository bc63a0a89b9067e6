-- Migration 0010: spools drain through a staging table in PostgreSQL (docs/spool-drain.md).
--
-- Before: each broker replayed its spool files 100 events per call through
-- push_ordered_v2 in replay mode, and a direct push to a partition some spool
-- held was answered 'held' and spooled on the broker's disk behind the backlog.
-- Under continuing traffic a held partition never caught up.
--
-- After:
--   * a broker uploads each spool file in one transaction (COPY) into
--     queen.staged, recording the file in queen.uploaded_files (so an upload
--     that is repeated after a crash is skipped) and moving its spool_backlog
--     rows on in the same transaction;
--   * queen.merge_staged moves the oldest staged rows into queen.messages in
--     large batches, in the cluster's accept order, with push_ordered's rules
--     (dedup by transactionId, positions under the partition lock);
--   * push_ordered_v3 stages a direct push to a partition that has staged rows
--     or a live spool's backlog, in the same transaction: it is durable at once
--     and no broker disk is involved, so the hold ends as soon as the merge
--     catches up;
--   * after the database restarted or failed over, while a multi-broker cluster
--     settles (p_settle_ms after the first push the new server takes), every
--     direct push is staged and nothing is merged: a broker that spooled during
--     the outage registers its backlog within that time, so its pushes are
--     merged before later direct pushes instead of landing behind them.
--
-- A partition with staged rows also has a spool_backlog row under the holder
-- name '(staged)', whose heartbeat never stops. Callers that predate staging
-- (push_ordered_v2: brokers of the previous release during a rolling upgrade,
-- and queen_streams.cycle_v1) therefore see the partition as held, as they
-- would a peer's spool, and never commit past staged rows.

CREATE TABLE IF NOT EXISTS queen.staged (
    accept_us      bigint  NOT NULL,   -- accepting broker's clock, microseconds
    spool_id       text    NOT NULL,   -- the spool (or, for a direct push, the broker's spool id)
    file_ms        bigint  NOT NULL,   -- spool file queen-<file_ms>-<file_seq>.buf; 0 for a direct push
    file_seq       integer NOT NULL,
    rec_no         bigint  NOT NULL,   -- record index in the file; a per-call number for a direct push
    queue_name     text    NOT NULL,
    partition_name text    NOT NULL,
    message_id     uuid    NOT NULL,
    transaction_id text    NOT NULL,
    trace_id       uuid,
    payload        jsonb   NOT NULL,
    is_encrypted   boolean NOT NULL,
    producer_sub   text,
    staged_at      timestamptz NOT NULL DEFAULT now(),
    -- The cluster's accept order (accept time, then spool id: push_ordered's
    -- tie-break), then the event's place in its spool. Every column comes from
    -- the spool file, so uploading a file twice produces the same keys.
    PRIMARY KEY (accept_us, spool_id, file_ms, file_seq, rec_no)
);

CREATE SEQUENCE IF NOT EXISTS queen.staged_direct_seq;

-- Partitions with staged rows, and how many: incremented by uploads and staged
-- pushes, decremented by the merge, deleted at zero (with the '(staged)' row).
CREATE TABLE IF NOT EXISTS queen.staged_partitions (
    queue_name     text   NOT NULL,
    partition_name text   NOT NULL,
    staged         bigint NOT NULL,
    PRIMARY KEY (queue_name, partition_name)
);

-- Spool files whose upload committed. Written first in the upload's
-- transaction: a broker that died after the commit but before deleting the file
-- finds its row next time and only deletes the file; a second upload of the
-- same file running at once waits on the row, then skips. The owning spool
-- prunes its rows once the files are gone.
CREATE TABLE IF NOT EXISTS queen.uploaded_files (
    spool_id    text        NOT NULL,
    file_ms     bigint      NOT NULL,
    file_seq    integer     NOT NULL,
    events      integer     NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (spool_id, file_ms, file_seq)
);

-- One row per PostgreSQL server start that took a push (keyed by
-- pg_postmaster_start_time()): a restart or a promoted standby is a new row.
-- 'follows': an earlier start is on record, so brokers may have spooled pushes
-- during the gap, and the cluster settles before merging (queen.db_settling).
CREATE TABLE IF NOT EXISTS queen.db_incarnations (
    started_at     timestamptz PRIMARY KEY,
    first_write_at timestamptz NOT NULL,
    follows        boolean     NOT NULL
);

-- The holder name of staged rows in queen.spool_backlog; it never goes silent.
INSERT INTO queen.spool_servers (server_id, seen_at, since)
VALUES ('(staged)', 'infinity', '-infinity')
ON CONFLICT (server_id) DO UPDATE SET seen_at = 'infinity', since = '-infinity';

-------------------------------------------------------------------------------
-- db_settling: true while this server settles after a restart or a failover:
-- p_settle_ms from the first push it took, when an earlier start is on record.
-- p_settle_ms <= 0 (a broker without peers: no other spool can be unknown to
-- it) answers false without reading anything.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.db_settling(p_settle_ms integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_first   timestamptz;
    v_follows boolean;
BEGIN
    IF p_settle_ms IS NULL OR p_settle_ms <= 0 THEN
        RETURN false;
    END IF;
    SELECT i.first_write_at, i.follows INTO v_first, v_follows
    FROM queen.db_incarnations i WHERE i.started_at = pg_postmaster_start_time();
    IF NOT FOUND THEN
        INSERT INTO queen.db_incarnations (started_at, first_write_at, follows)
        VALUES (pg_postmaster_start_time(), now(), EXISTS (SELECT 1 FROM queen.db_incarnations))
        ON CONFLICT (started_at) DO NOTHING;
        SELECT i.first_write_at, i.follows INTO v_first, v_follows
        FROM queen.db_incarnations i WHERE i.started_at = pg_postmaster_start_time();
    END IF;
    RETURN v_follows AND now() < v_first + make_interval(secs => p_settle_ms / 1000.0);
END;
$$;

-------------------------------------------------------------------------------
-- stage_count: count newly staged rows per (queue, partition) and hold those
-- partitions for staging-unaware callers. Counter rows are taken in name
-- order, as the merge takes them, so uploads, staged pushes and the merge
-- never deadlock.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.stage_count(p_queue text[], p_partition text[], p_n bigint[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO queen.staged_partitions AS sp (queue_name, partition_name, staged)
    SELECT x.qn, x.pn, sum(x.n) FROM unnest(p_queue, p_partition, p_n) AS x(qn, pn, n)
    GROUP BY x.qn, x.pn ORDER BY x.qn, x.pn
    ON CONFLICT (queue_name, partition_name) DO UPDATE SET staged = sp.staged + excluded.staged;
    INSERT INTO queen.spool_backlog (queue_name, partition_name, server_id, oldest_accept_us)
    SELECT DISTINCT x.qn, x.pn, '(staged)', 0 FROM unnest(p_queue, p_partition) AS x(qn, pn)
    ORDER BY 1, 2
    ON CONFLICT (queue_name, partition_name, server_id) DO NOTHING;
$$;

-------------------------------------------------------------------------------
-- push_ordered_v3: push_ordered_v2's direct push, staging instead of holding.
--
-- Same arguments as v2 without the replay ones (p_replay, p_next), plus
-- p_settle_ms (queen.db_settling). Items whose partition has staged rows or a
-- live peer's spool backlog are inserted into queen.staged (status 'staged',
-- message_id the minted id; dedup is the merge's); while the server settles,
-- every item is. The rest is v2 unchanged: dedup, positions in commit order
-- under the partition row locks (taken in id order), late = committed after a
-- push accepted later.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.push_ordered_v3(
    p_idx integer[], p_queue text[], p_partition text[], p_id uuid[],
    p_txid text[], p_trace uuid[], p_payload text[], p_encrypted boolean[],
    p_sub text[], p_accept bigint[], p_server text, p_wait_ms integer, p_settle_ms integer)
RETURNS TABLE (idx integer, message_id uuid, partition_id uuid, status text, late boolean,
               peer text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_wanted integer;
    v_locked integer;
    v_staged integer[];
    v_base   bigint;
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

    -- New statements from here on: each sees what committed while we waited
    -- for the locks (a merge that emptied a partition, an upload that filled it).
    IF queen.db_settling(p_settle_ms) THEN
        v_staged := p_idx;
    ELSIF EXISTS (SELECT 1 FROM queen.spool_backlog) THEN  -- the usual case: empty
        SELECT array_agg(y.i ORDER BY y.i) INTO v_staged
        FROM unnest(p_idx, p_queue, p_partition) AS y(i, qn, pn)
        WHERE EXISTS (SELECT 1 FROM queen.spool_backlog b
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
        WHERE x.i <> ALL(v_staged)
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
           NULL::text
    FROM ranked r
    UNION ALL
    SELECT s.i, x.mid, NULL::uuid, 'staged', false, NULL::text
    FROM unnest(v_staged) AS s(i)
    JOIN unnest(p_idx, p_id) AS x(i, mid) ON x.i = s.i
    ORDER BY 1;
END;
$$;

-------------------------------------------------------------------------------
-- merge_staged: move up to p_limit of the oldest staged rows into
-- queen.messages, in the cluster's accept order. One call is one batch and one
-- transaction; one merger at a time in the cluster (a transaction advisory
-- lock; a caller that does not get it merges nothing). Nothing is merged while
-- the server settles (db_settling). A staged row waits while a live spool's
-- backlog for its partition starts at or before it (those events are still on
-- a broker's disk). Returns one row per (queue, partition) touched: rows
-- merged, duplicates dropped (stored already, or an earlier accept of the same
-- transactionId), late (merged after a push accepted later: an order
-- exception), and whether the partition has staged rows left.
-------------------------------------------------------------------------------
CREATE FUNCTION queen.merge_staged(p_limit integer, p_server text, p_wait_ms integer,
                                   p_settle_ms integer)
RETURNS TABLE (queue_name text, partition_name text, partition_id uuid,
               merged bigint, duplicates bigint, late bigint)
LANGUAGE plpgsql
-- The batch's window functions sort tens of thousands of rows: in memory.
SET work_mem = '64MB'
AS $fn$
#variable_conflict use_column
DECLARE
    c_acc bigint; c_sid text; c_ms bigint; c_seq integer; c_rec bigint;  -- the batch's last key
    v_qn text[];
    v_pn text[];
    v_locked integer;
    v_backlog boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(737010) THEN
        RETURN;
    END IF;
    IF queen.db_settling(p_settle_ms) THEN
        RETURN;
    END IF;

    -- 1. The batch: the p_limit oldest staged rows no live spool holds back.
    --    Only its last key and its partitions are kept; step 3 takes the rows
    --    again under the locks.
    v_backlog := EXISTS (SELECT 1 FROM queen.spool_backlog b WHERE b.server_id <> '(staged)');
    WITH head AS (
        SELECT s.accept_us, s.spool_id, s.file_ms, s.file_seq, s.rec_no,
               s.queue_name, s.partition_name
        FROM queen.staged s
        WHERE NOT v_backlog
           OR NOT EXISTS (SELECT 1 FROM queen.spool_backlog b
                          WHERE b.queue_name = s.queue_name AND b.partition_name = s.partition_name
                            AND b.server_id <> '(staged)'
                            AND (b.oldest_accept_us, b.server_id) <= (s.accept_us, s.spool_id)
                            AND NOT queen.spool_server_dead(b.server_id, p_server, p_wait_ms))
        ORDER BY s.accept_us, s.spool_id, s.file_ms, s.file_seq, s.rec_no
        LIMIT p_limit),
    pairs AS (SELECT DISTINCT h.queue_name, h.partition_name FROM head h)
    SELECT l.accept_us, l.spool_id, l.file_ms, l.file_seq, l.rec_no,
           (SELECT array_agg(p.queue_name ORDER BY p.queue_name, p.partition_name) FROM pairs p),
           (SELECT array_agg(p.partition_name ORDER BY p.queue_name, p.partition_name) FROM pairs p)
    INTO c_acc, c_sid, c_ms, c_seq, c_rec, v_qn, v_pn
    FROM (SELECT * FROM head h ORDER BY h.accept_us DESC, h.spool_id DESC, h.file_ms DESC,
                                        h.file_seq DESC, h.rec_no DESC LIMIT 1) l;
    IF c_acc IS NULL THEN
        RETURN;
    END IF;

    -- 2. Lock the partition rows in id order, as every push does (creating
    --    missing queues and partitions first), then the counters in name order.
    SELECT count(*) INTO v_locked FROM (
        SELECT 1 FROM queen.partitions pt
        WHERE pt.id IN (SELECT p2.id FROM unnest(v_qn, v_pn) AS x(qn, pn)
                        JOIN queen.queues q ON q.name = x.qn
                        JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn)
        ORDER BY pt.id FOR NO KEY UPDATE) l;
    IF v_locked < cardinality(v_qn) THEN
        INSERT INTO queen.queues AS q (name, namespace, task)
        SELECT DISTINCT n, split_part(n, '.', 1), split_part(n, '.', 2)
        FROM unnest(v_qn) AS n ORDER BY 1
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO queen.partitions AS pt (queue_id, name)
        SELECT DISTINCT q.id, x.pn FROM unnest(v_qn, v_pn) AS x(qn, pn)
        JOIN queen.queues q ON q.name = x.qn
        ORDER BY 1, 2
        ON CONFLICT (queue_id, name) DO NOTHING;
        PERFORM 1 FROM queen.partitions pt
        WHERE pt.id IN (SELECT p2.id FROM unnest(v_qn, v_pn) AS x(qn, pn)
                        JOIN queen.queues q ON q.name = x.qn
                        JOIN queen.partitions p2 ON p2.queue_id = q.id AND p2.name = x.pn)
        ORDER BY pt.id FOR NO KEY UPDATE;
    END IF;
    PERFORM 1 FROM queen.staged_partitions sp
    WHERE (sp.queue_name, sp.partition_name) IN (SELECT * FROM unnest(v_qn, v_pn))
    ORDER BY sp.queue_name, sp.partition_name FOR UPDATE;

    -- 3. One statement, so one snapshot taken after the locks: take the
    --    batch's rows out of staging (holds read again: an upload committed
    --    meanwhile can only make more rows eligible), drop duplicates, number
    --    the rest per partition in accept order, insert, count down.
    v_backlog := EXISTS (SELECT 1 FROM queen.spool_backlog b WHERE b.server_id <> '(staged)');
    RETURN QUERY
    WITH parts AS (
        SELECT x.qn, x.pn, p.id AS pid, p.last_accept_us
        FROM unnest(v_qn, v_pn) AS x(qn, pn)
        JOIN queen.queues q ON q.name = x.qn
        JOIN queen.partitions p ON p.queue_id = q.id AND p.name = x.pn),
    gone AS (
        DELETE FROM queen.staged s
        USING parts pa
        WHERE (s.accept_us, s.spool_id, s.file_ms, s.file_seq, s.rec_no)
              <= (c_acc, c_sid, c_ms, c_seq, c_rec)
          AND s.queue_name = pa.qn AND s.partition_name = pa.pn
          AND (NOT v_backlog
               OR NOT EXISTS (SELECT 1 FROM queen.spool_backlog b
                              WHERE b.queue_name = s.queue_name
                                AND b.partition_name = s.partition_name
                                AND b.server_id <> '(staged)'
                                AND (b.oldest_accept_us, b.server_id) <= (s.accept_us, s.spool_id)
                                AND NOT queen.spool_server_dead(b.server_id, p_server, p_wait_ms)))
        RETURNING s.*, pa.pid, s.accept_us < pa.last_accept_us AS is_late),
    ranked AS (
        SELECT g.*,
               row_number() OVER (PARTITION BY g.pid, g.transaction_id
                                  ORDER BY g.accept_us, g.spool_id, g.file_ms, g.file_seq,
                                           g.rec_no) AS copy_no,
               EXISTS (SELECT 1 FROM queen.messages m
                       WHERE m.partition_id = g.pid
                         AND m.transaction_id = g.transaction_id) AS stored
        FROM gone g),
    fresh AS (
        SELECT r.*, row_number() OVER (PARTITION BY r.pid
                                       ORDER BY r.accept_us, r.spool_id, r.file_ms, r.file_seq,
                                                r.rec_no) AS rn
        FROM ranked r
        WHERE r.copy_no = 1 AND NOT r.stored),
    bumped AS (
        UPDATE queen.partitions pt
        SET last_seq = pt.last_seq + c.n, last_message_at = now(), last_activity = now(),
            last_accept_us = greatest(pt.last_accept_us, c.acc)
        FROM (SELECT f.pid, count(*) AS n, max(f.accept_us) AS acc FROM fresh f GROUP BY f.pid) c
        WHERE pt.id = c.pid
        RETURNING pt.id, pt.last_seq - c.n AS base),
    inserted AS (
        INSERT INTO queen.messages
            (id, partition_id, seq, transaction_id, trace_id, payload, is_encrypted, producer_sub)
        SELECT f.message_id, f.pid, b.base + f.rn, f.transaction_id, f.trace_id, f.payload,
               f.is_encrypted, f.producer_sub
        FROM fresh f JOIN bumped b ON b.id = f.pid),
    counted AS (
        UPDATE queen.staged_partitions sp
        SET staged = sp.staged - c.n
        FROM (SELECT g.queue_name, g.partition_name, count(*) AS n FROM gone g GROUP BY 1, 2) c
        WHERE sp.queue_name = c.queue_name AND sp.partition_name = c.partition_name)
    SELECT r.queue_name, r.partition_name, r.pid,
           count(*) FILTER (WHERE r.copy_no = 1 AND NOT r.stored),
           count(*) FILTER (WHERE r.copy_no > 1 OR r.stored),
           count(*) FILTER (WHERE r.copy_no = 1 AND NOT r.stored AND r.is_late)
    FROM ranked r
    GROUP BY r.queue_name, r.partition_name, r.pid;

    -- 4. Partitions left without staged rows are no longer held. (The counter
    --    rows are locked: a concurrent upload adding rows waits and re-creates.)
    DELETE FROM queen.spool_backlog b
    USING queen.staged_partitions sp
    WHERE sp.staged <= 0 AND (sp.queue_name, sp.partition_name) IN (SELECT * FROM unnest(v_qn, v_pn))
      AND b.queue_name = sp.queue_name AND b.partition_name = sp.partition_name
      AND b.server_id = '(staged)';
    DELETE FROM queen.staged_partitions sp
    USING unnest(v_qn, v_pn) AS x(qn, pn)
    WHERE sp.queue_name = x.qn AND sp.partition_name = x.pn AND sp.staged <= 0;
END;
$fn$;
