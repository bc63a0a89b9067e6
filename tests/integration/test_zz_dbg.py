import httpx, uuid
def test_x(http):
    q = f"test-{uuid.uuid4().hex[:8]} sp"
    print(http.post("/api/v1/push", json={"items":[{"queue":q,"payload":1}]}).json())
    r = http.get(f"/api/v1/pop/queue/{q.replace(' ','%20')}", params={"wait":"false"})
    print(r.request.url, r.json())
    r = http.get(f"/api/v1/resources/queues/{q.replace(' ','%20')}")
    print(r.json())
    r = http.get(f"/api/v1/pop/queue/{q.replace(' ','%20')}/partition/Default", params={"wait":"false"})
    print(r.json())
