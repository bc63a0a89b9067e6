"""Ephemeral (RAM-class) queues, ``/api/v1/ephemeral/*``: not supported, on purpose.

Every method on the whole family answers 404 ``{"error": "ephemeral_unsupported"}``.
The official clients map a 404 on this family whose code is not
``ephemeral_queue_not_found`` to their "unsupported by this broker" error (code
``ephemeral_unsupported``), which is the truth: this broker keeps every message in
PostgreSQL, and a queue whose contents survive nothing is not a thing it offers."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import json
from broker.http.types import BrokerRequest

bp = Blueprint("ephemeral")

_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


async def _unsupported(request: BrokerRequest, **_path: str):
    return json({"error": "ephemeral_unsupported",
                 "detail": "this broker does not offer ephemeral (RAM-class) queues; "
                           "use a durable queue"}, 404)


bp.add_route(_unsupported, "/api/v1/ephemeral", methods=_METHODS, name="ephemeral_root")
bp.add_route(_unsupported, "/api/v1/ephemeral/<rest:path>", methods=_METHODS,
             name="ephemeral_any")
