"""The /streams/v1 routes at the HTTP level, against a real broker on a real PostgreSQL:
query registration (idempotent, 409 on a changed config, reset), the cycle's
all-or-nothing commit (state ops + sink pushes + source ack in one transaction), its
errors, state reads, and bad input (a 4xx that changes nothing; hypothesis drives the
body parsers). What was stored is read back with SQL; nothing is mocked."""
from __future__ import annotations

import uuid

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import db_val

pytestmark = pytest.mark.timeout(120)


def register(http: httpx.Client, name: str, source: str, config_hash: str = "h1",
             sink: str | None = None, reset: bool = False) -> httpx.Response:
    body = {"name": name, "source_queue": source, "config_hash": config_hash, "reset": reset}
    if sink:
        body["sink_queue"] = sink
    return http.post("/streams/v1/queries", json=body)


def push(http: httpx.Client, queue: str, partition: str, payloads: list) -> list[dict]:
    r = http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "payload": p} for p in payloads]})
    assert r.status_code in (200, 201), r.text
    return r.json()


def pop(http: httpx.Client, queue: str, group: str, batch: int = 10) -> list[dict]:
    r = http.get(f"/api/v1/pop/queue/{queue}",
                 params={"consumerGroup": group, "batch": batch, "wait": "false"})
    assert r.status_code in (200, 204), r.text
    return r.json()["messages"] if r.status_code == 200 else []


def state(http: httpx.Client, query_id: str, partition_id: str, keys=None, **extra) -> dict:
    r = http.post("/streams/v1/state/get", json={"query_id": query_id,
                                                 "partition_id": partition_id,
                                                 "keys": keys or [], **extra})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True
    return {row["key"]: row["value"] for row in body["rows"]}


def sink_count(database, queue: str) -> int:
    return db_val(database, """SELECT count(*) FROM queen.messages m
        JOIN queen.partitions p ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1""", queue) or 0


def cursor(database, partition_id: str, group: str) -> int:
    return db_val(database, """SELECT cursor_seq FROM queen.log_consumers
        WHERE partition_id = $1 AND consumer_group = $2""", uuid.UUID(partition_id), group) or 0


@pytest.fixture
def shard(http, queue_name):
    """A registered query over a source queue with two popped (leased) messages."""
    source, sink = queue_name, queue_name + "-sink"
    q = register(http, "q-" + queue_name, source, sink=sink).json()
    push(http, source, "p1", [{"n": 1}, {"n": 2}])
    group = "streams." + q["name"]
    msgs = pop(http, source, group)
    assert len(msgs) == 2
    return {"query_id": q["query_id"], "source": source, "sink": sink, "group": group,
            "msgs": msgs, "partition_id": msgs[0]["partitionId"]}


def cycle_body(shard: dict, lease_id: str | None = None, **over) -> dict:
    last = shard["msgs"][-1]
    body = {"query_id": shard["query_id"], "partition_id": shard["partition_id"],
            "consumer_group": shard["group"],
            "state_ops": [{"type": "upsert", "key": "k1", "value": {"acc": 3}}],
            "push_items": [{"queue": shard["sink"], "partition": "p1", "payload": {"sum": 3}}],
            "ack": {"transactionId": last["transactionId"],
                    "leaseId": lease_id or last["leaseId"], "status": "completed", "count": 2}}
    body.update(over)
    return body


# -- queries ------------------------------------------------------------------------------

def test_register_is_idempotent_per_name(http, queue_name):
    """The same name and hash answer the same query_id, fresh only the first time."""
    first = register(http, "idem-" + queue_name, queue_name).json()
    again = register(http, "idem-" + queue_name, queue_name).json()
    assert first["success"] and again["success"]
    assert first["fresh"] is True and again["fresh"] is False
    assert first["query_id"] == again["query_id"]
    assert again["config_hash"] == "h1" and again["reset"] is False
    uuid.UUID(first["query_id"])


def test_changed_config_without_reset_is_409_and_reset_deletes_state(http, shard):
    """Another config_hash: 409 and nothing changes; with reset: the state is deleted and the
    new hash is the query's from then on."""
    name = "q-" + shard["source"]
    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    assert state(http, shard["query_id"], shard["partition_id"]) == {"k1": {"acc": 3}}

    r = register(http, name, shard["source"], config_hash="h2")
    assert r.status_code == 409
    assert r.json()["success"] is False and "config_hash" in r.json()["error"]
    assert state(http, shard["query_id"], shard["partition_id"]) == {"k1": {"acc": 3}}

    r = register(http, name, shard["source"], config_hash="h2", reset=True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["reset"] is True and body["fresh"] is False
    assert body["query_id"] == shard["query_id"] and body["config_hash"] == "h2"
    assert state(http, shard["query_id"], shard["partition_id"]) == {}
    # the new hash took over: registering it again is plain idempotence
    assert register(http, name, shard["source"], config_hash="h2").json()["reset"] is False
    assert register(http, name, shard["source"], config_hash="h1").status_code == 409


def test_delete_query_deletes_its_state(http, database, shard):
    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    name = "q-" + shard["source"]
    listed = {q["name"]: q for q in http.get("/streams/v1/queries").json()["queries"]}
    assert listed[name]["state"]["rows"] == 1 and listed[name]["state"]["bytes"] > 0
    r = http.delete(f"/streams/v1/queries/{name}")
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert db_val(database, "SELECT count(*) FROM queen_streams.state WHERE query_id = $1",
                  uuid.UUID(shard["query_id"])) == 0
    assert http.delete(f"/streams/v1/queries/{name}").status_code == 404


def test_deleting_the_source_queue_deletes_its_stream_state(http, database, shard):
    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    r = http.delete(f"/api/v1/resources/queues/{shard['source']}")
    assert r.status_code == 200, r.text
    assert db_val(database, "SELECT count(*) FROM queen_streams.state WHERE query_id = $1",
                  uuid.UUID(shard["query_id"])) == 0


# -- cycle --------------------------------------------------------------------------------

def test_cycle_commits_state_sink_and_ack_together(http, database, shard):
    """One cycle: the state row, the sink message and the cursor move are all there, and the
    lease is released (the partition can be popped again at once)."""
    r = http.post("/streams/v1/cycle", json=cycle_body(shard))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["state_ops_applied"] == 1
    assert body["query_id"] == shard["query_id"] and body["partition_id"] == shard["partition_id"]
    [pushed] = body["push_results"]
    assert pushed["queueName"] == shard["sink"] and uuid.UUID(pushed["messageId"])
    assert body["ack_result"] == {"success": True, "lease_released": True, "dlq": False}
    assert state(http, shard["query_id"], shard["partition_id"]) == {"k1": {"acc": 3}}
    assert sink_count(database, shard["sink"]) == 1
    assert cursor(database, shard["partition_id"], shard["group"]) == 2
    push(http, shard["source"], "p1", [{"n": 3}])
    assert [m["data"] for m in pop(http, shard["source"], shard["group"])] == [{"n": 3}]


def test_a_wrong_lease_rolls_the_whole_cycle_back(http, database, shard):
    """The ack fails the lease check: no state row, no sink message, no cursor move; the
    answer is success:false with the reason. The same cycle with the real lease commits."""
    r = http.post("/streams/v1/cycle", json=cycle_body(shard, lease_id=str(uuid.uuid4())))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is False and "lease" in body["error"].lower()
    assert state(http, shard["query_id"], shard["partition_id"]) == {}
    assert sink_count(database, shard["sink"]) == 0
    assert cursor(database, shard["partition_id"], shard["group"]) == 0

    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    assert sink_count(database, shard["sink"]) == 1


def test_a_retried_cycle_commits_nothing_twice(http, database, shard):
    """A cycle sent again after it committed (its answer lost) is recognised by its ack: it
    answers success and writes nothing more (no second sink message, state as before)."""
    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    again = cycle_body(shard, state_ops=[{"type": "upsert", "key": "k1", "value": {"acc": 99}}])
    r = http.post("/streams/v1/cycle", json=again)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert r.json()["ack_result"]["already_acknowledged"] is True
    assert r.json()["already_committed"] is True
    assert sink_count(database, shard["sink"]) == 1
    assert state(http, shard["query_id"], shard["partition_id"]) == {"k1": {"acc": 3}}


def test_an_ack_of_part_of_the_batch_acknowledges_the_whole_batch(http, database, shard):
    """With release_lease (the default) a cycle stands for everything its lease handed out on
    the partition: acking the first message moves the cursor past both and frees the lease."""
    first = shard["msgs"][0]
    body = cycle_body(shard, ack={"transactionId": first["transactionId"],
                                  "leaseId": first["leaseId"], "status": "completed"})
    assert http.post("/streams/v1/cycle", json=body).json()["ack_result"]["lease_released"]
    assert cursor(database, shard["partition_id"], shard["group"]) == 2


def test_release_lease_false_keeps_the_lease_on_a_partial_ack(http, database, shard):
    """The gate operator's partial ack: the cursor moves to the acked message only and the
    lease stays (the tail is redelivered to the lease holder's successor, in order)."""
    first = shard["msgs"][0]
    body = cycle_body(shard, release_lease=False,
                      ack={"transactionId": first["transactionId"],
                           "leaseId": first["leaseId"], "status": "completed"})
    r = http.post("/streams/v1/cycle", json=body).json()
    assert r["success"] is True and r["ack_result"]["lease_released"] is False
    assert cursor(database, shard["partition_id"], shard["group"]) == 1


def test_a_failed_ack_dead_letters_and_releases(http, database, shard):
    body = cycle_body(shard)
    body["ack"]["status"] = "failed"
    r = http.post("/streams/v1/cycle", json=body).json()
    assert r["success"] is True
    assert r["ack_result"] == {"success": True, "lease_released": True, "dlq": True}
    assert db_val(database, "SELECT count(*) FROM queen.dead_letter_queue WHERE partition_id = $1",
                  uuid.UUID(shard["partition_id"])) == 1


def test_cycle_without_ack_is_a_flush(http, database, shard):
    """An idle flush: state deletes and sink pushes, no source ack, the cursor stays. Sent
    again (its answer lost), it finds the rows it deletes gone and writes nothing more."""
    ops = [{"type": "upsert", "key": "w1", "value": {"acc": 5, "windowEnd": 1}},
           {"type": "upsert", "key": "w2", "value": {"acc": 6, "windowEnd": 2}}]
    assert http.post("/streams/v1/cycle", json=cycle_body(shard, ack=None, state_ops=ops,
                                                          push_items=[])).json()["success"]
    flush = cycle_body(shard, ack=None, state_ops=[{"type": "delete", "key": "w1"},
                                                   {"type": "delete", "key": "w2"}])
    r = http.post("/streams/v1/cycle", json=flush).json()
    assert r["success"] is True and r["ack_result"] is None and r["state_ops_applied"] == 2
    assert sink_count(database, shard["sink"]) == 1
    assert cursor(database, shard["partition_id"], shard["group"]) == 0
    assert state(http, shard["query_id"], shard["partition_id"]) == {}
    r = http.post("/streams/v1/cycle", json=flush).json()
    assert r["success"] is True and r["state_ops_applied"] == 0 and r["push_results"] == []
    assert sink_count(database, shard["sink"]) == 1


def test_state_ops_apply_in_order(http, shard):
    ops = [{"type": "upsert", "key": "a", "value": 1}, {"type": "delete", "key": "a"},
           {"type": "upsert", "key": "b", "value": 1}, {"type": "upsert", "key": "b", "value": 2},
           {"type": "delete", "key": "c"}, {"type": "upsert", "key": "c", "value": [3]}]
    r = http.post("/streams/v1/cycle", json=cycle_body(shard, state_ops=ops, ack=None)).json()
    assert r["state_ops_applied"] == 6
    assert state(http, shard["query_id"], shard["partition_id"]) == {"b": 2, "c": [3]}


def test_sink_pushes_to_an_encrypted_queue_are_encrypted(http, database, shard):
    """As in /api/v1/push: stored encrypted, popped as the original payload."""
    r = http.post("/api/v1/configure", json={"queue": shard["sink"],
                                             "options": {"encryptionEnabled": True}})
    assert r.status_code == 200, r.text
    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    assert db_val(database, """SELECT bool_and(m.is_encrypted) FROM queen.messages m
        JOIN queen.partitions p ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id
        WHERE q.name = $1""", shard["sink"]) is True
    assert [m["data"] for m in pop(http, shard["sink"], "reader")] == [{"sum": 3}]


def test_unknown_query_or_partition_is_404_and_changes_nothing(http, database, shard):
    r = http.post("/streams/v1/cycle", json=cycle_body(shard, query_id=str(uuid.uuid4())))
    assert r.status_code == 404 and r.json()["success"] is False
    r = http.post("/streams/v1/cycle", json=cycle_body(shard, partition_id=str(uuid.uuid4())))
    assert r.status_code == 404 and "partition" in r.json()["error"]
    assert sink_count(database, shard["sink"]) == 0
    assert cursor(database, shard["partition_id"], shard["group"]) == 0


@pytest.mark.parametrize("bad", [
    {"state_ops": [{"type": "merge", "key": "k", "value": 1}]},
    {"state_ops": [{"type": "upsert", "key": "", "value": 1}]},
    {"state_ops": [{"type": "upsert", "key": "k", "value": "x" * (1024 * 1024 + 1)}]},
    {"state_ops": [{"type": "upsert", "key": "k" * 1025, "value": 1}]},
    {"state_ops": [{"type": "upsert", "key": "k", "value": "nul\u0000"}]},
    {"state_ops": {"type": "upsert"}},
    {"push_items": [{"queue": "", "payload": 1}]},
    {"push_items": "x"},
    {"ack": {"transactionId": "", "status": "completed"}},
    {"ack": {"transactionId": "t", "status": "retry"}},
    {"ack": {"transactionId": "t", "leaseId": "not-a-uuid"}},
    {"ack": 5},
    {"release_lease": "yes"},
    {"consumer_group": 7},
    {"query_id": "nope"},
    {"partition_id": None},
])
def test_bad_cycle_is_400_and_changes_nothing(http, database, shard, bad):
    """A bad op type, an oversized or unstorable state value, a bad push item or ack: 400,
    and neither the state, the sink nor the cursor changed."""
    r = http.post("/streams/v1/cycle", json=cycle_body(shard, **bad))
    assert r.status_code == 400, r.text
    assert "error" in r.json()
    assert state(http, shard["query_id"], shard["partition_id"]) == {}
    assert sink_count(database, shard["sink"]) == 0
    assert cursor(database, shard["partition_id"], shard["group"]) == 0


# -- state/get ----------------------------------------------------------------------------

def test_state_get_filters(http, shard):
    """Empty keys: every row of the shard; named keys: those that exist (missing ones are
    absent); key_prefix and ripe_at_or_before (windowEnd at or before it) narrow it."""
    ops = [{"type": "upsert", "key": "tumb:1\u001fw1\u001fa", "value": {"acc": 1, "windowEnd": 100}},
           {"type": "upsert", "key": "tumb:1\u001fw2\u001fa", "value": {"acc": 2, "windowEnd": 200}},
           {"type": "upsert", "key": "__wm__", "value": {"eventTimeMs": 150}}]
    assert http.post("/streams/v1/cycle",
                     json=cycle_body(shard, state_ops=ops, ack=None)).json()["success"]
    qid, pid = shard["query_id"], shard["partition_id"]
    assert set(state(http, qid, pid)) == {o["key"] for o in ops}
    assert state(http, qid, pid, keys=["__wm__", "missing"]) == {"__wm__": {"eventTimeMs": 150}}
    assert set(state(http, qid, pid, key_prefix="tumb:1\u001f")) == {ops[0]["key"], ops[1]["key"]}
    assert set(state(http, qid, pid, key_prefix="tumb:1\u001f", ripe_at_or_before=150)) == {
        ops[0]["key"]}
    rows = http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid,
                                                    "keys": []}).json()["rows"]
    assert all(row["updated_at"].endswith("Z") for row in rows)
    # another shard and an unknown query read nothing
    assert state(http, qid, str(uuid.uuid4())) == {}
    assert state(http, str(uuid.uuid4()), pid) == {}


def test_concurrent_state_reads_all_answer(base_url, shard):
    """Reads folded into shared round trips each get their own shard's rows."""
    import asyncio

    async def run():
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as c:
            bodies = [{"query_id": shard["query_id"],
                       "partition_id": shard["partition_id"] if n % 2 else str(uuid.uuid4()),
                       "keys": []} for n in range(40)]
            return await asyncio.gather(*(c.post("/streams/v1/state/get", json=b)
                                          for b in bodies))
    with httpx.Client(base_url=base_url) as c:
        c.post("/streams/v1/cycle", json=cycle_body(shard, ack=None))
    answers = asyncio.run(run())
    for n, r in enumerate(answers):
        assert r.status_code == 200
        assert [row["key"] for row in r.json()["rows"]] == (["k1"] if n % 2 else [])


# -- hypothesis: the body parsers ---------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)

FIELDS = ["query_id", "partition_id", "consumer_group", "state_ops", "push_items", "ack",
          "release_lease", "keys", "key_prefix", "ripe_at_or_before", "name", "source_queue",
          "sink_queue", "config_hash", "reset"]


@pytest.fixture(scope="module")
def fuzz_shard(broker):
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        name = f"test-fuzz-{uuid.uuid4().hex[:8]}"
        q = register(http, "q-" + name, name, sink=name + "-sink").json()
        push(http, name, "p1", [{"n": 1}])
        msgs = pop(http, name, "streams.q-" + name)
        return {"query_id": q["query_id"], "source": name, "sink": name + "-sink",
                "group": "streams.q-" + name, "msgs": msgs, "partition_id": msgs[0]["partitionId"]}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(route=st.sampled_from(["/streams/v1/cycle", "/streams/v1/state/get",
                              "/streams/v1/queries"]),
       field=st.sampled_from(FIELDS), value=json_values, whole=st.booleans() | json_values)
def test_fuzzed_bodies_never_500_and_bad_ones_change_nothing(http, database, fuzz_shard, route,
                                                             field, value, whole):
    """A valid body with one field replaced by an arbitrary JSON value (or an arbitrary body):
    never a 5xx; a 4xx leaves state, sink and cursor as they were. The valid cycle's ack has a
    wrong lease, so even an accepted cycle commits nothing."""
    valid = {"/streams/v1/cycle": cycle_body(fuzz_shard, lease_id=str(uuid.uuid4())),
             "/streams/v1/state/get": {"query_id": fuzz_shard["query_id"],
                                       "partition_id": fuzz_shard["partition_id"], "keys": []},
             "/streams/v1/queries": {"name": "q-" + fuzz_shard["source"],
                                     "source_queue": fuzz_shard["source"],
                                     "config_hash": "h1"}}[route]
    # a cycle without its ack is a legitimate flush that commits; tested above
    assume(not (route == "/streams/v1/cycle" and field == "ack" and value is None))
    body = whole if not isinstance(whole, bool) else {**valid, field: value}
    if route == "/streams/v1/queries" and isinstance(body, dict) and body.get("reset") is True:
        body["reset"] = False  # a real reset is a legitimate change, tested above
    r = http.post(route, json=body)
    assert r.status_code < 500, r.text
    assert r.status_code in (200, 400, 404, 409, 413), r.text
    assert state(http, fuzz_shard["query_id"], fuzz_shard["partition_id"]) == {}
    assert sink_count(database, fuzz_shard["sink"]) == 0
    assert cursor(database, fuzz_shard["partition_id"], fuzz_shard["group"]) == 0


# -- wakes and roles ----------------------------------------------------------------------

def test_a_cycle_sink_push_wakes_a_parked_pop(slow_timer_broker, queue_name):
    """A pop parked on the sink queue is answered by the cycle's commit, not by its re-check
    timer (SLOW_TIMER_MS): the cycle's pushes wake like /api/v1/push."""
    import threading
    import time

    from tests.conftest import WAKE_BOUND_S, parked_pops
    from tests.waiting import wait_until

    url = slow_timer_broker.url
    with httpx.Client(base_url=url, timeout=30) as http:
        source, sink = queue_name, queue_name + "-sink"
        q = register(http, "wake-" + queue_name, source, sink=sink).json()
        push(http, source, "p1", [{"n": 1}])
        group = "streams." + q["name"]
        msgs = pop(http, source, group)
        # the sink queue exists before the pop parks on it
        http.post("/api/v1/configure", json={"queue": sink, "options": {}})
        answer: dict = {}

        def reader() -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                answer["body"] = c.get(f"/api/v1/pop/queue/{sink}",
                                       params={"wait": "true", "timeout": 15000}).json()
                answer["at"] = time.monotonic()

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            wait_until(lambda: parked_pops(url) >= 1, 10, "the sink pop to park")
            committed_at = time.monotonic()
            body = cycle_body({"query_id": q["query_id"], "partition_id": msgs[0]["partitionId"],
                               "group": group, "msgs": msgs, "sink": sink})
            assert http.post("/streams/v1/cycle", json=body).json()["success"] is True
        finally:
            thread.join(20)
        assert [m["data"] for m in answer["body"]["messages"]] == [{"sum": 3}]
        assert answer["at"] - committed_at < WAKE_BOUND_S


def test_jwt_levels(broker_factory):
    """read-only may read state and list queries; registering and cycles need read-write."""
    import jwt

    secret = "streams-secret-" + "x" * 32
    b = broker_factory(JWT_ENABLED="true", JWT_ALGORITHM="HS256", JWT_SECRET=secret)

    def auth(role: str) -> dict[str, str]:
        return {"Authorization": "Bearer " + jwt.encode({"sub": "u", "role": role}, secret,
                                                        algorithm="HS256")}

    reg = {"name": f"jwt-{uuid.uuid4().hex[:8]}", "source_queue": "jwt-src", "config_hash": "h"}
    with httpx.Client(base_url=b.url, timeout=30) as http:
        assert http.post("/streams/v1/queries", json=reg, headers=auth("read-only")
                         ).status_code == 403
        r = http.post("/streams/v1/queries", json=reg, headers=auth("read-write"))
        assert r.status_code == 200, r.text
        qid = r.json()["query_id"]
        read = {"query_id": qid, "partition_id": str(uuid.uuid4()), "keys": []}
        assert http.post("/streams/v1/state/get", json=read, headers=auth("read-only")
                         ).json() == {"success": True, "rows": []}
        assert http.get("/streams/v1/queries", headers=auth("read-only")).status_code == 200
        assert http.post("/streams/v1/cycle", json={**read, "ack": None},
                         headers=auth("read-only")).status_code == 403
        assert http.post("/streams/v1/cycle", json={**read, "ack": None},
                         headers=auth("read-write")).status_code == 404  # unknown partition
        assert http.post("/streams/v1/state/get", json=read).status_code == 401


def test_queries_and_state_sizes_in_prometheus(http, shard):
    """The operator's view: per query its state rows and bytes, and cycles by outcome."""
    assert http.post("/streams/v1/cycle", json=cycle_body(shard)).json()["success"] is True
    http.post("/streams/v1/cycle", json=cycle_body(shard, lease_id=str(uuid.uuid4())))
    text = http.get("/metrics/prometheus").text
    name = "q-" + shard["source"]
    assert f'queen_stream_state_rows{{query="{name}"}} 1.0' in text
    assert f'queen_stream_state_bytes{{query="{name}"}}' in text
    assert 'queen_stream_cycles_total{outcome="committed"}' in text
    assert 'queen_stream_cycles_total{outcome="replayed"}' in text


def test_a_sink_push_to_a_held_partition_is_503_and_rolls_the_cycle_back(http, database,
                                                                         shard):
    """A peer's spool holds the sink partition (a live peer's queen.spool_backlog row): the
    cycle's push inside cycle_v1 answers held, which rolls back the state ops, the push and
    the ack it had applied before, and nothing is registered or spooled for this broker: a
    503 with Retry-After. Once the peer's backlog is gone the same cycle commits."""
    import asyncio

    import asyncpg

    peer = f"held-peer-{uuid.uuid4().hex[:8]}"

    async def sql(statement: str, *args) -> None:
        conn = await asyncpg.connect(database.dsn)
        try:
            await conn.execute(statement, *args)
        finally:
            await conn.close()

    asyncio.run(sql("INSERT INTO queen.spool_servers (server_id) VALUES ($1)", peer))
    asyncio.run(sql("""INSERT INTO queen.spool_backlog
        (queue_name, partition_name, server_id, oldest_accept_us) VALUES ($1, 'p1', $2, 1)""",
                    shard["sink"], peer))
    try:
        spooled = http.get("/metrics").json()["spool"]["pendingCount"]
        r = http.post("/streams/v1/cycle", json=cycle_body(shard))
        assert r.status_code == 503, r.text
        assert r.headers.get("Retry-After")
        assert f"{shard['sink']}/p1" in r.json()["error"] and "spool" in r.json()["error"]
        assert state(http, shard["query_id"], shard["partition_id"]) == {}
        assert sink_count(database, shard["sink"]) == 0
        assert cursor(database, shard["partition_id"], shard["group"]) == 0
        assert db_val(database, """SELECT count(*) FROM queen.spool_backlog
            WHERE queue_name = $1 AND server_id <> $2""", shard["sink"], peer) == 0
        assert http.get("/metrics").json()["spool"]["pendingCount"] == spooled
    finally:
        asyncio.run(sql("DELETE FROM queen.spool_backlog WHERE server_id = $1", peer))
        asyncio.run(sql("DELETE FROM queen.spool_servers WHERE server_id = $1", peer))
    r = http.post("/streams/v1/cycle", json=cycle_body(shard))
    assert r.json()["success"] is True, r.text
    assert sink_count(database, shard["sink"]) == 1
