"""SQL of the locks surface. A permit is a queen.kv row in namespace ``queen-locks``
keyed ``<name>#<slot>`` whose version is its fencing token; the lock's
queen.lock_fences row holds the last token handed out."""

FENCE = "SELECT queen.lock_fence_v1($1)"
"""Lock the fence row of lock $1 (created at 0 when new); its last token."""

NEXT_TOKEN = """
UPDATE queen.lock_fences SET last_token = last_token + 1, updated_at = now()
WHERE name = $1 RETURNING last_token
"""
"""The next token of lock $1 (its fence row is locked by FENCE already)."""

PERMITS = """
SELECT k.key, k.value, k.version, k.expires_at, k.updated_at
FROM queen.kv k
WHERE k.namespace = 'queen-locks' AND k.key >= $1 AND k.key < $2
  AND (k.expires_at IS NULL OR k.expires_at > now())
ORDER BY k.key
"""
"""The live permits of a lock: keys in [``<name>#``, ``<name>$``) (a name has no '#')."""
