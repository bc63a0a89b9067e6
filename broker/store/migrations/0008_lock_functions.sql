-- Migration lock_functions: lock operations in one round trip.
--
-- An acquire, a renew and a release of POST /api/v1/locks were each about five
-- statements inside BEGIN ... COMMIT (lock the fence, read the clock, read the
-- permits, take a token, lock and write the row). Each is now one function,
-- called as one statement outside any explicit transaction: one round trip, its
-- own transaction. The rules are those of migration 0004 and unchanged:
--
-- * a permit of lock N is the queen.kv row 'queen-locks' / 'N#<slot>', its
--   version is its fencing token, its value {owner, token, since, renewedAt};
-- * every operation on a lock first locks its queen.lock_fences row
--   (queen.lock_fence_v1), so operations on one lock apply one at a time, and a
--   token is the fence's counter plus one: it only rises, across slots, expiry
--   and deletion, and every acquire and every renew gets a new one;
-- * a permit past expires_at is absent to every operation at once (the
--   retention job deletes the row later).
--
-- Each function answers rows of one shape: first a verdict row (outcome, and
-- the permit it is about when there is one), then, for a refused acquire or a
-- renew of a permit that is no longer there, one 'holder' row per live permit
-- in key order. Instants the permit's value carries (since, renewedAt) are text
-- as the broker writes them: UTC, milliseconds, a literal Z.

-- The live permits of lock p_name in key order: keys in [p_name#, p_name$)
-- (a lock name has no '#', so that range is exactly this lock's slots).
CREATE FUNCTION queen.lock_permits_v1(p_name text)
RETURNS TABLE (key text, slot integer, owner text, token bigint, since text,
               renewed_at text, expires_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT k.key, split_part(k.key, '#', 2)::integer, k.value ->> 'owner', k.version,
           k.value ->> 'since', k.value ->> 'renewedAt', k.expires_at
    FROM queen.kv k
    WHERE k.namespace = 'queen-locks' AND k.key >= p_name || '#' AND k.key < p_name || '$'
      AND (k.expires_at IS NULL OR k.expires_at > now())
    ORDER BY k.key
$$;

-- Write permit p_slot of lock p_name for p_owner with the next token, lasting
-- p_ttl_s from now(); p_since is the acquire's instant a renew keeps (NULL: now).
-- The caller holds the fence row already.
CREATE FUNCTION queen.lock_grant_v1(p_name text, p_slot integer, p_owner text, p_since text,
                                    p_ttl_s integer)
RETURNS TABLE (token bigint, expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_key text := p_name || '#' || p_slot;
    v_now text := to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');
    v_token bigint;
    v_live boolean;
BEGIN
    UPDATE queen.lock_fences f SET last_token = f.last_token + 1, updated_at = now()
    WHERE f.name = p_name RETURNING f.last_token INTO v_token;
    SELECT l.live INTO v_live FROM queen.kv_lock_v1('queen-locks', v_key) l;
    RETURN QUERY
        UPDATE queen.kv k
        SET value = jsonb_build_object('owner', p_owner, 'token', v_token,
                                       'since', coalesce(p_since, v_now), 'renewedAt', v_now),
            version = v_token, expires_at = now() + make_interval(secs => p_ttl_s),
            updated_at = now(),
            created_at = CASE WHEN v_live THEN k.created_at ELSE now() END
        WHERE k.namespace = 'queen-locks' AND k.key = v_key
        RETURNING k.version, k.expires_at;
END;
$$;

-- Acquire a permit of p_name (a lock when p_limit = 1, else a semaphore of
-- p_limit) for p_owner. Verdicts: 'already' (p_owner holds a permit: that one,
-- unchanged; a retried acquire whose answer was lost), 'acquired' (the lowest
-- free slot, a new token), 'held' / 'contended' (no free slot, for a lock / a
-- semaphore; followed by the holders).
CREATE FUNCTION queen.lock_acquire_v1(p_name text, p_owner text, p_ttl_s integer,
                                      p_limit integer)
RETURNS TABLE (outcome text, slot integer, owner text, token bigint, since text,
               renewed_at text, expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_held integer;
    v_slot integer;
BEGIN
    PERFORM queen.lock_fence_v1(p_name);
    RETURN QUERY
        SELECT 'already'::text, p.slot, p.owner, p.token, p.since, p.renewed_at, p.expires_at
        FROM queen.lock_permits_v1(p_name) p WHERE p.owner = p_owner ORDER BY p.key LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_held FROM queen.lock_permits_v1(p_name);
    IF v_held >= p_limit THEN
        RETURN QUERY SELECT CASE WHEN p_limit = 1 THEN 'held' ELSE 'contended' END::text,
                            NULL::integer, NULL::text, NULL::bigint, NULL::text, NULL::text,
                            NULL::timestamptz;
        RETURN QUERY
            SELECT 'holder'::text, p.slot, p.owner, p.token, p.since, p.renewed_at, p.expires_at
            FROM queen.lock_permits_v1(p_name) p ORDER BY p.key;
        RETURN;
    END IF;
    SELECT min(s) INTO v_slot FROM generate_series(0, p_limit - 1) s
    WHERE s NOT IN (SELECT p.slot FROM queen.lock_permits_v1(p_name) p);
    RETURN QUERY
        SELECT 'acquired'::text, v_slot, p_owner, g.token, NULL::text, NULL::text, g.expires_at
        FROM queen.lock_grant_v1(p_name, v_slot, p_owner, NULL, p_ttl_s) g;
END;
$$;

-- Renew the permit of p_name whose token is p_token (or, when p_owner is
-- given, the permit p_owner holds: a renew retried after a lost answer), in
-- slot p_slot when given: 'renewed' with a new token and the acquire's since
-- kept, or 'lost' (no such live permit; followed by the holders).
CREATE FUNCTION queen.lock_renew_v1(p_name text, p_token bigint, p_slot integer,
                                    p_owner text, p_ttl_s integer)
RETURNS TABLE (outcome text, slot integer, owner text, token bigint, since text,
               renewed_at text, expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v record;
BEGIN
    PERFORM queen.lock_fence_v1(p_name);
    SELECT p.* INTO v FROM queen.lock_permits_v1(p_name) p
    WHERE (p_slot IS NULL OR p.slot = p_slot)
      AND (p.token = p_token OR (p_owner IS NOT NULL AND p.owner = p_owner))
    ORDER BY p.key LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::integer, NULL::text, NULL::bigint, NULL::text,
                            NULL::text, NULL::timestamptz;
        RETURN QUERY
            SELECT 'holder'::text, p.slot, p.owner, p.token, p.since, p.renewed_at, p.expires_at
            FROM queen.lock_permits_v1(p_name) p ORDER BY p.key;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT 'renewed'::text, v.slot, v.owner, g.token, NULL::text, NULL::text, g.expires_at
        FROM queen.lock_grant_v1(p_name, v.slot, v.owner, v.since, p_ttl_s) g;
END;
$$;

-- Release the permit of p_name whose token is p_token (in slot p_slot when
-- given): 'released' (the row is made dead, as a KV delete does: absent to every
-- reader, version + 1 so a token is never a live version again) or 'lost'.
CREATE FUNCTION queen.lock_release_v1(p_name text, p_token bigint, p_slot integer)
RETURNS TABLE (outcome text, slot integer, owner text, token bigint, since text,
               renewed_at text, expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v record;
BEGIN
    PERFORM queen.lock_fence_v1(p_name);
    SELECT p.* INTO v FROM queen.lock_permits_v1(p_name) p
    WHERE (p_slot IS NULL OR p.slot = p_slot) AND p.token = p_token
    ORDER BY p.key LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::integer, NULL::text, NULL::bigint, NULL::text,
                            NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    PERFORM 1 FROM queen.kv_lock_v1('queen-locks', v.key);
    UPDATE queen.kv k
    SET value = 'null'::jsonb, version = k.version + 1, expires_at = '-infinity',
        updated_at = now()
    WHERE k.namespace = 'queen-locks' AND k.key = v.key;
    RETURN QUERY SELECT 'released'::text, v.slot, v.owner, v.token, NULL::text, NULL::text,
                        NULL::timestamptz;
END;
$$;
