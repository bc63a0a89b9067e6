"""One module per route group, each a list ``OPERATIONS`` of ``builder.op`` entries. A new
route group adds a module here and one line to ``broker.http.openapi.GROUPS``.

    messaging.py        push, pop, ack, transaction and lease renewal (the data path)
    queues.py           queue configuration and the resource listings
    messages.py         message browsing, dead letters and their retry
    consumer_groups.py  listing, lag, deletion, subscription rewrite, seek
    traces.py           message traces
    status.py           dashboard status and analytics
    system.py           health, metrics, maintenance, shared state, jobs, quarantine, spool holds
    streams.py          the streaming SDK's routes
    state.py            offset reads, key/value, locks, timers; the unsupported ephemeral paths
    state_ops.py        the operator views of kv, locks and timers
    migration.py        the migration routes (ADMIN)
    dashboard.py        the dashboard's files, the caller's session, the figures only it reads
    supervision.py      the supervised consumers
    ephemeral.py        the eight verbs of /api/v1/ephemeral/*
"""
