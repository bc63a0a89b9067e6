"""``/auth/*``: the identity surface the reference web dashboard boots from.

Queen's own Vue dashboard asks ``GET /auth/me`` before it renders anything and takes every
permission from that one payload. Behind the reference's proxy that is a cookie session;
served broker-direct, the reference broker answers a fixed *standalone* identity. This
broker does the same, so the reference dashboard pointed at it (through any static server
or dev proxy) can start:

* auth off (``JWT_ENABLED=false``): one synthetic cluster, admin role, live operator, and
  ``standalone: true`` (the app then hides its session controls). The API is open in this
  configuration already; the identity adds no privilege.
* auth on: ``401 auth_required``. This broker checks bearer tokens but has no user accounts
  or browser sessions, so there is nothing to sign in to; ``/auth/login`` says so in a page.

Tenancy is not a feature of this broker, so the cluster's ``tenant_id`` is ``null``."""
from __future__ import annotations

from sanic import Blueprint
from sanic.response import HTTPResponse, redirect

from broker.http.responses import json
from broker.http.types import BrokerRequest

bp = Blueprint("identity")

# The header the dashboard sends with the cluster it acts on; echoed only so the payload
# has the reference's shape (this broker serves one cluster and ignores the header).
ACT_CLUSTER_HEADER = "x-queen-act-cluster"
CLUSTER = "local"

_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Queen broker: authentication required</title>
<style>body{font:15px/1.6 system-ui,sans-serif;background:#0c0d10;color:#e8e6e3;
display:grid;place-items:center;min-height:100vh;margin:0}main{max-width:34rem;padding:2rem}
code{background:#1a1c21;padding:.1em .35em;border-radius:4px}</style></head>
<body><main><h1>This broker requires authentication</h1>
<p>JWT auth is on (<code>JWT_ENABLED=true</code>): the API takes bearer tokens, and the broker
keeps no user accounts or browser sessions, so there is nothing to sign in to here.</p>
<p>Use the broker's own dashboard (<code>/dashboard</code>, which asks for a token), or run
the broker with auth off for the open standalone identity.</p></main></body></html>
"""


def standalone_identity(server_id: str) -> dict:
    """The fixed identity of a broker served with auth off (the reference's field set)."""
    return {
        "user_id": "standalone",
        "email": None,
        "tenant_slug": CLUSTER,
        "is_operator": True,
        "operator_enabled": True,
        "operator_live": True,
        "acting_cluster": {"id": CLUSTER, "slug": CLUSTER},
        "clusters": [{"id": CLUSTER, "slug": CLUSTER, "role": "admin", "tenant_slug": CLUSTER,
                      "tenant_id": None, "status": "active", "cell_slug": server_id}],
        "act_cluster_header": ACT_CLUSTER_HEADER,
        "role": "admin",
        "cluster": None,
        "standalone": True,
    }


@bp.get("/auth/me")
async def me(request: BrokerRequest):
    if request.app.ctx.auth.enabled:
        return json({"error": "auth_required", "code": "auth_required"}, 401)
    return json(standalone_identity(request.app.ctx.settings.queen_server_id))


@bp.get("/auth/login")
async def login(request: BrokerRequest):
    if not request.app.ctx.auth.enabled:
        return redirect("/")
    return HTTPResponse(_LOGIN_PAGE, content_type="text/html; charset=utf-8")


@bp.post("/auth/logout")
async def logout(_request: BrokerRequest):
    """Nothing to end: standalone has no session (the app hides its sign-out there)."""
    return json({"ok": True})
