"""The broker's log as an operator reads it: with LOG_FORMAT=json every line (the broker's
and Sanic's) is one JSON object with time, level, message and context; ACCESS_LOG adds one
line per request with method, path, status, duration and the JWT subject; a mistyped
variable is warned about at start."""
from __future__ import annotations

import json

import httpx
import jwt

from tests.conftest import start_broker
from tests.waiting import wait_until

SECRET = "log-test-secret-of-at-least-32-bytes!!"


def test_json_lines_access_log_and_mistyped_variables(database, tmp_path):
    broker = start_broker(database, tmp_path, LOG_FORMAT="json", ACCESS_LOG="true",
                          JWT_ENABLED="true", JWT_SECRET=SECRET, QUEEN_MESH_PEER="10.0.0.9",
                          QUEEN_NOT_A_THING="1")
    try:
        token = jwt.encode({"sub": "ops-alice", "role": "read-only"}, SECRET, algorithm="HS256")
        r = httpx.get(broker.url + "/api/v1/resources/queues", timeout=10,
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        assert httpx.get(broker.url + "/api/v1/resources/queues", timeout=10).status_code == 401
        # A valid token whose role is too low: refused, and the line says whose it was.
        r = httpx.post(broker.url + "/api/v1/push", timeout=10, json={"items": []},
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403
        wait_until(lambda: broker.log().count('"access":true') >= 4, 10, "the access lines")
    finally:
        broker.stop()
    lines = [json.loads(line) for line in broker.log().splitlines() if line.strip()]
    for line in lines:
        assert {"time", "level", "message", "logger", "context"} <= set(line), line
        assert line["time"].endswith("Z")
    assert any(line["logger"].startswith("sanic") for line in lines)  # Sanic's lines too
    access = [line["context"] for line in lines if line["context"].get("access")]
    ok = [a for a in access if a["path"] == "/api/v1/resources/queues" and a["status"] == 200]
    assert ok and ok[0]["method"] == "GET" and ok[0]["subject"] == "ops-alice"
    assert isinstance(ok[0]["duration_ms"], float)
    refused = [a for a in access if a["status"] == 401]
    assert refused and refused[0]["subject"] is None
    forbidden = [a for a in access if a["status"] == 403]
    assert forbidden and forbidden[0]["subject"] == "ops-alice", forbidden
    warnings = [line["message"] for line in lines if line["level"] == "WARNING"]
    assert any("QUEEN_MESH_PEER " in w and "did you mean QUEEN_MESH_PEERS" in w
               for w in warnings), warnings
    assert any("QUEEN_NOT_A_THING" in w for w in warnings), warnings
