"""A streams cycle while PostgreSQL is down: 503 with Retry-After, nothing spooled (a cycle
is a transaction and cannot wait in the spool); the same cycle commits once it is back."""
from __future__ import annotations

import httpx

from tests.conftest import db_val
from tests.faults.test_maintenance_and_outage import brokers, db  # noqa: F401
from tests.waiting import wait_until


def sink_rows(db, queue: str) -> int:  # noqa: F811
    return db_val(db, """SELECT count(*) FROM queen.messages m
        JOIN queen.partitions p ON p.id = m.partition_id
        JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1""", queue)


def test_a_cycle_during_an_outage_is_503_and_nothing_is_spooled(db, brokers,  # noqa: F811
                                                                      queue_name):
    b = brokers(db, DB_CONNECTION_TIMEOUT="500")
    source, sink = queue_name, queue_name + "-sink"
    with httpx.Client(base_url=b.url, timeout=30) as http:
        q = http.post("/streams/v1/queries", json={"name": "o-" + source, "source_queue": source,
                                                   "config_hash": "h"}).json()
        http.post("/api/v1/push", json={"items": [{"queue": source, "payload": {"n": 1}}]})
        group = "streams.o-" + source
        (msg,) = http.get(f"/api/v1/pop/queue/{source}",
                          params={"consumerGroup": group}).json()["messages"]
        cycle = {"query_id": q["query_id"], "partition_id": msg["partitionId"],
                 "consumer_group": group,
                 "state_ops": [{"type": "upsert", "key": "k", "value": 1}],
                 "push_items": [{"queue": sink, "payload": {"v": 1}}],
                 "ack": {"transactionId": msg["transactionId"], "leaseId": msg["leaseId"],
                         "status": "completed"}}
        db.embedded.stop(mode="immediate")
        try:
            for path, body in (("/streams/v1/cycle", cycle),
                               ("/streams/v1/state/get", {"query_id": q["query_id"],
                                                          "partition_id": msg["partitionId"]}),
                               ("/streams/v1/queries", {"name": "o2", "source_queue": source,
                                                        "config_hash": "h"})):
                r = http.post(path, json=body)
                assert r.status_code == 503, (path, r.text)
                assert r.headers["Retry-After"] and "error" in r.json()
            assert http.get("/health").json()["spool"]["pendingCount"] == 0
        finally:
            db.embedded.start()
        assert sink_rows(db, sink) == 0
        wait_until(lambda: http.post("/streams/v1/cycle", json=cycle).status_code == 200, 30,
                   "the cycle to commit after the outage")
        assert sink_rows(db, sink) == 1
