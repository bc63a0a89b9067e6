-- Migration 0004: state next to the messages (offset reads, key/value, lock
-- fences, timers).
--
-- * queen.fetch_v1: reads a partition by offset for POST /api/v1/fetch
--   (offset o is the message at seq o + 1; no lease, no cursor).
-- * queen.kv: the key/value rows of POST /api/v1/kv. A row past expires_at is
--   dead: every read and every precondition treats it as absent (the
--   predicate is the truth, not the row's presence); the retention job deletes
--   dead rows later.
-- * queen.lock_fences: one row per lock name, the last fencing token handed
--   out. The permits themselves are queen.kv rows in namespace 'queen-locks';
--   this row outlives their expiry and deletion, so a token only ever rises.
-- * queen.timers: pending timers of POST /api/v1/timers; a delivered timer has
--   no row (there is no tombstone).

-- ----------------------------------------------------------------------
-- Offset reads
-- ----------------------------------------------------------------------

-- Entries in the order given; per entry one header row (seq NULL) carrying the
-- partition's id, last_seq and first kept seq, then its records. An offset
-- below the oldest kept record or past last_seq reads nothing (the caller
-- answers OFFSET_OUT_OF_RANGE). Budgets count payload bytes (the stored JSON
-- text): an entry's records stay within its own budget and the call's, except
-- that an entry's first record is taken when nothing of the call was taken
-- yet, or when it fits the call's budget, so a record larger than a budget is
-- still readable (alone).
CREATE FUNCTION queen.fetch_v1(p_queues text[], p_partitions text[], p_offsets bigint[],
                               p_budgets bigint[], p_call_budget bigint, p_max_records integer)
RETURNS TABLE (idx integer, partition_id uuid, last_seq bigint, first_seq bigint,
               seq bigint, transaction_id text, payload jsonb, is_encrypted boolean,
               created_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    i integer;
    pid uuid;
    v_last bigint;
    v_first bigint;
    used_call bigint := 0;
    used_entry bigint;
    taken integer;
    size bigint;
    m record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_queues, 1), 0) LOOP
        SELECT pt.id, pt.last_seq INTO pid, v_last
        FROM queen.queues q JOIN queen.partitions pt ON pt.queue_id = q.id
        WHERE q.name = p_queues[i] AND pt.name = p_partitions[i];
        IF pid IS NULL THEN
            RETURN QUERY SELECT i - 1, NULL::uuid, 0::bigint, NULL::bigint, NULL::bigint,
                                NULL::text, NULL::jsonb, NULL::boolean, NULL::timestamptz;
            CONTINUE;
        END IF;
        SELECT min(mm.seq) INTO v_first FROM queen.messages mm WHERE mm.partition_id = pid;
        RETURN QUERY SELECT i - 1, pid, v_last, v_first, NULL::bigint, NULL::text,
                            NULL::jsonb, NULL::boolean, NULL::timestamptz;
        IF p_offsets[i] < coalesce(v_first - 1, v_last) OR p_offsets[i] > v_last THEN
            CONTINUE;
        END IF;
        used_entry := 0;
        taken := 0;
        FOR m IN SELECT mm.seq, mm.transaction_id, mm.payload, mm.is_encrypted, mm.created_at,
                        octet_length(mm.payload::text)::bigint AS size
                 FROM queen.messages mm
                 WHERE mm.partition_id = pid AND mm.seq > p_offsets[i]
                 ORDER BY mm.seq LIMIT p_max_records LOOP
            size := m.size;
            IF taken = 0 THEN
                EXIT WHEN used_call > 0 AND used_call + size > p_call_budget;
            ELSE
                EXIT WHEN used_entry + size > p_budgets[i] OR used_call + size > p_call_budget;
            END IF;
            used_entry := used_entry + size;
            used_call := used_call + size;
            taken := taken + 1;
            RETURN QUERY SELECT i - 1, pid, v_last, v_first, m.seq, m.transaction_id, m.payload,
                                m.is_encrypted, m.created_at;
        END LOOP;
    END LOOP;
END;
$$;

-- ----------------------------------------------------------------------
-- Key/value
-- ----------------------------------------------------------------------

-- Keys compare byte-wise (COLLATE "C"): a prefix is then one contiguous range
-- of the primary key, whatever the database's collation.
CREATE TABLE queen.kv (
    namespace  text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      jsonb NOT NULL,
    -- 1 when the key is created; +1 on every write while the row exists (a
    -- write over a dead row goes on from its version)
    version    bigint NOT NULL,
    expires_at timestamptz,            -- NULL: forever
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, key)
);
CREATE INDEX kv_expires_idx ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;

-- ----------------------------------------------------------------------
-- Lock fences
-- ----------------------------------------------------------------------

CREATE TABLE queen.lock_fences (
    name       text COLLATE "C" PRIMARY KEY,
    last_token bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- ----------------------------------------------------------------------
-- Timers
-- ----------------------------------------------------------------------

CREATE TABLE queen.timers (
    queue_name     text COLLATE "C" NOT NULL,
    timer_key      text COLLATE "C" NOT NULL,
    partition_name text NOT NULL DEFAULT 'Default',
    payload        jsonb NOT NULL,          -- as the message will carry it (encrypted if the queue is)
    is_encrypted   boolean NOT NULL DEFAULT false,
    txn            text NOT NULL,           -- the delivered message's transactionId (dedup)
    message_id     uuid NOT NULL,           -- promised at schedule time
    producer_sub   text,
    deliver_at     timestamptz NOT NULL,    -- not before
    attempts       integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_name, timer_key)
);
CREATE INDEX timers_due_idx ON queen.timers (deliver_at);

-- The row of (namespace, key), locked FOR UPDATE for a write. A key with no row
-- gets a dead placeholder first (version 0, expires_at -infinity), so a write
-- always has a row to lock and two concurrent writers of a new key serialise on
-- it; a placeholder left by a write that did not apply is dead (absent to every
-- reader) and the retention job deletes it.
CREATE FUNCTION queen.kv_lock_v1(p_ns text, p_key text)
RETURNS TABLE (value jsonb, version bigint, expires_at timestamptz, updated_at timestamptz,
               live boolean)
LANGUAGE plpgsql AS $$
BEGIN
    -- Twice at most: the retention job may delete a dead row between the insert
    -- (which found it) and the lock (which then finds nothing).
    FOR attempt IN 1 .. 3 LOOP
        INSERT INTO queen.kv AS k (namespace, key, value, version, expires_at)
        VALUES (p_ns, p_key, 'null'::jsonb, 0, '-infinity')
        ON CONFLICT (namespace, key) DO NOTHING;
        RETURN QUERY
            SELECT k.value, k.version, k.expires_at, k.updated_at,
                   (k.expires_at IS NULL OR k.expires_at > now())
            FROM queen.kv k WHERE k.namespace = p_ns AND k.key = p_key
            FOR UPDATE;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'kv row % / % vanished three times', p_ns, p_key
        USING ERRCODE = '40001';
END;
$$;

-- The fence row of a lock, locked FOR UPDATE: every operation on one lock takes
-- it first, so they apply one at a time and tokens are handed out in commit
-- order. Fence rows are never deleted.
CREATE FUNCTION queen.lock_fence_v1(p_name text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_token bigint;
BEGIN
    INSERT INTO queen.lock_fences AS f (name, last_token) VALUES (p_name, 0)
    ON CONFLICT (name) DO NOTHING;
    SELECT f.last_token INTO v_token FROM queen.lock_fences f WHERE f.name = p_name FOR UPDATE;
    RETURN v_token;
END;
$$;

-- Schedule (or reschedule: the same upsert) timer (p_queue, p_key). A row that
-- is locked and due is being delivered by a sweeper (which claims due rows FOR
-- UPDATE SKIP LOCKED and deletes them in the same transaction as the push):
-- 'too_late'. A row locked and not due is another schedule or cancel in flight:
-- wait for it, then look again. Returns 'scheduled' (no pending timer had the
-- key), 'rescheduled' (one had: replaced, attempts back to 0) or 'too_late'.
-- The message id is kept when the txn is the same (a retried schedule).
CREATE FUNCTION queen.timer_schedule_v1(p_queue text, p_key text, p_partition text,
                                        p_payload jsonb, p_encrypted boolean, p_txn text,
                                        p_message_id uuid, p_producer_sub text,
                                        p_delay_ms bigint)
RETURNS TABLE (status text, message_id uuid, deliver_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_due timestamptz;
    v_at timestamptz := now() + make_interval(secs => p_delay_ms / 1000.0);
BEGIN
    FOR attempt IN 1 .. 3 LOOP
        PERFORM 1 FROM queen.timers t
        WHERE t.queue_name = p_queue AND t.timer_key = p_key FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            RETURN QUERY
                UPDATE queen.timers t
                SET partition_name = p_partition, payload = p_payload,
                    is_encrypted = p_encrypted,
                    message_id = CASE WHEN t.txn = p_txn THEN t.message_id ELSE p_message_id END,
                    txn = p_txn, producer_sub = p_producer_sub, deliver_at = v_at,
                    attempts = 0, updated_at = now()
                WHERE t.queue_name = p_queue AND t.timer_key = p_key
                RETURNING 'rescheduled'::text, t.message_id, t.deliver_at;
            RETURN;
        END IF;
        SELECT t.deliver_at INTO v_due FROM queen.timers t
        WHERE t.queue_name = p_queue AND t.timer_key = p_key;
        IF FOUND THEN
            IF v_due <= clock_timestamp() THEN
                RETURN QUERY SELECT 'too_late'::text, NULL::uuid, NULL::timestamptz;
                RETURN;
            END IF;
            PERFORM 1 FROM queen.timers t
            WHERE t.queue_name = p_queue AND t.timer_key = p_key FOR UPDATE;
            CONTINUE;
        END IF;
        RETURN QUERY
            INSERT INTO queen.timers AS t (queue_name, timer_key, partition_name, payload,
                                           is_encrypted, txn, message_id, producer_sub,
                                           deliver_at)
            VALUES (p_queue, p_key, p_partition, p_payload, p_encrypted, p_txn, p_message_id,
                    p_producer_sub, v_at)
            ON CONFLICT (queue_name, timer_key) DO NOTHING
            RETURNING 'scheduled'::text, t.message_id, t.deliver_at;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'timer % / % kept changing under the schedule', p_queue, p_key
        USING ERRCODE = '40001';
END;
$$;

-- Cancel timer (p_queue, p_key): 'cancelled' (with the timer's txn), 'absent'
-- (no pending timer: never scheduled, cancelled, or ALREADY DELIVERED) or
-- 'too_late' (a sweeper is delivering it), by the same rules as the schedule.
CREATE FUNCTION queen.timer_cancel_v1(p_queue text, p_key text)
RETURNS TABLE (status text, txn text)
LANGUAGE plpgsql AS $$
DECLARE
    v_due timestamptz;
BEGIN
    FOR attempt IN 1 .. 3 LOOP
        RETURN QUERY
            DELETE FROM queen.timers t
            WHERE (t.queue_name, t.timer_key) IN (
                SELECT x.queue_name, x.timer_key FROM queen.timers x
                WHERE x.queue_name = p_queue AND x.timer_key = p_key
                FOR UPDATE SKIP LOCKED)
            RETURNING 'cancelled'::text, t.txn;
        IF FOUND THEN
            RETURN;
        END IF;
        SELECT t.deliver_at INTO v_due FROM queen.timers t
        WHERE t.queue_name = p_queue AND t.timer_key = p_key;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'absent'::text, NULL::text;
            RETURN;
        END IF;
        IF v_due <= clock_timestamp() THEN
            RETURN QUERY SELECT 'too_late'::text, NULL::text;
            RETURN;
        END IF;
        PERFORM 1 FROM queen.timers t
        WHERE t.queue_name = p_queue AND t.timer_key = p_key FOR UPDATE;
    END LOOP;
    RAISE EXCEPTION 'timer % / % kept changing under the cancel', p_queue, p_key
        USING ERRCODE = '40001';
END;
$$;
