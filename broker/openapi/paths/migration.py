"""The migration routes (ADMIN): copy the queen schema into another database."""
from __future__ import annotations

from broker.openapi.builder import BOOL, INT, NUM, STR, arr, obj, op

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

OPERATIONS = [
    op("POST", "/api/v1/migration/test-connection", tag=TAG,
       summary="Try a connection to the target database (always 200)",
       body=TARGET, body_required=True, database=False,
       ok=obj({"success": BOOL, "message": STR, "version": STR, "error": STR},
              ["success", "message"])),
    op("POST", "/api/v1/migration/start", tag=TAG,
       summary="Copy the queen schema to the target (pg_dump | pg_restore, in the background)",
       description="Turn both maintenance modes on first: nothing pauses pushes or pops.",
       body=START, body_required=True, ok_status=202,
       ok=obj({"status": STR, "message": STR}, ["status"]),
       responses={409: {"description": "A copy is in progress", **_ERROR}}),
    op("GET", "/api/v1/migration/status", tag=TAG, summary="This broker's copy state",
       ok=STATE, database=False),
    op("POST", "/api/v1/migration/validate", tag=TAG,
       summary="Row counts of the queen tables on both sides",
       body=TARGET, body_required=True,
       ok=obj({"success": BOOL, "allMatch": BOOL,
               "tables": arr(obj({"table": STR, "sourceCount": INT, "targetCount": INT,
                                  "match": BOOL}))}, ["success"]),
       responses={500: {"description": "A connection failed (the reference's status code)",
                        **_ERROR}}),
    op("POST", "/api/v1/migration/reset", tag=TAG, summary="Back to idle",
       ok=obj({"status": STR, "message": STR}, ["status"]), database=False,
       responses={409: {"description": "A copy is in progress", **_ERROR}}),
]
