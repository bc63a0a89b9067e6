"""The routes, one module per group: each parses with broker.http.wire, calls a service and
shapes the answer; no route imports another (shared work lives in broker/service/).

    push.py, pop.py, ack.py   the message routes
    admin.py        configure, queue resources, DLQ + retry, health, shared state
    system.py       maintenance modes
    quarantine.py   the spool's quarantine: list, show, replay, discard
    spools.py       the cluster's spool holds: list, release one spool's
    docs.py         GET /openapi.json and GET /docs
    streams.py      /streams/v1: queries, cycle, state/get
    reads.py, kv.py, locks.py, timers.py   the state surfaces
    ephemeral.py    /api/v1/ephemeral/*, forwarded to the owning broker when another owns it
    migration.py    /api/v1/migration/* (ADMIN, off unless MIGRATION_ROUTES)
    supervision.py  GET /api/v1/status/supervision: the supervised consumers
    dashboard.py    the web dashboard's files and GET /api/v1/auth/session
    identity.py     /auth/me, /auth/login, /auth/logout for Queen's own web dashboard
    ops/            the operator surface (its __init__ is the map)
"""
