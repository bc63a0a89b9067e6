"""The only code that speaks SQL. A surface's statements live, named and documented, in the
module whose name ends in ``_sql``; the module of the same name without it runs them.
ARCHITECTURE.md says more of each.

One way to call it. Callers outside this package never hold a connection: they call a
coroutine of a store module with the :class:`~broker.store.db.Store` as its first
argument (``await ops.overview(store)``, ``await kv.batch(store, ops)``), or, for the data
path, whose per-broker state the Store keeps (its server id, orphaned leases, partition
handles), a method of the Store itself (``store.push``, ``store.pop``, ``store.ack``).
Either opens its own pooled connection (one round trip, or one transaction) and raises
only errors.py's exceptions. A function that is one part of a caller's transaction
inside the store takes that transaction's ``asyncpg.Connection``, typed (the kv and
timer riders, ``ops.stats_state``, the retention session's statements); a service's
transaction hook receives it as ``transactions.Connection`` and only hands it on.

    errors.py              the store's exceptions and mapped_errors (asyncpg's errors by
                           SQLSTATE -> StoreUnavailable / StoreBusy / StoreInvalidValue /
                           StoreConflict / StoreError; PartitionHeld, TransactionAborted)
    connect.py             the pool's connection setup: session settings, TLS, codecs, reset,
                           ServerInUse (which PG_HOST server the connections reach)
    codecs.py              json/jsonb codecs, COPY's binary jsonb, the compact push/ack arguments
    db.py                  Store: the pool, connection(), ping, the data path, queue configuration
    transactions.py        run_transaction (push and ack steps on one connection),
                           rerun_on_conflict
    health.py              DatabaseHealth: an outage told once, who is told when it is back
    sql.py                 the data path's statements (push, pop, ack, the spool's upload)
    ops.py, ops_sql.py     the operator routes' queries
    analytics.py, analytics_sql.py   the status / analytics reads
    browse.py, browse_sql.py         the paged operator lists and the depth history
    figures_sql.py         the one definition of a partition's message figures
    jobs.py, jobs_sql.py   the leader jobs' side: retention (lock 737001), stats (737002)
    streams.py, streams_sql.py       the /streams/v1 statements
    reads.py, reads_sql.py           offset reads and partition discovery
    kv.py, kv_sql.py       key/value operations on a connection
    locks.py, locks_sql.py           permits with fencing tokens
    timers.py, timers_sql.py         timer upsert, cancel, delivery
    state_ops.py, state_ops_sql.py   the operator views of kv, locks and timers
    ephemeral.py, ephemeral_sql.py   the ephemeral queues' declarations
    supervision.py         the rows of namespace queen-supervisor, read in one snapshot
    spools.py, spools_sql.py         the cluster's spool holds
    migration.py, migration_sql.py   the other database of a schema copy
    boot.py                the start-up connection: reachability, schema, TLS check
    schema.py              the numbered migrations (migrations/), applied at boot
    schema_dump.py         writes schema_current.sql, the schema as the migrations leave it
    embedded_pg.py         the embedded PostgreSQL's lifecycle and its Watchdog
"""
