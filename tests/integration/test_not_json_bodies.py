"""A body that is not JSON, on any route that takes a JSON body, is the one clear 400 of
read_json (the body is not valid JSON), never the parser's own words nor a 500; a body that
is JSON but not an object is never a 500, and a refusal is a JSON error (a route whose body
is optional, like /api/v1/stats/refresh, may take ``null`` for none). Property tests against a real broker:
every such route (tests/unit/test_json_bodies.py keeps them reading bodies in one place)."""
from __future__ import annotations

import json

import httpx
import pytest
import ujson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.http.responses import NOT_JSON

pytestmark = pytest.mark.timeout(300)

LEASE = "00000000-0000-7000-8000-000000000000"
# (method, path) of every route that reads a JSON body (the migration routes are off unless
# MIGRATION_ROUTES=true; their body goes through the same read_json).
ROUTES = [
    ("POST", "/api/v1/push"), ("POST", "/api/v1/ack"), ("POST", "/api/v1/ack/batch"),
    ("POST", "/api/v1/transaction"), ("POST", f"/api/v1/lease/{LEASE}/extend"),
    ("POST", "/api/v1/configure"), ("POST", "/api/v1/ephemeral/push"),
    ("POST", "/api/v1/ephemeral/ack"), ("POST", "/api/v1/ephemeral/configure"),
    ("POST", "/api/v1/ephemeral/reset"), ("POST", "/api/v1/kv"),
    ("PUT", "/api/v1/kv/ns-json/key"), ("POST", "/api/v1/locks"),
    ("POST", "/api/v1/consumer-groups/g-json/subscription"),
    ("POST", "/api/v1/consumer-groups/g-json/queues/q-json/seek"),
    ("POST", "/api/v1/resources/kv/list"), ("POST", "/api/v1/stats/refresh"),
    ("POST", "/api/v1/traces"), ("POST", "/api/v1/system/spool/quarantine/x/replay"),
    ("POST", "/api/v1/fetch"), ("POST", "/api/v1/partitions/changed"),
    ("POST", "/api/v1/system/spools/s-json/release"), ("POST", "/streams/v1/queries"),
    ("POST", "/streams/v1/cycle"), ("POST", "/streams/v1/state/get"),
    ("POST", "/api/v1/system/maintenance"), ("POST", "/api/v1/system/maintenance/pop"),
    ("POST", "/api/v1/timers"),
]


@pytest.fixture(scope="module")
def url(module_broker_factory) -> str:
    return module_broker_factory().url


def is_json(raw: bytes) -> bool:
    if not raw.strip():
        return True  # an empty body reads as {}
    try:
        ujson.loads(raw)
    except (ValueError, TypeError):
        return False
    return True


NOT_JSON_BODIES = st.one_of(st.binary(max_size=64), st.text(max_size=40).map(str.encode)).filter(
    lambda raw: not is_json(raw))
NOT_OBJECTS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
                        allow_infinity=False), st.text(max_size=20),
                        st.lists(st.integers(), max_size=3))


def answer(url: str, method: str, path: str, body: bytes) -> httpx.Response:
    return httpx.request(method, url + path, content=body, timeout=30,
                         headers={"content-type": "application/json"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=NOT_JSON_BODIES)
@example(route=("POST", "/api/v1/push"), body=b"not json")
@example(route=("POST", "/api/v1/push"), body=b'{"items": [')
def test_a_body_that_is_not_json_is_a_400_saying_so(url, route, body):
    r = answer(url, *route, body)
    assert r.status_code == 400, (route, body, r.status_code, r.text)
    assert r.json() == {"error": NOT_JSON}, (route, body, r.text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), value=NOT_OBJECTS)
def test_a_json_body_that_is_not_an_object_is_never_a_500(url, route, value):
    r = answer(url, *route, json.dumps(value).encode())
    assert r.status_code < 500, (route, value, r.status_code, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error, str) and error, (route, value, r.text)
