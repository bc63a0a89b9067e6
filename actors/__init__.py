"""State that lives in one broker, owned by actors on the asyncio event loop with pykka's API;
imports broker.core and broker.store only (ARCHITECTURE.md is the whole map):

    runtime.py         AsyncioActor / AsyncioFuture: pykka's API on one asyncio task per actor
    proxies.py         one typed view per actor proxy, checked against broker/service/ports.py
    pop_waiters.py     PopWaiterRegistry: parked long polls by queue and cohort
    hints.py           Hints: wakes after a commit or a released lease, here and on the peers
    batcher.py         Batcher: folds concurrent push / ack requests into one round trip
    hotlist.py         HotListActor: rings of probably-pending partitions per (queue, group)
    autopilot.py       Autopilot: the pop autopilot's sizing rule and state
    reconciler.py      QueueConfigCache, MaintenanceFlags, the CacheReconciler loop
    staging_merger.py  StagingMerger: the staging merge batches, one broker at a time
    leader_jobs.py     retention, stats and the metrics collector: when they run, their counts
    metric_minutes.py  the collector's per-minute {avg, min, max, last} leaves
    timer_sweeper.py   TimerSweeper: delivers due timers on every broker
    live_series.py     LiveSeries: the dashboard's in-memory rings
    ephemeral/         ephemeral (RAM-class) queues (its __init__ is the map)
    mesh/              the framed-TCP mesh between brokers (its __init__ is the map)
    spool/             the node-local disk spool (its __init__ is the map)
"""
