"""Every route that takes a JSON body parses it in one place, broker/http/responses.py's
read_json, so that a body that is not JSON is one clear 400 on each (tests/integration/
test_not_json_bodies.py asks the routes). A module of broker/http that decodes JSON itself
is listed here with why."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules of broker/http that decode JSON that is not a request's JSON body.
OWN_DECODERS = {
    "broker/http/responses.py": "read_json itself",
    "broker/http/wire/push_binary.py": "payloads inside the binary push frames",
    "broker/http/wire/timers.py": "a timer's base64 payload, inside a JSON body already read",
}
DECODES = re.compile(r"\b(?:u?json|orjson)\.loads\(|\brequest\.(?:json|load_json)\b")


def test_only_read_json_decodes_request_bodies():
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "broker" / "http").rglob("*.py")
             if DECODES.search(p.read_text())}
    assert found == set(OWN_DECODERS)


def test_the_check_sees_a_route_that_decodes_its_body():
    assert DECODES.search("    body = ujson.loads(request.body)")
    assert DECODES.search("    body = request.json")
    assert not DECODES.search("    body = read_json(request)")
