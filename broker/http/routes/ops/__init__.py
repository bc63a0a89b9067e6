"""Operator routes: resources, consumer groups, messages, traces, status,
analytics, statistics jobs and metrics (docs/wire-contract.md §10–§15), and the operator
views of key/value, locks and timers (state).

    resources.py        namespaces, tasks, overview, partitions, depth
    consumer_groups.py  listing, lag, deletion, subscription rewrite, seek
    message_admin.py    message browsing: list, detail, delete (+ move to DLQ)
    traces.py           message traces: record, read by message and by name
    status.py           dashboard status and analytics answers
    analytics.py        queue-ops, retention, lag, system and worker metrics, postgres-stats
    stats.py            stats refresh and the background jobs' figures
    metrics.py          /metrics (JSON) and /metrics/prometheus (render only)
    live.py             per-second throughput, depth history, this broker's cluster view
    browse.py           paged, server-side-searched lists
    state.py            the operator views of kv, locks and timers
    streams.py          /api/v1/status/streams: the streaming queries
    common.py           what the operator routes share: time ranges, buckets, JSON shaping
"""
from __future__ import annotations

from broker.http.routes.ops import (
                               analytics,
                               browse,
                               consumer_groups,
                               live,
                               message_admin,
                               metrics,
                               resources,
                               state,
                               stats,
                               status,
                               streams,
                               traces,
)

blueprints: list = [stats.bp, resources.bp, consumer_groups.bp, message_admin.bp, traces.bp,
                    status.bp, analytics.bp, metrics.bp, live.bp, browse.bp, state.bp,
                    streams.bp]
