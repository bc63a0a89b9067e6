"""The migration routes (ADMIN): copy the queen schema into another database."""
from __future__ import annotations

from broker.http.openapi.builder import BOOL, INT, NUM, RETRY_AFTER, STR, arr, obj, op

TAG = "Migration"

TARGET = obj({"host": STR, "port": {"type": ["string", "integer"]}, "database": STR,
              "user": STR, "password": STR, "ssl": BOOL},
             ["host", "database", "user"])
START = obj({**TARGET["properties"], "schema": STR, "excludeTableData": arr(STR)},
            TARGET["required"])
STATE = obj({"status": {"enum": ["idle", "dumping", "restoring", "complete", "error"]},
             "currentStep": STR, "elapsedSeconds": NUM, "error": STR, "restoreOutput": STR},
            ["status", "currentStep", "elapsedSeconds"])
_ERROR = {"content": {"application/json": {"schema": obj({"error": STR}, ["error"])}}}
_FAILED = {"content": {"application/json": {"schema": obj({"success": BOOL, "error": STR},
                                                          ["success", "error"])}}}
# Every route: 404 while MIGRATION_ROUTES is off (the default).
_OFF = {404: {"description": "MIGRATION_ROUTES is off (the default): migration_routes_off",
              "content": {"application/json": {"schema": obj({"error": STR, "detail": STR},
                                                             ["error"])}}}}

OPERATIONS = [
    op("POST", "/api/v1/migration/test-connection", tag=TAG,
       summary="Try a connection to the target database (always 200)",
       body=TARGET, body_required=True, database=False, responses=_OFF,
       ok=obj({"success": BOOL, "message": STR, "version": STR, "error": STR},
              ["success", "message"])),
    op("POST", "/api/v1/migration/start", tag=TAG,
       summary="Copy the queen schema to the target (pg_dump | pg_restore, in the background)",
       description="Turn both maintenance modes on first: nothing pauses pushes or pops.",
       body=START, body_required=True, ok_status=202,
       ok=obj({"status": STR, "message": STR}, ["status"]),
       responses={409: {"description": "A copy is in progress", **_ERROR}, **_OFF}),
    op("GET", "/api/v1/migration/status", tag=TAG, summary="This broker's copy state",
       ok=STATE, database=False, responses=_OFF),
    op("POST", "/api/v1/migration/validate", tag=TAG,
       summary="Row counts of the queen tables on both sides",
       body=TARGET, body_required=True,
       ok=obj({"success": BOOL, "allMatch": BOOL,
               "tables": arr(obj({"table": STR, "sourceCount": INT, "targetCount": INT,
                                  "match": BOOL}))}, ["success"]),
       responses={422: {"description": "The target cannot be reached, resolved or logged "
                        "into (the reference answers 500)", **_FAILED},
                  503: {"description": "This broker's own database is unreachable: retry after "
                        "Retry-After", "headers": RETRY_AFTER, **_FAILED}, **_OFF}),
    op("POST", "/api/v1/migration/reset", tag=TAG, summary="Back to idle",
       ok=obj({"status": STR, "message": STR}, ["status"]), database=False,
       responses={409: {"description": "A copy is in progress", **_ERROR}, **_OFF}),
]
