"""Hooks for the schemathesis run of test_openapi_fuzz.py (loaded with SCHEMATHESIS_HOOKS).

A long poll may legally last as long as its ``timeout`` asks (days); the run caps the generated
ones at half a second so every pop is answered within the run's request timeout. Nothing else
is changed: every other generated value reaches the broker as generated.
"""
from __future__ import annotations

import schemathesis

LONG_POLL_CAP_MS = 500


@schemathesis.hook
def map_query(ctx, query):
    if query and str(query.get("wait", "")).lower() in ("true", "1"):
        query["timeout"] = LONG_POLL_CAP_MS
    return query
