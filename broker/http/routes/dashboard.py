"""The web dashboard: static files shipped in the package (broker/http/dashboard/), served at
``/`` and ``/dashboard`` (the page) and ``/dashboard/<file>`` (its modules, styles and the
vendored chart library), plus ``GET /api/v1/auth/session``: what the caller's token may do,
so the page can hide the buttons its role may not use.

The files are read once at import: a handful of small files, no path from a request
ever reaches the file system (a name not in the table is a 404).
"""
from __future__ import annotations

import mimetypes
from pathlib import Path

from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.http.auth import ADMIN, LEVEL_NAMES, AuthFailure, required_level
from broker.http.responses import error, json
from broker.http.types import BrokerRequest

bp = Blueprint("dashboard")

ROOT = Path(__file__).resolve().parent.parent / "dashboard"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml",
         ".txt": "text/plain; charset=utf-8"}


def _load() -> dict[str, tuple[bytes, str]]:
    files = {}
    for path in sorted(ROOT.rglob("*")):
        if path.is_file():
            kind = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or \
                "application/octet-stream"
            files[path.relative_to(ROOT).as_posix()] = (path.read_bytes(), kind)
    return files


FILES = _load()

# The page's actions and one route each needs, as the auth rules classify it.
ACTIONS = {
    "configure": ("POST", "/api/v1/configure"),
    "seek": ("POST", "/api/v1/consumer-groups/g/queues/q/seek"),
    "deleteGroup": ("DELETE", "/api/v1/consumer-groups/g/queues/q"),
    "retryDeadLetter": ("POST", "/api/v1/messages/p/t/retry"),
    "discardMessage": ("DELETE", "/api/v1/messages/p/t"),
    "maintenance": ("POST", "/api/v1/system/maintenance"),
    "readMaintenance": ("GET", "/api/v1/system/maintenance"),
    "releaseSpool": ("POST", "/api/v1/system/spools/s/release"),
}


def _file(name: str) -> HTTPResponse:
    entry = FILES.get(name)
    if entry is None:
        return error("no_such_file", 404)
    body, kind = entry
    # no-cache: a browser revalidates, so an upgraded broker serves its own page
    return HTTPResponse(body, content_type=kind, headers={"Cache-Control": "no-cache"})


@bp.get("/")
async def root(_request: BrokerRequest):
    return _file("index.html")


@bp.get("/dashboard")
async def page(_request: BrokerRequest):
    return _file("index.html")


@bp.get("/dashboard/<name:path>")
async def asset(_request: BrokerRequest, name: str):
    return _file(name)


@bp.get("/api/v1/auth/session")
async def session(request: BrokerRequest):
    """Public: verifies the bearer token itself, so a page without one learns that it
    needs one from a 200 (a 401 would be logged by the browser as an error)."""
    auth = request.app.ctx.auth
    body: dict = {"authEnabled": auth.enabled}
    if not auth.enabled:
        level = ADMIN
    else:
        try:
            claims = await auth.verify(auth.token_of(request.headers.get("authorization")))
        except AuthFailure as failure:
            return json({**body, "authenticated": False, "error": failure.message,
                         "level": None, "can": {}})
        level = auth.level_of(claims)
    return json({**body, "authenticated": True, "level": LEVEL_NAMES[level],
                 "can": {name: required_level(method, path) <= level
                         for name, (method, path) in ACTIONS.items()}})
