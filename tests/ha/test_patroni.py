"""The brokers on a Patroni-managed PostgreSQL: a leader killed, a planned switchover.

Real parts: etcd, two PostgreSQL members under Patroni with ``synchronous_mode`` on (see
tests/ha/patroni_cluster.py), two broker processes whose ``PG_HOST`` lists both members with
``PG_TARGET_SESSION_ATTRS=read-write``, so each follows whichever member is writable without
knowing about Patroni. Under sustained pushes (three producers, single messages, each to its
own partition) and two consumer groups, on one cluster (the switchover first, since the
kill leaves one member):

* a planned switchover under load: no push answered with an error (``buffered`` is an
  answer, a 5xx is not), and pushes answer ``queued`` again within the load that follows
  the new leader answering Patroni's GET /primary;
* the leader is killed (``kill -9`` of its postmaster, then of its Patroni): Patroni elects
  the synchronous standby, and no acknowledged push is lost, duplicated or reordered, in
  PostgreSQL or in what either group received; pushes answer ``queued`` again the same way.

How soon they answer ``queued`` again is printed, not asserted (the suite asserts no timing
on a shared machine); benchmarks/patroni_failover.py measures it against its targets, 5 s
after a leader kill and 2 s after a switchover.

Skipped only when patroni, etcd or PostgreSQL's server binaries are not installed.
"""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import Database, launch_broker, stop_brokers, wait_healthy
from tests.ha import failover_load
from tests.ha.patroni_cluster import PatroniCluster, missing_parts

pytestmark = pytest.mark.skipif(missing_parts() is not None,
                                reason=f"a Patroni cluster needs {missing_parts()}")

LOAD_BEFORE_S, LOAD_AFTER_S = 3.0, 5.0


@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module: the switchover runs first and leaves both members, the
    leader kill last (each test waits for a leader and a synchronous standby first)."""
    c = PatroniCluster(members=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def brokers(cluster, tmp_path):
    hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in cluster.members)
    db = Database("127.0.0.1", cluster.members[0].pg_port, "postgres", "postgres", "postgres")
    started = [launch_broker(db, tmp_path, PG_HOST=hosts, PG_TARGET_SESSION_ATTRS="read-write",
                             DB_CONNECTION_TIMEOUT="500") for _ in range(2)]
    try:
        for b in started:
            wait_healthy(b, 60)
        yield started
    finally:
        stop_brokers(started)


async def test_a_switchover_answers_no_push_with_an_error_and_queues_again(cluster, brokers):
    leader = cluster.ready()
    candidate = next(m for m in cluster.members if m is not leader)
    queue = f"patroni-switchover-{uuid.uuid4().hex[:8]}"
    run = await failover_load.run([b.url for b in brokers], queue,
                                  lambda: cluster.switchover(leader, candidate),
                                  [candidate.rest],
                                  before_s=LOAD_BEFORE_S, after_s=LOAD_AFTER_S)
    in_db = await failover_load.stored([m.dsn for m in cluster.members], queue)
    print("switchover:", run.figures())
    context = f"{run.figures()} {run.statuses()} {run.first_errors}"
    assert run.errors() == [], context
    assert failover_load.losses(run, in_db) == [], context
    print("back to queued after the new leader took writes:", run.back_to_queued(), "s")


async def test_a_killed_leader_loses_nothing_and_pushes_queue_again(cluster, brokers):
    leader = cluster.ready()
    replica = next(m for m in cluster.members if m is not leader)
    queue = f"patroni-kill-{uuid.uuid4().hex[:8]}"
    run = await failover_load.run([b.url for b in brokers], queue,
                                  lambda: cluster.kill_leader(leader), [replica.rest],
                                  before_s=LOAD_BEFORE_S, after_s=LOAD_AFTER_S)
    in_db = await failover_load.stored([replica.dsn], queue)
    print("leader killed:", run.figures())  # shown with -s, and on failure
    context = (f"{run.figures()} {run.statuses()} {run.first_errors}\n"
               f"{cluster.log(replica.name)}")
    assert failover_load.losses(run, in_db) == [], context
    assert [p for p in run.errors() if p.status.startswith("http_5")
            and p.status != "http_503"] == [], context
    assert run.statuses()["buffered"] > 0, context  # the outage was seen, and spooled
    print("back to queued after the new leader took writes:", run.back_to_queued(), "s")
