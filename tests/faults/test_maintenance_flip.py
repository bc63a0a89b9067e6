"""A maintenance flip that cannot be stored answers 503 and changes nothing:
the database holds the flag, and a broker that flipped only its
own mirror would be reverted by its own reconcile loop after answering
"ENABLED"."""
from __future__ import annotations

import httpx

from tests.conftest import start_broker
from tests.faults.test_maintenance_and_outage import db  # noqa: F401


def test_a_flip_that_cannot_be_stored_is_a_503_and_changes_nothing(db, tmp_path):  # noqa: F811
    b = start_broker(db, tmp_path, DB_CONNECTION_TIMEOUT="500")
    try:
        db.embedded.stop(mode="immediate")
        try:
            for route in ("/api/v1/system/maintenance", "/api/v1/system/maintenance/pop"):
                r = httpx.post(b.url + route, json={"enabled": True}, timeout=10)
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            # the mirror is what pushes and pops obey: still off
            r = httpx.post(b.url + "/api/v1/push", timeout=10, json={"items": [
                {"queue": "flip-check", "payload": 1}]})
            assert r.status_code == 201 and r.json()[0]["status"] == "buffered"  # outage spool
            metrics = httpx.get(b.url + "/metrics", timeout=10).json()
            assert metrics["maintenanceMode"] is False and metrics["popMaintenanceMode"] is False
        finally:
            db.embedded.start()
        r = httpx.get(b.url + "/api/v1/system/maintenance", timeout=10).json()
        assert r["maintenanceMode"] is False and r["popMaintenanceMode"] is False
    finally:
        b.stop()
