"""The JSON routes the dashboard reads (broker/http/routes/ops/browse.py, live.py, dashboard.py),
through HTTP on the shared broker: pages are bounded and counted, searches run in the
database, the throughput series counts what was pushed, bad parameters are 400s."""
from __future__ import annotations

import datetime as dt
import uuid

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.waiting import wait_until


def unique(prefix: str = "dash") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def push(http: httpx.Client, queue: str, partitions: list[str], per_partition: int = 1) -> list:
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": p, "payload": {"i": i}}
        for p in partitions for i in range(per_partition)]})
    assert r.status_code in (200, 201), r.text
    return r.json()


def test_queue_pages_are_bounded_counted_and_searched_in_the_database(http):
    stem = unique("pg")
    names = [f"{stem}-{c}" for c in "abc"]
    for n in names:
        push(http, n, ["Default"])
    body = http.get("/api/v1/browse/queues", params={"search": stem.upper()}).json()
    assert [q["name"] for q in body["queues"]] == names and body["total"] == 3
    first = http.get("/api/v1/browse/queues", params={"search": stem, "limit": 2}).json()
    rest = http.get("/api/v1/browse/queues",
                    params={"search": stem, "limit": 2, "offset": 2}).json()
    assert [q["name"] for q in first["queues"] + rest["queues"]] == names
    assert first["total"] == rest["total"] == 3
    past = http.get("/api/v1/browse/queues", params={"search": stem, "offset": 10}).json()
    assert past["queues"] == [] and past["total"] == 3
    assert first["queues"][0]["partitions"] == 1


def test_page_parameters_are_clamped_and_garbage_is_400(http):
    """Out-of-range numbers are clamped (like every paged route of the broker), so no
    answer is larger than 500 rows; what is not a number, or too long, is a 400."""
    assert http.get("/api/v1/browse/queues", params={"limit": 0}).json()["pagination"] == \
        {"limit": 1, "offset": 0}
    assert http.get("/api/v1/browse/queues",
                    params={"limit": 10**6}).json()["pagination"]["limit"] == 500
    for params in ({"limit": "x"}, {"offset": "1.5"}, {"search": "x" * 1000},
                   {"search": "a\x00b"}):
        r = http.get("/api/v1/browse/queues", params=params)
        assert r.status_code == 400, (params, r.text)
    assert len(http.get("/api/v1/live/throughput", params={"seconds": 10**6}).json()["t"]) == 900
    assert http.get("/api/v1/browse/queues/q/partitions/p/messages",
                    params={"from": "yesterday"}).status_code == 400


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(search=st.text(max_size=40))
def test_any_search_text_is_a_page_or_a_400_never_a_500(http, search):
    r = http.get("/api/v1/browse/queues", params={"search": search, "limit": 5})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200 and search.strip() and search.isascii():
        for q in r.json()["queues"]:
            text = " ".join(filter(None, (q["name"], q["namespace"], q["task"]))).lower()
            assert search.lower() in text


def test_partition_pages_of_a_queue(http):
    q = unique("parts")
    push(http, q, [f"part-{i}" for i in range(7)], per_partition=2)
    page = http.get(f"/api/v1/browse/queues/{q}/partitions",
                    params={"limit": 3, "offset": 3}).json()
    assert [p["name"] for p in page["partitions"]] == ["part-3", "part-4", "part-5"]
    assert page["total"] == 7
    assert {p["messages"]["pending"] for p in page["partitions"]} == {2}
    one = http.get(f"/api/v1/browse/queues/{q}/partitions", params={"search": "PART-6"}).json()
    assert [p["name"] for p in one["partitions"]] == ["part-6"] and one["total"] == 1
    assert http.get(f"/api/v1/browse/queues/{unique()}/partitions").status_code == 404
    header = http.get(f"/api/v1/browse/queues/{q}").json()
    assert header["options"]["retryLimit"] == 3
    assert {o["name"] for o in header["supportedOptions"]} == set(header["options"])


def test_partition_messages_from_a_position_or_a_time(http):
    q = unique("msgs")
    push(http, q, ["Default"], per_partition=5)
    url = f"/api/v1/browse/queues/{q}/partitions/Default/messages"
    page = http.get(url, params={"fromPosition": 2, "limit": 2}).json()
    assert [m["position"] for m in page["messages"]] == [2, 3] and page["next"] == 4
    tail = http.get(url, params={"fromPosition": page["next"]}).json()
    assert [m["position"] for m in tail["messages"]] == [4, 5] and tail["next"] is None
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert http.get(url, params={"from": later}).json()["messages"] == []
    earlier = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    assert len(http.get(url, params={"from": earlier}).json()["messages"]) == 5


def test_throughput_series_counts_the_pushes_and_pops(http):
    before = http.get("/api/v1/live/throughput").json()
    q = unique("tp")
    push(http, q, ["Default"], per_partition=7)
    r = http.get(f"/api/v1/pop/queue/{q}", params={"batch": 3, "wait": "false"})
    assert len(r.json()["messages"]) == 3
    after = wait_until(lambda: (lambda b: b if b["sums"]["pushed"] >= before["sums"]["pushed"] + 7
                                and b["sums"]["popped"] >= before["sums"]["popped"] + 3 else None)(
        http.get("/api/v1/live/throughput").json()), 10, "7 pushes and 3 pops counted")
    assert len(after["t"]) == len(after["pushed"]) == 900
    assert all(b - a == 1 for a, b in zip(after["t"], after["t"][1:]))
    assert after["sinceStart"]["pushed"] >= after["sums"]["pushed"]
    short = http.get("/api/v1/live/throughput", params={"seconds": 60}).json()
    assert len(short["t"]) == 60


def test_cluster_view(http):
    body = http.get("/api/v1/live/cluster").json()
    assert body["maintenance"] == {"push": False, "pop": False} or \
        isinstance(body["maintenance"]["push"], bool)
    assert body["database"] == "connected"
    assert {"pending", "quarantined"} <= set(body["spool"])
    assert {j["job"] for j in body["jobs"]} == {"retention", "stats", "metrics"}


def test_group_pages_put_the_furthest_behind_first(http):
    q, group = unique("grp"), unique("g")
    push(http, q, ["slow", "fast"], per_partition=3)
    for _ in range(2):
        r = http.get(f"/api/v1/pop/queue/{q}/partition/fast",
                     params={"batch": 3, "wait": "false", "consumerGroup": group})
        for m in r.json().get("messages", []):
            http.post("/api/v1/ack", json={"transactionId": m["transactionId"],
                                           "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                                           "status": "completed", "consumerGroup": group})
    http.get(f"/api/v1/pop/queue/{q}/partition/slow",
             params={"batch": 1, "wait": "false", "consumerGroup": group})
    lag = http.get(f"/api/v1/browse/consumer-groups/{group}/queues/{q}").json()
    assert [p["partition"] for p in lag["partitions"]] == ["slow", "fast"]
    assert [p["offsetLag"] for p in lag["partitions"]] == [3, 0]
    pairs = http.get("/api/v1/browse/consumer-groups", params={"search": group}).json()
    assert pairs["total"] == 1
    assert pairs["groups"][0]["positionsBehind"] == 3
    assert pairs["groups"][0]["partitionsBehind"] == 1


def test_dashboard_files_and_session(http):
    for path in ("/", "/dashboard"):
        r = http.get(path)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        assert '<script type="module" src="/dashboard/js/main.js">' in r.text
    assert http.head("/").status_code == 200
    js = http.get("/dashboard/js/main.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert http.get("/dashboard/vendor/uPlot.LICENSE.txt").status_code == 200
    for bad in ("/dashboard/../app.py", "/dashboard/%2e%2e/app.py", "/dashboard/nope.js"):
        assert http.get(bad).status_code == 404, bad
    s = http.get("/api/v1/auth/session").json()
    assert s["authEnabled"] is False and s["level"] == "ADMIN" and all(s["can"].values())
