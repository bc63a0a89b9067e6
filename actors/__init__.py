"""Actors running on the asyncio event loop, with pykka's API: the state that lives in one
broker. They import broker.core and broker.store only; the services call them through their
proxies, typed with the views of proxies.py.

    runtime.py         AsyncioActor / AsyncioFuture: pykka's API on one asyncio task per
                       actor; proxied / typed_proxy for the type checker
    proxies.py         one typed view per actor proxy, made of the actor's own methods
    periodic.py        PeriodicActor: the loop task started and stopped with the actor, its
                       wake and the signal its passes fire (merger, sweeper, jobs)
    pop_waiters.py     PopWaiterRegistry: parked long polls by queue and cohort
    hints.py           Hints: the wakes after a commit or a released lease, here and on peers
    batcher.py         Batcher: concurrent push / ack requests folded into one round trip
    hotlist.py         HotList: per (queue, group) rings of probably-pending partitions
    autopilot.py       Autopilot: pop autopilot's sizing state, held by the HotList
    reconciler.py      QueueConfigCache, MaintenanceFlags and the CacheReconciler loop
    staging_merger.py  StagingMerger: merges queen.staged into the queues, on every broker
    timer_sweeper.py   TimerSweeper: delivers due timers, on every broker
    leader_jobs.py     the jobs: retention, stats (under their advisory locks), metrics
    metric_minutes.py  the metrics collector's per-minute leaves
    live_series.py     LiveSeries: the dashboard's throughput and depth rings
    ephemeral/         the ephemeral queues and the EphemeralKeeper (its __init__ is the map)
    spool/             the node-local disk spool and its drain (its __init__ is the map)
    mesh/              the framed-TCP mesh between brokers (its __init__ is the map)
"""
