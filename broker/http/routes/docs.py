"""The API reference: ``GET /openapi.json`` (the OpenAPI 3.1 document) and ``GET /docs``
(the same drawn as a self-contained page)."""
from __future__ import annotations

from functools import cache

from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.http.openapi import document
from broker.http.openapi.page import render
from broker.http.responses import json
from broker.http.types import BrokerRequest

bp = Blueprint("docs")


@cache
def _page() -> str:
    return render(document())


@bp.get("/openapi.json")
async def openapi_json(request: BrokerRequest):
    return json(document())


@bp.get("/docs")
async def docs(request: BrokerRequest):
    return HTTPResponse(_page(), content_type="text/html; charset=utf-8")
