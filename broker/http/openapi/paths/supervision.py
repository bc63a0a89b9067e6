"""The supervised consumers: what the clients' ``consume().supervision(...)`` publish in
the key/value namespace ``queen-supervisor``, decoded (routes/supervision.py)."""
from __future__ import annotations

from broker.http.openapi.builder import (
    BOOL,
    INT,
    NINT,
    NSTR,
    NTIME,
    STR,
    TIME,
    arr,
    nullable,
    obj,
    op,
    query,
)

TAG = "Status and analytics"

POOL = obj({"name": NSTR, "queue": NSTR, "namespace": NSTR, "task": NSTR,
            "consumerGroup": NSTR, "desired": NINT, "running": NINT, "busy": NINT,
            "completed": NINT, "failed": NINT, "lastCompletedAt": NTIME,
            "oldestInflightSeconds": NINT})
INSTANCE = obj({
    "instance": NSTR, "key": STR,
    "status": {"type": "string", "enum": ["ok", "incomplete", "invalid", "unread"]},
    "problem": NSTR,
    "state": nullable({"type": "string",
                       "enum": ["starting", "running", "paused", "terminating", "stopped"]}),
    "stale": nullable(BOOL), "schema": NSTR, "hostname": NSTR, "pid": NINT, "engine": NSTR,
    "executionModel": NSTR, "startedAt": NTIME, "updatedAt": NTIME, "uptimeSeconds": NINT,
    "ageSeconds": NINT, "heartbeatTimeout": NINT, "publishedAt": TIME, "expiresAt": NTIME,
    "pools": arr(POOL)},
    ["instance", "key", "status", "problem", "state", "stale", "publishedAt", "pools"])
COUNTS = {"instances": INT, "running": INT, "stopped": INT, "stale": INT, "problems": INT}

OPERATIONS = [
    op("GET", "/api/v1/status/supervision", tag=TAG,
       summary="The supervised consumers (queen-supervisor), decoded",
       description="Every live publication of `consume().supervision({group})` in the "
                   "key/value namespace `queen-supervisor`, per supervision group and "
                   "instance: the status document's state, host, pid, uptime and worker "
                   "pools (desired, running, busy, completed, failed), and `stale` when its "
                   "`updated_at` is older than its heartbeat timeout (the database's clock). "
                   "A publication that does not decode is listed with `status` `incomplete` "
                   "(a chunk missing or of another write), `invalid` or `unread` (past the "
                   "answer's byte budget) and the `problem`; it never fails the route. At "
                   "most 1000 instances; `truncated` says when some were left out.",
       params=(query("group", "Only this supervision group"),),
       ok=obj({"namespace": STR, "asOf": TIME, "group": NSTR,
               "groups": arr(obj({"group": STR, "counts": obj(COUNTS, list(COUNTS)),
                                  "instances": arr(INSTANCE)},
                                 ["group", "counts", "instances"])),
               "totals": obj({"groups": INT, **COUNTS}, ["groups", *COUNTS]),
               "keys": obj({"live": INT, "heads": INT, "chunks": INT},
                           ["live", "heads", "chunks"]),
               "truncated": BOOL},
              ["namespace", "asOf", "groups", "totals", "keys", "truncated"])),
]
