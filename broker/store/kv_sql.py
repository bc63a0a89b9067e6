"""SQL of the key/value surface (queen.kv). A row is live while ``expires_at`` is NULL
or in the future; every statement here that reads applies that predicate, so a dead
row is absent before the retention job deletes it. Keys compare byte-wise (the column
is ``COLLATE "C"``), so a prefix is one contiguous range of the primary key."""

LIVE = "(k.expires_at IS NULL OR k.expires_at > now())"

NOW = "SELECT now()"
"""The transaction's time: every expiry of one batch is reckoned from it."""

GET = f"""
SELECT k.key, k.value, k.version, k.expires_at, k.updated_at
FROM queen.kv k WHERE k.namespace = $1 AND k.key = $2 AND {LIVE}
"""
"""One live row."""

GET_MANY = f"""
SELECT k.key, k.value, k.version, k.expires_at, k.updated_at,
       octet_length(k.value::text) AS size
FROM queen.kv k WHERE k.namespace = $1 AND k.key = ANY($2::text[]) AND {LIVE}
"""
"""The live rows among keys $2."""

GET_PREFIX = f"""
SELECT k.key, CASE WHEN $5 THEN NULL ELSE k.value END AS value, k.version, k.expires_at,
       k.updated_at
FROM queen.kv k
WHERE k.namespace = $1 AND k.key >= $2 AND ($3::text IS NULL OR k.key < $3)
  AND ($4::text IS NULL OR k.key > $4) AND {LIVE}
ORDER BY k.key
LIMIT $6
"""
"""Live rows of keys in [$2, $3) after $4, in key order; values left out with $5."""

CHECK = f"""
SELECT k.value, k.version, {LIVE} AS live
FROM queen.kv k WHERE k.namespace = $1 AND k.key = $2
FOR SHARE
"""
"""A row read under a share lock: a check holds until the transaction ends (a write
of the row by someone else waits for it)."""

LOCK = "SELECT * FROM queen.kv_lock_v1($1, $2)"
"""The row of a key, locked for a write (a dead placeholder when there was none)."""

WRITE = """
UPDATE queen.kv k
SET value = coalesce($3::jsonb, 'null'::jsonb), version = k.version + 1, expires_at = $4, updated_at = now(),
    created_at = CASE WHEN $5 THEN k.created_at ELSE now() END
WHERE k.namespace = $1 AND k.key = $2
RETURNING k.version, k.expires_at, k.updated_at
"""
"""Write a locked row: value $3 (SQL NULL is how asyncpg sends JSON null: stored as
``null``), expiry $4; $5 says whether the row was live (a write
over a dead row starts a new life, and keeps counting versions)."""

WRITE_VERSION = """
UPDATE queen.kv k
SET value = coalesce($3::jsonb, 'null'::jsonb), version = $6, expires_at = $4, updated_at = now(),
    created_at = CASE WHEN $5 THEN k.created_at ELSE now() END
WHERE k.namespace = $1 AND k.key = $2
RETURNING k.version, k.expires_at, k.updated_at
"""
"""As WRITE with the version given ($6): lock permits, whose version is the fencing token."""

KILL = """
UPDATE queen.kv k
SET value = 'null'::jsonb, version = k.version + 1, expires_at = '-infinity', updated_at = now()
WHERE k.namespace = $1 AND k.key = $2
"""
"""Delete a locked row: it is made dead (absent to every reader) and keeps its version,
so a version is never reused while the row exists; the retention job deletes it."""
