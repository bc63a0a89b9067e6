"""The broker's OpenAPI 3.1 document, built from one small module per route group
(``broker/http/openapi/paths/``), served at ``/openapi.json`` and drawn at ``/docs``.

    builder.py  op() and the schema helpers; the answers every route can give
    paths/      one module per route group (its __init__ is the map)
    page.py     /docs drawn on the server: no script, nothing from a CDN

To describe a new route: add an ``op(...)`` entry to its group's module (or a new module, and
a line in ``GROUPS``). ``tests/unit/test_openapi.py`` fails for any route the app registers
that no entry describes, and for entries describing no route.
"""
from __future__ import annotations

import copy
from functools import cache
from typing import Any

import broker
from broker.http.openapi.builder import ANY, BOOL, ERROR, INT, NSTR, STR, Op, arr, obj
from broker.http.openapi.paths import (
    consumer_groups,
    dashboard,
    ephemeral,
    messages,
    messaging,
    migration,
    queues,
    state,
    state_ops,
    status,
    streams,
    supervision,
    system,
    traces,
)

GROUPS = (messaging, queues, messages, consumer_groups, traces, status, system, streams,
          state, state_ops, migration, dashboard, supervision, ephemeral)

COMPONENTS: dict[str, Any] = {
    "schemas": {
        "Error": ERROR,
        "Message": obj({
            "id": STR, "transactionId": STR, "traceId": NSTR, "data": ANY,
            "producerSub": NSTR, "createdAt": STR, "queue": STR, "partition": STR,
            "partitionId": STR, "leaseId": STR, "consumerGroup": NSTR, "retryCount": INT,
        }, ["id", "transactionId", "data", "queue", "partition", "partitionId"]),
        "Flag": obj({"enabled": BOOL}, ["enabled"]),
        "Strings": arr(STR),
    },
    "securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                   "description": "Only with JWT_ENABLED=true: a token whose role claim "
                                  "grants the route's level (read-only, read-write, admin)"},
    },
}

DESCRIPTION = """\
A PostgreSQL-backed, partitioned message broker speaking the Queen MQ HTTP API.

Every error answer is `{"error": "..."}` (a few routes answer `{"success": false, "error": ...}`
instead, as documented on the route). A 400 changed nothing. A 503 is temporary and carries
`Retry-After`. With `JWT_ENABLED=true` every route except `/health`, `/metrics*`,
`/openapi.json` and `/docs` needs a bearer token (401 without one, 403 when its role is too
low). Every GET route except the pops also answers HEAD; any path answers a CORS preflight
(OPTIONS) with 204.
"""


def operations() -> list[Op]:
    return [entry for group in GROUPS for entry in group.OPERATIONS]


@cache
def _document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for entry in operations():
        methods = paths.setdefault(entry.path, {})
        if entry.method in methods:
            raise ValueError(f"two OpenAPI entries for {entry.method.upper()} {entry.path}")
        methods[entry.method] = entry.operation
    tags = list(dict.fromkeys(op.operation["tags"][0] for op in operations()))
    return {
        "openapi": "3.1.0",
        "info": {"title": "queen-broker", "version": broker.__version__,
                 "description": DESCRIPTION},
        "tags": [{"name": t} for t in tags],
        "security": [{}, {"bearer": []}],
        "paths": paths,
        "components": COMPONENTS,
    }


def document() -> dict[str, Any]:
    """The document (a copy: callers may change it, e.g. set ``servers``)."""
    return copy.deepcopy(_document())
