"""Operator routes: resources, consumer groups, messages, traces, status,
analytics, statistics jobs and metrics (docs/wire-contract.md §10–§15), and the operator
views of key/value, locks and timers (state)."""
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
