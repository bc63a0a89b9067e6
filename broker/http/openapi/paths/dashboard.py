"""The web dashboard: its files, who the caller's token is, and the figures only it reads
(per-second throughput, depth history, paged server-side-searched lists)."""
from __future__ import annotations

from broker.http.openapi.builder import (
    BOOL,
    INT,
    MAP,
    NSTR,
    STR,
    answer,
    arr,
    obj,
    op,
    path,
    q_int,
    query,
)

TAG = "Dashboard"

PAGE = (query("search", "Only names containing this (server-side)"),
        q_int("limit", "Page size (1-500)", 50), q_int("offset", "Rows to skip", 0))
LISTED = {"total": INT, "pagination": MAP}
_HTML = answer(STR, "The page", "text/html")
_FILE = {"description": "A file of the page (script, style, image)",
         "content": {"*/*": {"schema": STR}}}
_MISSING = {"description": "No such file",
            "content": {"application/json": {"schema": obj({"error": STR}, ["error"])}}}

OPERATIONS = [
    op("GET", "/", tag=TAG, summary="The dashboard", public=True, database=False,
       responses={200: _HTML}),
    op("GET", "/dashboard", tag=TAG, summary="The dashboard", public=True, database=False,
       responses={200: _HTML}),
    op("GET", "/dashboard/<name:path>", tag=TAG, summary="A file of the dashboard",
       params=(path("name", "File name"),), public=True, database=False,
       responses={200: _FILE, 404: _MISSING}),
    op("GET", "/api/v1/auth/session", tag=TAG,
       summary="What the caller's token may do (answers without a token too)",
       public=True, database=False,
       ok=obj({"authEnabled": BOOL, "authenticated": BOOL, "level": {"type": ["string", "null"]},
               "can": MAP}, ["authEnabled", "authenticated"])),
    op("GET", "/auth/me", tag=TAG,
       summary="The standalone identity the reference web dashboard boots from",
       description="Auth off: one synthetic cluster, admin role, live operator, "
                   "`standalone: true`. Auth on: 401 `auth_required` (no browser sessions).",
       public=True, database=False,
       ok=obj({"user_id": STR, "email": NSTR, "is_operator": BOOL, "operator_live": BOOL,
               "clusters": arr(MAP), "acting_cluster": MAP, "act_cluster_header": STR,
               "role": STR, "standalone": BOOL},
              ["user_id", "clusters", "operator_live", "standalone"]),
       responses={401: {**answer(obj({"error": STR, "code": STR}, ["error", "code"]),
                                 "Auth is on: this broker keeps no browser sessions")}}),
    op("GET", "/auth/login", tag=TAG, summary="Auth off: back to /; auth on: why there is "
       "no sign-in here", public=True, database=False,
       responses={200: _HTML, 302: {"description": "Auth off: redirect to /"}}),
    op("POST", "/auth/logout", tag=TAG, summary="A no-op: standalone has no session to end",
       public=True, database=False, ok=obj({"ok": BOOL}, ["ok"])),
    op("GET", "/api/v1/live/throughput", tag=TAG,
       summary="Messages pushed / popped / acked per second through this broker",
       params=(q_int("seconds", "How far back (at most 900)", 900),), database=False,
       ok=MAP),
    op("GET", "/api/v1/live/queues/<queue:str>/depth", tag=TAG,
       summary="A queue's pending count over time (kept in memory)",
       params=(path("queue", "Queue name"),), database=False, ok=MAP),
    op("GET", "/api/v1/live/cluster", tag=TAG, summary="The cluster as this broker sees it",
       ok=MAP),
    op("GET", "/api/v1/browse/queues", tag=TAG, summary="A page of queues with their figures",
       params=PAGE, ok=obj({"queues": arr(MAP), **LISTED}, ["queues", "total"])),
    op("GET", "/api/v1/browse/queues/<queue:str>", tag=TAG,
       summary="A queue's header and its configurable options",
       params=(path("queue", "Queue name"),), errors=(404,), ok=MAP),
    op("GET", "/api/v1/browse/queues/<queue:str>/partitions", tag=TAG,
       summary="A page of a queue's partitions", params=(path("queue", "Queue name"), *PAGE),
       errors=(404,), ok=obj({"partitions": arr(MAP), **LISTED}, ["partitions", "total"])),
    op("GET", "/api/v1/browse/queues/<queue:str>/partitions/<partition:str>/messages",
       tag=TAG, summary="A partition's messages from a position or a time",
       params=(path("queue", "Queue name"), path("partition", "Partition name"),
               q_int("fromPosition", "First position", 0),
               query("from", "First message created at or after (ISO-8601)"),
               q_int("limit", "Page size (1-500)", 50)),
       ok=obj({"messages": arr(MAP)}, ["messages"])),
    op("GET", "/api/v1/browse/consumer-groups", tag=TAG,
       summary="A page of (group, queue) pairs, furthest behind first", params=PAGE,
       ok=obj({"groups": arr(MAP), **LISTED}, ["groups", "total"])),
    op("GET", "/api/v1/browse/consumer-groups/<group:str>/queues/<queue:str>", tag=TAG,
       summary="A group's lag per partition on a queue",
       params=(path("group", "Consumer group"), path("queue", "Queue name"), *PAGE),
       ok=obj({"partitions": arr(MAP), **LISTED}, ["partitions", "total"])),
]
