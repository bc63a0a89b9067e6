"""The OpenAPI document: a valid OpenAPI 3.1 document, and it describes exactly the routes
the app serves (a new route without an entry fails here, naming it)."""
from __future__ import annotations

import re

import pytest
from openapi_spec_validator import validate
from sanic import Sanic

from broker.core.config import load_settings
from broker.http.app import create_app
from broker.http.openapi import document
from broker.http.openapi.builder import openapi_path
from broker.http.openapi.page import render


@pytest.fixture(scope="module")
def app():
    Sanic.test_mode = True
    app = create_app(load_settings({}), "postgresql://unused", name="openapi_test")
    app.router.finalize()
    return app


def served_operations(app) -> set[tuple[str, str]]:
    """(METHOD, OpenAPI path) of every route; HEAD is GET's twin (documented once, in the
    document's description)."""
    out = set()
    for route in app.router.routes:
        path = openapi_path("/" + route.path.lstrip("/"))
        for method in route.methods:
            if method != "HEAD":
                out.add((method, path))
    return out


def documented_operations() -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, methods in document()["paths"].items()
            for method in methods}


def test_the_document_is_valid_openapi_3_1():
    validate(document())


def test_every_served_route_is_documented(app):
    missing = served_operations(app) - documented_operations()
    assert not missing, f"routes without an OpenAPI entry (add one in broker/http/openapi/paths/): " \
                        f"{sorted(missing)}"


def test_every_documented_route_is_served(app):
    extra = documented_operations() - served_operations(app)
    assert not extra, f"OpenAPI entries for routes that do not exist: {sorted(extra)}"


def test_every_path_parameter_is_declared():
    for path, methods in document()["paths"].items():
        names = set(re.findall(r"{([^}]+)}", path))
        for method, op in methods.items():
            declared = {p["name"] for p in op.get("parameters", ()) if p["in"] == "path"}
            assert declared == names, f"{method.upper()} {path}: {declared} vs {names}"


def test_every_operation_documents_an_error_answer():
    for path, methods in document()["paths"].items():
        for method, op in methods.items():
            codes = {int(c) for c in op["responses"]}
            # The ephemeral family is unsupported on purpose: it only ever answers 404.
            if not path.startswith("/api/v1/ephemeral"):
                assert any(c < 300 for c in codes), (method, path)
            # pages, a route that answers every caller 200 (who the token is), and the
            # reference dashboard's session stubs (a redirect or a page; a no-op)
            if path not in ("/openapi.json", "/docs", "/metrics", "/metrics/prometheus", "/",
                            "/dashboard", "/api/v1/auth/session", "/auth/login",
                            "/auth/logout"):
                assert any(c >= 400 for c in codes), (method, path)


def test_the_page_names_every_operation_and_loads_nothing_from_elsewhere():
    page = render(document())
    for path in document()["paths"]:
        assert f"<code>{path}</code>" in page
    # The one link is the empty data: icon, which keeps the browser from asking for a
    # /favicon.ico (a 404, logged as a console error).
    assert not re.search(r'<script|<link(?! rel=icon href="data:,">)|@import|src=|url\(', page,
                         re.I)
    assert "http://" not in page and "https://" not in page
