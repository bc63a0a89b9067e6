"""The operator's view of the streaming queries (GET /api/v1/status/streams and
/api/v1/status/streams/<name>, the stream figures of /metrics/prometheus) against a real
broker with real queries and cycles, checked against what PostgreSQL holds; and the cycle
as one round trip: seen on the wire between the broker and PostgreSQL."""
from __future__ import annotations

import datetime as dt
import uuid

import httpx
import pytest

from tests.conftest import Database, db_val, start_broker
from tests.integration.test_streams_routes import cycle_body, pop, push, register
from tests.pg_wire import PgWireRelay
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def _popped_shard(http: httpx.Client, query: dict, source: str, sink: str, partition: str,
                  n: int) -> dict:
    push(http, source, partition, [{"n": i} for i in range(n)])
    group = "streams." + query["name"]
    msgs = pop(http, source, group)
    assert len(msgs) == n
    return {"query_id": query["query_id"], "source": source, "sink": sink, "group": group,
            "msgs": msgs, "partition_id": msgs[0]["partitionId"]}


def _ops(*keys: str) -> list[dict]:
    return [{"type": "upsert", "key": k, "value": {"acc": len(k), "pad": "x" * 50}} for k in keys]


def _stored_bytes(database, query_id: str) -> int:
    return db_val(database, """SELECT coalesce(sum(pg_column_size(value)), 0)
        FROM queen_streams.state WHERE query_id = $1""", uuid.UUID(query_id))


@pytest.fixture
def two_shards(http, queue_name):
    """One query over a source with two partitions; three state rows on p1, one on p2,
    one committed cycle on each, then a refused cycle and a replayed one (neither counts)."""
    source, sink = queue_name, queue_name + "-sink"
    query = register(http, "status-" + queue_name, source, sink=sink).json()
    a = _popped_shard(http, query, source, sink, "p1", 2)
    ok = http.post("/streams/v1/cycle", json=cycle_body(a, state_ops=_ops("a1", "a2", "a3")))
    assert ok.json()["success"] is True, ok.text
    b = _popped_shard(http, query, source, sink, "p2", 1)
    refused = http.post("/streams/v1/cycle", json=cycle_body(b, lease_id=str(uuid.uuid4())))
    assert refused.json()["success"] is False
    assert http.post("/streams/v1/cycle", json=cycle_body(
        b, state_ops=_ops("b1"))).json()["success"] is True
    replayed = http.post("/streams/v1/cycle", json=cycle_body(b, state_ops=_ops("b9")))
    assert replayed.json()["already_committed"] is True
    return {"query": query, "a": a, "b": b, "source": source}


def test_status_lists_each_query_with_its_state_size_and_cycles(http, database, two_shards):
    """Rows, stored bytes and partitions as PostgreSQL holds them; committed cycles only
    (the refused and the replayed cycle are not counted); the newest cycle's time."""
    before = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    r = http.get("/api/v1/status/streams")
    assert r.status_code == 200, r.text
    body = r.json()
    name = two_shards["query"]["name"]
    [mine] = [q for q in body["queries"] if q["name"] == name]
    assert mine["queryId"] == two_shards["query"]["query_id"]
    assert mine["sourceQueue"] == two_shards["source"]
    assert mine["sinkQueue"] == two_shards["source"] + "-sink"
    assert mine["state"]["rows"] == 4
    assert mine["state"]["partitions"] == 2
    assert mine["state"]["bytes"] == _stored_bytes(database, mine["queryId"]) > 0
    assert mine["cycles"]["committed"] == 2 and mine["cycles"]["partitions"] == 2
    last = dt.datetime.fromisoformat(mine["cycles"]["lastCycleAt"])
    assert before < last <= dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    assert dt.datetime.fromisoformat(mine["state"]["lastUpdateAt"]) <= last
    totals = body["totals"]
    assert totals["queries"] == len(body["queries"])
    assert totals["stateRows"] == sum(q["state"]["rows"] for q in body["queries"])
    assert totals["stateBytes"] == sum(q["state"]["bytes"] for q in body["queries"])
    assert totals["cycles"] == sum(q["cycles"]["committed"] for q in body["queries"])


def test_status_of_one_query_breaks_it_down_per_partition(http, database, two_shards):
    name = two_shards["query"]["name"]
    r = http.get(f"/api/v1/status/streams/{name}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["query"]["name"] == name and body["query"]["state"]["rows"] == 4
    parts = body["partitions"]
    assert [p["partition"] for p in parts] == ["p1", "p2"]  # largest state first
    assert [p["partitionId"] for p in parts] == [two_shards["a"]["partition_id"],
                                                 two_shards["b"]["partition_id"]]
    assert {p["queue"] for p in parts} == {two_shards["source"]}
    assert [p["state"]["rows"] for p in parts] == [3, 1]
    assert [p["cycles"]["committed"] for p in parts] == [1, 1]
    assert sum(p["state"]["bytes"] for p in parts) == body["query"]["state"]["bytes"]
    limited = http.get(f"/api/v1/status/streams/{name}", params={"limit": 1}).json()
    assert [p["partition"] for p in limited["partitions"]] == ["p1"]


def test_status_of_an_unknown_query_is_404_and_bad_input_400(http):
    r = http.get(f"/api/v1/status/streams/nope-{uuid.uuid4().hex}")
    assert r.status_code == 404 and "no query" in r.json()["error"]
    assert http.get("/api/v1/status/streams/" + "x" * 300).status_code == 400
    assert http.get("/api/v1/status/streams/x", params={"limit": "many"}).status_code == 400


def test_deleting_a_query_removes_it_from_the_status(http, two_shards):
    name = two_shards["query"]["name"]
    assert http.delete(f"/streams/v1/queries/{name}").status_code == 200
    assert name not in [q["name"] for q in http.get("/api/v1/status/streams").json()["queries"]]
    assert http.get(f"/api/v1/status/streams/{name}").status_code == 404


def test_stream_figures_in_prometheus(http, two_shards):
    """Per query: state rows, bytes, partitions with state and with cycles, committed
    cycles, the newest cycle's time; this broker's cycle statement durations."""
    name = two_shards["query"]["name"]
    status = http.get(f"/api/v1/status/streams/{name}").json()["query"]
    lines = http.get("/metrics/prometheus").text.splitlines()

    def sample(metric: str) -> float:
        head = f'{metric}{{query="{name}"}} '
        [line] = [x for x in lines if x.startswith(head)]
        return float(line[len(head):])

    assert sample("queen_stream_state_rows") == 4
    assert sample("queen_stream_state_bytes") == status["state"]["bytes"]
    assert sample("queen_stream_state_partitions") == 2
    assert sample("queen_stream_cycle_partitions") == 2
    assert sample("queen_stream_query_cycles_total") == 2
    last = dt.datetime.fromisoformat(status["cycles"]["lastCycleAt"]).timestamp()
    assert abs(sample("queen_stream_last_cycle_timestamp_seconds") - last) < 0.002
    [count] = [x for x in lines if x.startswith("queen_stream_cycle_duration_seconds_count ")]
    assert float(count.split()[1]) >= 2


# -- one round trip -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def relayed_broker(database, tmp_path_factory):
    """A broker whose PostgreSQL connections run through a PgWireRelay."""
    relay = PgWireRelay(database.host, database.port)
    via = Database("127.0.0.1", relay.port, database.user, database.password, database.db)
    broker = start_broker(via, tmp_path_factory.mktemp("relayed"))
    try:
        yield broker, relay
    finally:
        broker.stop()
        relay.close()


def test_a_cycle_is_one_round_trip_and_its_own_transaction(relayed_broker, database,
                                                          queue_name):
    """Every cycle (state ops + sink push + source ack) is one statement in one round trip,
    sent outside any transaction and answered idle: it committed by itself, all of it in
    that round trip. Five cycles, on two partitions, are five such round trips."""
    broker, relay = relayed_broker
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        source, sink = queue_name, queue_name + "-sink"
        query = register(http, "wire-" + queue_name, source, sink=sink).json()
        seen = len(relay.trips)
        for n in range(5):
            shard = _popped_shard(http, query, source, sink, f"p{n % 2}", 2)
            r = http.post("/streams/v1/cycle", json=cycle_body(shard, state_ops=_ops(f"k{n}")))
            assert r.json()["success"] is True, r.text
        wait_until(lambda: all(t.status_after for t in relay.trips[seen:]), 10,
                   "every round trip answered")
    cycles = [t for t in relay.trips[seen:]
              if any("queen_streams.cycle" in sql for sql in t.executed)]
    assert len(cycles) == 5, [t.executed for t in cycles]
    for trip in cycles:
        assert len(trip.executed) == 1, trip.executed
        assert (trip.status_before, trip.status_after) == ("I", "I"), trip
    # and what the five round trips committed is all there
    assert db_val(database, "SELECT count(*) FROM queen_streams.state WHERE query_id = $1",
                  uuid.UUID(query["query_id"])) == 5
    assert db_val(database, """SELECT count(*) FROM queen.messages m JOIN queen.partitions p
        ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1""", sink) == 5
