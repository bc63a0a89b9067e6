"""JWT roles on the state surfaces: reads (fetch, partitions/changed, kv reads,
lock get, timer peek/list) need READ_ONLY; anything that writes (a kv batch with a write,
a lock acquire/renew/release, timers) needs READ_WRITE, and a refused call changed nothing."""
from __future__ import annotations

import httpx
import pytest

from tests.integration.test_auth import AUDIENCE, ISSUER, RO, RW, SECRET, auth

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def jwt_broker(module_broker_factory):
    return module_broker_factory(JWT_ENABLED="true", JWT_ALGORITHM="HS256", JWT_SECRET=SECRET,
                          JWT_ISSUER=ISSUER, JWT_AUDIENCE=AUDIENCE)


@pytest.fixture
def c(jwt_broker):
    with httpx.Client(base_url=jwt_broker.url, timeout=30) as client:
        yield client


READS = [
    ("POST", "/api/v1/fetch", {"entries": [{"queue": "q-auth", "partition": "Default"}]}),
    ("POST", "/api/v1/partitions/changed", {"entries": [{"queue": "q-auth"}]}),
    ("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "auth", "key": "k"}]}),
    ("POST", "/api/v1/locks", {"operations": [{"op": "get", "name": "auth-lock"}]}),
    ("GET", "/api/v1/timers/q-auth/k", None),
    ("GET", "/api/v1/timers/q-auth", None),
    # the operator views (the key listing is a POST: its cursor is a key)
    ("GET", "/api/v1/resources/kv/namespaces", None),
    ("POST", "/api/v1/resources/kv/list", {"namespace": "auth"}),
    ("GET", "/api/v1/resources/locks", None),
    ("GET", "/api/v1/resources/timers", None),
]
WRITES = [
    ("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "auth", "key": "k"},
                                           {"op": "put", "ns": "auth", "key": "k",
                                            "value": 1, "forever": True}]}),
    ("PUT", "/api/v1/kv/auth/k", {"value": 1, "forever": True}),
    ("POST", "/api/v1/locks", {"operations": [{"op": "acquire", "name": "auth-lock",
                                               "ttlSeconds": 30}]}),
    ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q-auth",
                                                "timerKey": "k", "payload": "MQ==",
                                                "delayMs": 60000}]}),
]


@pytest.mark.parametrize("method,path,body", READS)
def test_reads_need_read_only(c, method, path, body):
    assert c.request(method, path, json=body).status_code == 401
    r = c.request(method, path, json=body, headers=auth(RO))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path,body", WRITES)
def test_writes_need_read_write(c, method, path, body):
    assert c.request(method, path, json=body, headers=auth(RO)).status_code == 403
    # nothing was written by the refused call
    kv = c.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "auth", "key": "k"}]},
                headers=auth(RO)).json()["results"][0]
    assert kv["found"] is False
    lock = c.post("/api/v1/locks", json={"operations": [{"op": "get", "name": "auth-lock"}]},
                  headers=auth(RO)).json()["results"][0]
    assert lock["held"] is False
    assert c.get("/api/v1/timers/q-auth/k", headers=auth(RO)).json()["found"] is False


def test_read_write_may_write(c):
    r = c.post("/api/v1/kv", json={"operations": [{"op": "put", "ns": "auth-rw", "key": "k",
                                                   "value": 1, "forever": True}]},
               headers=auth(RW))
    assert r.status_code == 200 and r.json()["results"][0]["applied"] is True
