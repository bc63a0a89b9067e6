"""SQL of the operator views of the state surfaces: key/value namespaces and keys, held
locks, pending timers. Read-only; every figure is exact at the moment of the call (a
count over queen.kv or queen.timers, no snapshot table).

Row states of queen.kv as these figures name them (migration 0004):

* live: ``expires_at`` NULL or in the future (what every KV read returns);
* expired: past a real expiry, still stored until the retention job deletes it;
* deleted: a delete's tombstone (``expires_at = '-infinity'``), also awaiting the sweep;
* a write's placeholder (version 0, never written) is none of these and never counted."""

KV_NAMESPACES = """
SELECT k.namespace,
       count(*) FILTER (WHERE k.expires_at IS DISTINCT FROM '-infinity') AS keys,
       count(*) FILTER (WHERE k.expires_at IS NULL OR k.expires_at > now()) AS live_keys,
       count(*) FILTER (WHERE k.expires_at > now()) AS with_ttl,
       count(*) FILTER (WHERE k.expires_at <= now() AND k.expires_at <> '-infinity')
           AS expired,
       count(*) FILTER (WHERE k.expires_at = '-infinity') AS deleted,
       coalesce(sum(octet_length(k.value::text))
                FILTER (WHERE k.expires_at IS NULL OR k.expires_at > now()), 0)::bigint
           AS bytes
FROM queen.kv k
WHERE k.version > 0
GROUP BY k.namespace
ORDER BY k.namespace
"""
"""Per namespace with at least one row: ``keys`` (live + expired, the rows a listing
with includeExpired shows), ``live_keys``, ``with_ttl`` (live keys that will expire),
``expired`` and ``deleted`` (awaiting the sweep), ``bytes`` (JSON text of the live
values). Namespaces are in byte order (the column is COLLATE "C")."""

KV_LIST = """
SELECT k.key, CASE WHEN $5 THEN NULL ELSE k.value END AS value, k.version, k.expires_at,
       k.created_at, k.updated_at, NOT (k.expires_at IS NULL OR k.expires_at > now()) AS expired,
       octet_length(k.value::text)::bigint AS size
FROM queen.kv k
WHERE k.namespace = $1 AND k.version > 0 AND k.expires_at IS DISTINCT FROM '-infinity'
  AND k.key >= $2 AND starts_with(k.key, $2) AND ($3::text IS NULL OR k.key > $3)
  AND ($4 OR k.expires_at IS NULL OR k.expires_at > now())
ORDER BY k.key
LIMIT $6
"""
"""A keyset page of namespace $1: keys starting with $2 after $3, in byte order,
live only unless $4 (then also expired, each row saying so, against the database's
clock); values left out with $5; at most $6 rows. Tombstones are never listed.
``k.key >= $2`` is implied by the prefix and lets the primary key's range start there."""

LOCKS_PAGE = """
SELECT l.name, f.last_token, p.slot, p.owner, p.token, p.since, p.renewed_at, p.expires_at
FROM (SELECT DISTINCT split_part(k.key, '#', 1) AS name
      FROM queen.kv k
      WHERE k.namespace = 'queen-locks' AND (k.expires_at IS NULL OR k.expires_at > now())
        AND starts_with(k.key, $1) AND ($2::text IS NULL OR split_part(k.key, '#', 1) > $2)
      ORDER BY 1
      LIMIT $3) l
JOIN queen.lock_fences f ON f.name = l.name
CROSS JOIN LATERAL queen.lock_permits_v1(l.name) p
ORDER BY l.name, p.key
"""
"""Held locks (at least one live permit) whose name starts with $1, after name $2, at
most $3 locks; one row per live permit, with the fence's last token (the highest
token the lock ever handed out)."""

LOCKS_SUMMARY = """
SELECT count(DISTINCT split_part(k.key, '#', 1)) AS locks, count(*) AS permits
FROM queen.kv k
WHERE k.namespace = 'queen-locks' AND (k.expires_at IS NULL OR k.expires_at > now())
"""
"""Locks held and live permits, cluster-wide."""

TIMERS_BY_QUEUE = """
SELECT t.queue_name AS queue, count(*) AS pending,
       count(*) FILTER (WHERE t.deliver_at <= now()) AS overdue,
       min(t.deliver_at) AS next_due_at, max(t.attempts) AS max_attempts
FROM queen.timers t
GROUP BY t.queue_name
ORDER BY t.queue_name
"""
"""Pending timers per queue: how many, how many are due and not delivered yet
(``overdue``: a sweep has not taken them; normally for less than one sweep), the
earliest due time, and the most delivery attempts of any."""

DB_NOW = "SELECT now()"
"""The database's clock: overdue and expired are reckoned against it, never a browser's."""
