"""SQL of the locks surface. A permit is a queen.kv row in namespace ``queen-locks``
keyed ``<name>#<slot>`` whose version is its fencing token; the lock's
queen.lock_fences row holds the last token handed out. Acquire, renew and release
are each one function of the lock_functions migration (one statement: one round trip, its own
transaction); each answers a verdict row, then for some verdicts the holders."""

ACQUIRE = "SELECT * FROM queen.lock_acquire_v1($1, $2, $3, $4)"
"""Acquire a permit of lock $1 for owner $2 lasting $3 s, of $4 permits:
already | acquired | held | contended (+ holders)."""

RENEW = "SELECT * FROM queen.lock_renew_v1($1, $2, $3, $4, $5)"
"""Renew the permit of lock $1 with token $2 (slot $3 when not NULL; or owner $4's)
for $5 s: renewed | lost (+ holders)."""

RELEASE = "SELECT * FROM queen.lock_release_v1($1, $2, $3)"
"""Release the permit of lock $1 with token $2 (slot $3 when not NULL): released | lost."""

PERMITS = "SELECT * FROM queen.lock_permits_v1($1)"
"""The live permits of lock $1, in key order (``get``: no fence, a plain read)."""
