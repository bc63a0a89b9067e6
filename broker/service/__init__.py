"""The service layer: what the broker does, between the routes and the actors/store.

Routes parse a request (``broker.http.wire``), call one function here, and shape the
answer from what it returns. These functions know the store, the actors (through the
typed proxies of ``actors/proxies.py``) and each other, never Sanic: a push, a pop with the hot-list's claim
protocol and its long poll, an ack, a transaction, the spool's upload and the staging
merge, and the wakes after a commit or a released lease all live here, and each is
testable without HTTP.

    context.py    BrokerContext: the typed application context (app.ctx)
    push.py       push: fold + commit, or spool; staged items; wakes after commit
    pop.py        pop: hot-list candidates, the claim, verdicts back
    long_poll.py  a pop that waits: attempt, park, wake or timer, deadline
    ack.py        ack, transaction, lease renewal, wakes after a released lease
    drain.py      the spool's upload into queen.staged, merge batches, spool and staging stats
    gauges.py     instant figures of this broker (metrics collector, /metrics)
    analytics.py  status and analytics answers in the dashboard's shapes
    streams.py    /streams/v1: queries, state reads, the one-statement cycle
    reads.py      offset reads and partition discovery (no lease, no cursor)
    kv.py         the key/value batch and its path-style sugar
    locks.py      locks and semaphores with fencing tokens
    timers.py     timers: schedule, cancel, peek, list, delivery of due ones
    riders.py     the kv and timers arrays of a transaction
    state_ops.py  the operator views of key/value, locks and timers
    migration.py  the copy of the queen schema to another PostgreSQL (pg_dump | pg_restore)
"""
