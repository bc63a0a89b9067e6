"""State next to the messages: offset reads and partition discovery, key/value, locks with
fencing tokens, timers; and the ephemeral family, unsupported on purpose."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    ERROR,
    MAP,
    NSTR,
    STR,
    arr,
    obj,
    op,
    path,
    q_int,
    query,
)

TAG = "State"

RESULTS = obj({"results": arr(MAP)}, ["results"])


def _refusal(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": ERROR}}}


_KV_KEY = (path("ns", "Namespace"), path("key", "Key (may contain /)"))

OPERATIONS = [
    op("POST", "/api/v1/fetch", tag=TAG, summary="Read records by offset (no lease, no cursor)",
       description="Offset o of a partition is its message at position o + 1. An entry below "
                   "logStartOffset or past highWatermark answers OFFSET_OUT_OF_RANGE.",
       body=obj({"entries": arr(MAP), "maxBytes": {"type": "integer"}}), body_required=True,
       ok=obj({"entries": arr(MAP)}, ["entries"])),
    op("POST", "/api/v1/partitions/changed", tag=TAG,
       summary="Partitions written since a time, paged, with a safeTime",
       body=obj({"queries": arr(MAP)}), body_required=True,
       ok=obj({"entries": arr(MAP), "safeTime": NSTR}, ["entries"])),
    op("POST", "/api/v1/kv", tag=TAG, summary="A batch of key/value operations",
       description="get, getMany, getPrefix, put, putIfAbsent, delete, incr, check; `expect` "
                   "preconditions and TTL; results are index-aligned. A batch that writes "
                   "needs READ_WRITE.",
       body=obj({"ops": arr(MAP)}), body_required=True,
       ok=obj({"results": arr(MAP), "success": BOOL, "reason": STR, "failedIndex": MAP},
              ["results"])),
    op("GET", "/api/v1/kv/<ns:str>/<key:path>", tag=TAG, summary="Read one key (ETag: version)",
       params=_KV_KEY, ok=MAP, responses={404: _refusal("No live key")}),
    op("PUT", "/api/v1/kv/<ns:str>/<key:path>", tag=TAG,
       summary="Write one key (If-Match / If-None-Match: * are preconditions)",
       params=_KV_KEY, body=obj({"value": ANY, "ttlMs": {"type": "integer"}}), ok=MAP,
       responses={412: {"description": "Precondition failed",
                        "content": {"application/json": {"schema": MAP}}}}),
    op("DELETE", "/api/v1/kv/<ns:str>/<key:path>", tag=TAG, summary="Delete one key",
       params=_KV_KEY, ok=MAP,
       responses={412: {"description": "Precondition failed",
                        "content": {"application/json": {"schema": MAP}}}}),
    op("POST", "/api/v1/locks", tag=TAG,
       summary="Locks and semaphores: acquire, renew, release, get",
       description="A permit carries a fencing token that only rises and changes at every "
                   "acquire and renew. A lock held by another owner is a verdict in the "
                   "result, never an error status.",
       body=obj({"ops": arr(MAP)}), body_required=True, ok=RESULTS),
    op("POST", "/api/v1/timers", tag=TAG, summary="Schedule, reschedule or cancel timers",
       description="A timer delivers its message to its queue not before its time; statuses "
                   "scheduled, rescheduled, cancelled, absent, too_late.",
       body=obj({"ops": arr(MAP)}), body_required=True, ok=RESULTS),
    op("DELETE", "/api/v1/timers/<queue:str>/<key:path>", tag=TAG, summary="Cancel a timer",
       params=(path("queue", "Queue"), path("key", "Timer key"),
               query("txn", "Echoed on an absent timer")), ok=MAP),
    op("GET", "/api/v1/timers/<queue:str>/<key:path>", tag=TAG, summary="Look at a timer",
       params=(path("queue", "Queue"), path("key", "Timer key")), ok=MAP),
    op("GET", "/api/v1/timers/<queue:str>", tag=TAG, summary="A page of a queue's timers",
       description="`{rows, truncated, nextAfter}`; with `mode=count` and a non-empty "
                   "`prefix`, `{queue, prefix, count}`: the pending timers whose key starts "
                   "with the prefix.",
       params=(path("queue", "Queue"), query("after", "Key to continue after"),
               q_int("limit", "Page size"), query("mode", "list (default) or count"),
               query("prefix", "With mode=count: the key prefix to count under")), ok=MAP),
]

_EPHEMERAL = _refusal("`ephemeral_unsupported`: not one of the eight ephemeral verbs "
                      "(their routes: the Ephemeral group; docs/ephemeral.md)")
for _route in ("/api/v1/ephemeral", "/api/v1/ephemeral/<rest:path>"):
    for _method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        OPERATIONS.append(op(
            _method, _route, tag=TAG, summary="Ephemeral queues: a path that is no verb",
            params=(path("rest", "Anything"),) if "rest" in _route else (),
            responses={404: _EPHEMERAL}, database=False))
