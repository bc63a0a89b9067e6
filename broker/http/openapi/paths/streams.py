"""The streaming SDK's routes: register a query, run a cycle, read state."""
from __future__ import annotations

from broker.http.openapi.builder import (
    ANY,
    BOOL,
    INT,
    MAP,
    NSTR,
    NTIME,
    STR,
    UUID,
    arr,
    nullable,
    obj,
    op,
    path,
)

TAG = "Streams"

_FAILED = obj({"success": BOOL, "error": STR}, ["success", "error"])


def _answer(description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": _FAILED}}}


STREAM_QUERY = obj({
    "queryId": STR, "name": STR, "sourceQueue": STR, "sinkQueue": NSTR, "configHash": STR,
    "createdAt": STR, "updatedAt": STR,
    "state": obj({"rows": INT, "bytes": INT, "partitions": INT, "lastUpdateAt": NSTR},
                 ["rows", "bytes", "partitions"]),
    "cycles": obj({"committed": INT, "partitions": INT, "lastCycleAt": NSTR},
                  ["committed", "partitions"])},
    ["queryId", "name", "sourceQueue", "state", "cycles"])
"""A query in the operator's view (GET /api/v1/status/streams, documented with the status
routes)."""

OPERATIONS = [
    op("POST", "/streams/v1/queries", tag=TAG, summary="Register a streaming query",
       description="Idempotent per name. The same name with another `config_hash` is a 409 "
                   "unless `reset: true`, which deletes the query's state first.",
       body=obj({"name": STR, "source_queue": STR, "sink_queue": NSTR, "config_hash": STR,
                 "reset": BOOL}, ["name", "source_queue", "config_hash"]), body_required=True,
       ok=obj({"success": BOOL, "query_id": UUID, "name": STR, "config_hash": STR,
               "fresh": BOOL, "reset": BOOL}, ["success", "query_id"]),
       responses={409: _answer("Registered with another config_hash")}),
    op("GET", "/streams/v1/queries", tag=TAG, summary="Every query with its state size",
       ok=obj({"queries": arr(obj({"query_id": UUID, "name": STR, "source_queue": STR,
                                   "sink_queue": NSTR, "config_hash": STR, "state": MAP}))},
              ["queries"])),
    op("DELETE", "/streams/v1/queries/<name:str>", tag=TAG,
       summary="Delete a query and its state", params=(path("name", "Query name"),),
       ok=obj({"success": BOOL, "query_id": UUID, "name": STR, "deleted": BOOL}, ["success"]),
       responses={404: _answer("No such query")}),
    op("POST", "/streams/v1/cycle", tag=TAG,
       summary="One cycle: state changes, sink pushes and the source ack in one transaction",
       description="Any failure rolls the whole cycle back; a refused ack answers 200 with "
                   "`success: false` and the error, as the SDK expects.",
       body=obj({"query_id": UUID, "partition_id": UUID, "consumer_group": STR,
                 "state_ops": arr(obj({"type": {"enum": ["upsert", "delete"]}, "key": STR,
                                       "value": ANY}, ["type", "key"])),
                 "push_items": arr(MAP), "ack": nullable(MAP), "release_lease": BOOL},
                ["query_id", "partition_id"]), body_required=True,
       ok=obj({"success": BOOL, "query_id": STR, "partition_id": STR,
               "state_ops_applied": INT, "push_results": arr(MAP),
               "ack_result": nullable(MAP), "error": STR}, ["success"]),
       responses={404: _answer("No such query, or no such partition")}),
    op("POST", "/streams/v1/state/get", tag=TAG, summary="Read a query's state for a partition",
       description="Missing keys are absent; no `keys` (or an empty list) reads every row.",
       body=obj({"query_id": UUID, "partition_id": UUID, "keys": arr(STR), "key_prefix": NSTR,
                 "ripe_at_or_before": INT}, ["query_id", "partition_id"]), body_required=True,
       ok=obj({"success": BOOL, "rows": arr(obj({"key": STR, "value": ANY,
                                                 "updated_at": NTIME}, ["key"]))},
              ["success", "rows"])),
]
