"""The migration routes (ADMIN): test a target connection, copy the queen schema
to it, follow the copy, compare row counts, reset (broker/service/migration.py).

They make the broker connect to a host the caller names and, for `start`, send it
every message: off unless MIGRATION_ROUTES=true (then 404 migration_routes_off, before
any body is read)."""
from __future__ import annotations

from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.http.responses import error, json, read_json
from broker.http.types import BrokerRequest
from broker.service import migration as mig

bp = Blueprint("migration")


def _target(request: BrokerRequest, required: str) -> mig.Target:
    if not request.body or not request.body.strip():
        raise mig.MigrationInputError("Empty request body")
    return mig.parse_target(read_json(request), required)


async def routes_switched_off(request: BrokerRequest) -> HTTPResponse | None:
    if not request.app.ctx.settings.migration_routes:
        return json({"error": "migration_routes_off",
                     "detail": "the migration routes are switched off on this broker; "
                               "set MIGRATION_ROUTES=true to serve them"}, 404)
    return None


# After the app's authentication (priority -1): a 401/403 comes first. Registered by a call,
# not as ``@bp.on_request(priority=-1)``: Sanic annotates on_request as returning the
# middleware, not the decorator the keyword-only form returns, so mypy rejects that form.
bp.on_request(routes_switched_off, priority=-1)


@bp.exception(mig.MigrationInputError)
async def bad_input(_request: BrokerRequest, exc: mig.MigrationInputError):
    return error(str(exc), 400)


@bp.post("/api/v1/migration/test-connection")
async def test_connection(request: BrokerRequest):
    target = _target(request, "host, database, and user are required")
    return json(await mig.test_connection(target))


@bp.post("/api/v1/migration/start")
async def start(request: BrokerRequest):
    target = _target(request, "target host, database, and user are required")
    body = read_json(request)
    schema = body.get("schema", mig.SCHEMA)
    if not isinstance(schema, str) or not mig.IDENTIFIER.match(schema):
        return error("schema must be a plain lower-case identifier", 400)
    exclude = body.get("excludeTableData") or []
    if not isinstance(exclude, list) or not all(isinstance(t, str) for t in exclude):
        return error("excludeTableData must be an array of table names", 400)
    if not request.app.ctx.migration.start(target, schema, exclude):
        return error("Migration already in progress", 409)
    return json({"status": "started",
                 "message": "Migration started. Poll /api/v1/migration/status for progress."},
                status=202)


@bp.get("/api/v1/migration/status")
async def status(request: BrokerRequest):
    return json(request.app.ctx.migration.snapshot())


@bp.post("/api/v1/migration/validate")
async def validate(request: BrokerRequest):
    target = _target(request, "target host, database, and user are required")
    code, body = await mig.validate(request.app.ctx.migration.source_dsn, target)
    return json(body, status=code)


@bp.post("/api/v1/migration/reset")
async def reset(request: BrokerRequest):
    if not request.app.ctx.migration.reset():
        return error("Cannot reset while migration is in progress", 409)
    return json({"status": "idle", "message": "Migration state reset"})
