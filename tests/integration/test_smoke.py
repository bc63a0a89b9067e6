"""The broker process starts on a real PostgreSQL and answers /health."""


def test_health_reports_connected_database(http):
    r = http.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "healthy"
    assert body["database"] == "connected"
    assert body["version"] == body["brokerVersion"]
