"""The service layer: what the broker does, between the routes and the actors/store.

Routes parse a request (``broker.http.wire``), call one function here, and shape the
answer from what it returns; operator routes included, broker/http imports nothing of
``broker.store`` or ``actors`` (tests/unit/test_http_through_services.py), only the
composition root does. The store's errors reach HTTP as they leave the service (the
app's error handlers answer them); the types the wire needs (KvOp, TimerOp, StateOp...)
are re-exported by the service that takes them. These functions know the store, the actors
(through the typed proxies of ``actors/proxies.py``) and each other, never Sanic: a push, a
pop with the hot-list's claim
protocol and its long poll, an ack, a transaction, the spool's upload and the staging
merge, and the wakes after a commit or a released lease all live here, and each is
testable without HTTP.

    context.py    BrokerContext: the typed application context (app.ctx)
    push.py       push: fold + commit, or spool; staged items; wakes after commit
    pop.py        pop: hot-list candidates, the claim, verdicts back
    long_poll.py  a pop that waits: attempt, park, wake or timer, deadline
    ack.py        ack, transaction, lease renewal, wakes after a released lease
    drain.py      the spool's upload into queen.staged, merge batches, spool and staging stats
    gauges.py     instant figures of this broker (metrics collector, /metrics), the cluster
                  view, the live series
    metrics.py    the database's share of /metrics and /metrics/prometheus
    system.py     the maintenance flags (flip, refresh), the database as /health sees it
    health.py     liveness (/health/live: the loop's lag) and readiness (/health/ready)
    jobs.py       the leader jobs' counters, one cycle run now
    queues.py     configure, queue listing and detail, delete; dead letters and their retry
    resources.py  namespaces, tasks, overview, partitions, a queue's depth (operators)
    consumer_groups.py  groups, lag, deletion, subscription rewrite, seek (and its wakes)
    messages.py   operators' message pages, one message in detail, delete, move to the DLQ
    traces.py     message traces: record, names, by name, by message
    browse.py     the operator's paged, server-side-searched lists
    quarantine.py the spool's quarantine: list, show, replay, discard
    analytics.py  status and analytics answers in the dashboard's shapes, the collector's reads
    streams.py    /streams/v1: queries, state reads, the one-statement cycle
    reads.py      offset reads and partition discovery (no lease, no cursor)
    kv.py         the key/value batch and its path-style sugar
    locks.py      locks and semaphores with fencing tokens
    timers.py     timers: schedule, cancel, peek, list, delivery of due ones
    riders.py     the kv and timers arrays of a transaction
    state_ops.py  the operator views of key/value, locks and timers
    migration.py  the copy of the queen schema to another PostgreSQL (pg_dump | pg_restore)
    ephemeral.py  the eight ephemeral verbs on the rings; configure / delete the declarations
    ownership.py  rendezvous hashing: the broker that owns an ephemeral queue
    ephemeral_ownership.py   the members watched: rings of queues that moved are dropped
    supervision.py  the supervised consumers: heads and chunks reassembled and checked
    spools.py     the cluster's spool holds: read, and an operator's release
"""
