"""The SQL of drain_sql.py's prototype drain (schema ``drain_proto``: staging table, ledger,
the plpgsql merge) and the statements it calls, beside today's ``queen.push_ordered_v2`` and
``queen.spool_register``.  Imported by drain_sql.py only; nothing of it is a migration.
"""
from __future__ import annotations

PROTO_DDL = """
CREATE SCHEMA drain_proto;

-- One row per spooled event uploaded and not merged yet. The key is the cluster's accept
-- order (accept time, then spool id: the tie-break push_ordered uses) followed by the event's
-- place in its spool (file name, record index), which makes it unique and lets the merge read
-- the oldest rows with one index range scan. Every column comes from the spool file, so a
-- second upload of the same file produces the same keys.
CREATE TABLE drain_proto.staged (
    accept_us      bigint  NOT NULL,   -- the accepting broker's clock, microseconds
    spool_id       text    NOT NULL,   -- the spool directory's durable identity
    file_ms        bigint  NOT NULL,   -- spool file name queen-<file_ms>-<file_seq>.buf
    file_seq       integer NOT NULL,
    rec_no         integer NOT NULL,   -- record index inside that file
    queue_name     text    NOT NULL,
    partition_name text    NOT NULL,
    message_id     uuid    NOT NULL,   -- UUIDv7 minted at upload
    transaction_id text    NOT NULL,
    trace_id       uuid,
    payload        jsonb   NOT NULL,   -- parsed at upload (on the uploading broker's time)
    is_encrypted   boolean NOT NULL,   -- the envelope was sealed before upload
    producer_sub   text,
    PRIMARY KEY (accept_us, spool_id, file_ms, file_seq, rec_no)
);

-- Partitions with staged rows and how many: what a direct push checks (one probe) to know it
-- must go through the staging table, and what the merge decrements.
CREATE TABLE drain_proto.staged_partitions (
    queue_name     text   NOT NULL,
    partition_name text   NOT NULL,
    staged         bigint NOT NULL,
    PRIMARY KEY (queue_name, partition_name)
);

-- Spool files whose upload committed. The upload inserts its file here first, in the same
-- transaction as the COPY: a broker that died after the commit but before deleting the file
-- finds it here and only deletes the file (and a concurrent second upload waits, then skips).
CREATE TABLE drain_proto.uploaded_files (
    spool_id    text        NOT NULL,
    file_ms     bigint      NOT NULL,
    file_seq    integer     NOT NULL,
    events      integer     NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (spool_id, file_ms, file_seq)
);
"""

# A staged row may be merged unless a live spool still holds, on its disk, an event for the
# same partition accepted earlier (its queen.spool_backlog row, oldest_accept_us): merging it
# would put an event still on some broker's disk behind later ones. Written as a scalar
# subquery behind "NOT v_backlog OR": one probe of spool_backlog's primary key per row looked
# at, and only while spool_backlog has rows at all; as a NOT EXISTS the planner turned it
# into an anti join, which read and sorted the whole staging table on every batch.
_NOT_HELD = """
        (NOT v_backlog
         OR (SELECT b.server_id FROM queen.spool_backlog b
             WHERE b.queue_name = s.queue_name AND b.partition_name = s.partition_name
               AND (b.oldest_accept_us, b.server_id) <= (s.accept_us, s.spool_id)
               AND NOT queen.spool_server_dead(b.server_id, p_server, p_wait_ms)
             LIMIT 1) IS NULL)"""

PROTO_MERGE = f"""
CREATE FUNCTION drain_proto.merge_batch(p_limit integer, p_server text, p_wait_ms integer)
RETURNS TABLE (queue_name text, partition_name text, partition_id uuid,
               merged bigint, duplicates bigint, late bigint)
LANGUAGE plpgsql
-- The batch's window functions sort tens of thousands of rows: in memory, not on disk.
SET work_mem = '64MB'
AS $fn$
#variable_conflict use_column
DECLARE
    c_acc bigint; c_sid text; c_ms bigint; c_seq integer; c_rec integer;  -- the batch's last key
    v_qn text[];          -- the batch's (queue, partition) pairs
    v_pn text[];
    v_locked integer;
    v_backlog boolean;    -- some spool still holds events on its disk (rare after an outage)
BEGIN
    -- One merger at a time in the cluster; a broker that does not get it skips this round.
    IF NOT pg_try_advisory_xact_lock(737010) THEN
        RETURN;
    END IF;

    -- 1. The batch: the p_limit oldest staged rows no live spool holds back. Only its last
    --    key and its partitions are kept; statement 3 takes the rows again under the locks.
    v_backlog := EXISTS (SELECT 1 FROM queen.spool_backlog);
    WITH head AS (
        SELECT s.accept_us, s.spool_id, s.file_ms, s.file_seq, s.rec_no,
               s.queue_name, s.partition_name
        FROM drain_proto.staged s
        WHERE {_NOT_HELD}
        ORDER BY s.accept_us, s.spool_id, s.file_ms, s.file_seq, s.rec_no
        LIMIT p_limit),
    pairs AS (SELECT DISTINCT h.queue_name, h.partition_name FROM head h)
    SELECT l.accept_us, l.spool_id, l.file_ms, l.file_seq, l.rec_no,
           (SELECT array_agg(p.queue_name ORDER BY p.queue_name, p.partition_name) FROM pairs p),
           (SELECT array_agg(p.partition_name ORDER BY p.queue_name, p.partition_name) FROM pairs p)
    INTO c_acc, c_sid, c_ms, c_seq, c_rec, v_qn, v_pn
    FROM (SELECT * FROM head ORDER BY accept_us DESC, spool_id DESC, file_ms DESC,
                                      file_seq DESC, rec_no DESC LIMIT 1) l;
    IF c_acc IS NULL THEN
        RETURN;
    END IF;

    -- 2. Lock the batch's partition rows in id order, as push_ordered_v2 does (so merges and
    --    direct pushes never deadlock); create queues and partitions first when missing.
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
    -- The counters too, in (queue, partition) order as every upload takes them.
    PERFORM 1 FROM drain_proto.staged_partitions sp
    WHERE (sp.queue_name, sp.partition_name) IN (SELECT * FROM unnest(v_qn, v_pn))
    ORDER BY sp.queue_name, sp.partition_name FOR UPDATE;

    -- 3. One statement, a new snapshot taken after the locks: it sees every push committed
    --    while we waited. Take the batch's rows out of staging (the holds are read again:
    --    an upload that committed meanwhile can only make more rows eligible, never put
    --    older ones behind merged ones), drop duplicates (stored already, or an earlier accept of the
    --    same transactionId in this batch; earlier batches are stored already), hand out
    --    positions per partition in accept order, insert, and decrement the counters.
    v_backlog := EXISTS (SELECT 1 FROM queen.spool_backlog);
    RETURN QUERY
    WITH parts AS (
        SELECT x.qn, x.pn, p.id AS pid, p.last_accept_us
        FROM unnest(v_qn, v_pn) AS x(qn, pn)
        JOIN queen.queues q ON q.name = x.qn
        JOIN queen.partitions p ON p.queue_id = q.id AND p.name = x.pn),
    gone AS (
        DELETE FROM drain_proto.staged s
        USING parts pa
        WHERE (s.accept_us, s.spool_id, s.file_ms, s.file_seq, s.rec_no)
              <= (c_acc, c_sid, c_ms, c_seq, c_rec)
          AND s.queue_name = pa.qn AND s.partition_name = pa.pn
          AND {_NOT_HELD}
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
        UPDATE drain_proto.staged_partitions sp
        SET staged = sp.staged - c.n
        FROM (SELECT g.queue_name, g.partition_name, count(*) AS n FROM gone g GROUP BY 1, 2) c
        WHERE sp.queue_name = c.queue_name AND sp.partition_name = c.partition_name)
    SELECT r.queue_name, r.partition_name, r.pid,
           count(*) FILTER (WHERE r.copy_no = 1 AND NOT r.stored),
           count(*) FILTER (WHERE r.copy_no > 1 OR r.stored),
           count(*) FILTER (WHERE r.copy_no = 1 AND NOT r.stored AND r.is_late)
    FROM ranked r
    GROUP BY r.queue_name, r.partition_name, r.pid;

    -- 4. Partitions left without staged rows: direct pushes to them go straight in again.
    --    (Re-checked after any lock wait: an upload that added rows meanwhile keeps its row.)
    DELETE FROM drain_proto.staged_partitions sp
    USING unnest(v_qn, v_pn) AS x(qn, pn)
    WHERE sp.queue_name = x.qn AND sp.partition_name = x.pn AND sp.staged <= 0;
END;
$fn$;
"""

MERGE_CALL = "SELECT * FROM drain_proto.merge_batch($1, $2, $3)"

STAGED_COLUMNS = ("accept_us", "spool_id", "file_ms", "file_seq", "rec_no", "queue_name",
                  "partition_name", "message_id", "transaction_id", "trace_id", "payload",
                  "is_encrypted", "producer_sub")

LEDGER_INSERT = """
INSERT INTO drain_proto.uploaded_files (spool_id, file_ms, file_seq, events)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING true"""

# In (queue, partition) order, like the merge: uploads running side by side deadlocked on
# these rows when each locked them in its own order.
COUNT_STAGED = """
INSERT INTO drain_proto.staged_partitions AS sp (queue_name, partition_name, staged)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) ORDER BY 1, 2
ON CONFLICT (queue_name, partition_name) DO UPDATE SET staged = sp.staged + excluded.staged"""

SPOOL_REGISTER = "SELECT queen.spool_register($1, $2, $3, $4, $5)"

PUSH_CALL = ("SELECT idx, message_id, partition_id, status, late, peer FROM "
             "queen.push_ordered_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)")
