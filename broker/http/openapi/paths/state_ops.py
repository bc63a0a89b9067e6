"""Operator views of the state surfaces: key/value namespaces and keys, held locks,
pending timers (routes/ops/state.py)."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    INT,
    MAP,
    NSTR,
    NTIME,
    STR,
    TIME,
    arr,
    nullable,
    obj,
    op,
    q_int,
    query,
)

TAG = "State (operator views)"

NAMESPACE = obj({"namespace": STR, "keys": INT, "liveKeys": INT, "withTtl": INT, "expired": INT,
                 "deleted": INT, "bytes": INT},
                ["namespace", "keys", "liveKeys", "withTtl", "expired", "deleted", "bytes"])
KEY_ROW = obj({"key": STR, "value": ANY, "version": INT, "expiresAt": NTIME, "createdAt": TIME,
               "updatedAt": TIME, "expired": BOOL, "bytes": INT},
              ["key", "version", "expiresAt", "updatedAt", "expired", "bytes"])
PERMIT = obj({"slot": INT, "owner": NSTR, "token": INT, "since": NSTR, "renewedAt": NSTR,
              "expiresAt": NTIME}, ["slot", "owner", "token", "expiresAt"])
LOCK = obj({"name": STR, "lastToken": INT, "holders": INT, "permits": arr(PERMIT),
            "expiresAt": NTIME}, ["name", "lastToken", "holders", "permits"])
TIMER_QUEUE = obj({"queue": STR, "pending": INT, "overdue": INT, "nextDueAt": NTIME,
                   "maxAttempts": INT}, ["queue", "pending", "overdue", "nextDueAt"])
TIMER_COUNTERS = {"delivered": INT, "cancelled": INT, "scheduled": INT, "rescheduled": INT,
                  "tooLate": INT, "absent": INT}

OPERATIONS = [
    op("GET", "/api/v1/resources/kv/namespaces", tag=TAG,
       summary="Key/value namespaces with their key counts",
       description="Exact at the call. `keys`: live and expired rows (expired ones are absent "
                   "to every read but stored until the retention job deletes them); "
                   "`withTtl`: live keys that will expire; `deleted`: delete tombstones "
                   "awaiting the same sweep; `bytes`: JSON text of the live values. Lock "
                   "permits are the namespace `queen-locks`.",
       ok=obj({"namespaces": arr(NAMESPACE)}, ["namespaces"])),
    op("POST", "/api/v1/resources/kv/list", tag=TAG,
       summary="A keyset page of one namespace's keys",
       description="A POST because the cursor is a key (kept out of URLs and access logs). "
                   "`limit` is clamped to 1-1000 (default 100); a page also stops after the "
                   "row that reaches 4 MiB of values. `expired` on each row is decided "
                   "against the database's clock. READ_ONLY.",
       body=obj({"namespace": STR, "prefix": STR, "after": STR, "limit": INT,
                 "includeExpired": BOOL, "keysOnly": BOOL}, ["namespace"]),
       body_required=True,
       ok=obj({"namespace": STR, "rows": arr(KEY_ROW), "truncated": BOOL, "nextAfter": NSTR,
               "bytes": INT, "asOf": TIME}, ["namespace", "rows", "truncated", "nextAfter"])),
    op("GET", "/api/v1/resources/locks", tag=TAG,
       summary="Held locks and semaphores: permits, tokens, expiry",
       description="Locks with at least one live permit, in name order. `lastToken` is the "
                   "highest fencing token the lock ever handed out; each permit's `token` is "
                   "the one its holder must present. `locksHeld` / `permitsHeld` count the "
                   "whole cluster.",
       params=(query("prefix", "Only locks whose name starts with this"),
               query("after", "Lock name to continue after"),
               q_int("limit", "Locks per page (clamped to 1-1000)", 100)),
       ok=obj({"locks": arr(LOCK), "truncated": BOOL, "nextAfter": NSTR, "locksHeld": INT,
               "permitsHeld": INT}, ["locks", "truncated", "locksHeld", "permitsHeld"])),
    op("GET", "/api/v1/resources/timers", tag=TAG,
       summary="Pending timers per queue, overdue ones, and this broker's deliveries",
       description="Cluster-wide per queue: pending timers, `overdue` (due and not delivered "
                   "yet; a sweep normally takes them within a second), the earliest due "
                   "time, against the database's clock (`asOf`). `thisBroker`: timers "
                   "delivered and verdicts answered by this broker since it started.",
       ok=obj({"asOf": TIME, "queues": arr(TIMER_QUEUE),
               "totals": obj({"queues": INT, "pending": INT, "overdue": INT,
                              "nextDueAt": NTIME}),
               "thisBroker": obj({**TIMER_COUNTERS, "sweeper": nullable(MAP)})},
              ["asOf", "queues", "totals", "thisBroker"])),
]

