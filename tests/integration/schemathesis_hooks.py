"""Hooks for the schemathesis run of test_openapi_fuzz.py (loaded with SCHEMATHESIS_HOOKS).

A long poll may legally last as long as its ``timeout`` asks (days); the run caps the generated
ones at half a second so every pop is answered within the run's request timeout.

The migration routes make the broker connect to the host a body names. A generated host may
resolve to anywhere ("1.2" is 1.0.0.2), so every generated string host is replaced by one of
TARGET_HOSTS, and a port the broker would accept by FUZZ_CLOSED_PORT: a loopback port the test
holds bound and never listens on (a port it would refuse stays, for its 400). Each of them fails on this machine, without a packet leaving it: refused on
loopback, or refused by the resolver before it asks anyone (a name with a space, a label over
63 octets, a NUL). Everything else reaches the broker as generated.
"""
from __future__ import annotations

import os
import zlib

import schemathesis

from broker.service.migration import MigrationInputError, parse_target

LONG_POLL_CAP_MS = 500
MIGRATION_PREFIX = "/api/v1/migration/"
TARGET_HOSTS = (
    "127.0.0.1",            # connection refused
    "localhost",            # /etc/hosts, then refused
    "no such host",         # "Name or service not known", answered by the local resolver
    "a" * 64 + ".example",  # a label too long: refused before any lookup
    "bad\x00host",          # a NUL: refused before any lookup
)


@schemathesis.hook
def map_query(ctx, query):
    if query and str(query.get("wait", "")).lower() in ("true", "1"):
        query["timeout"] = LONG_POLL_CAP_MS
    return query


@schemathesis.hook
def map_case(ctx, case):
    body = case.body
    if (case.path.startswith(MIGRATION_PREFIX) and isinstance(body, dict)
            and isinstance(body.get("host"), str)):
        pick = zlib.crc32(body["host"].encode("utf-8", "surrogatepass")) % len(TARGET_HOSTS)
        mapped = {**body, "host": TARGET_HOSTS[pick]}
        try:  # the broker's own parser: would it connect with this body?
            parse_target(mapped, "")
        except MigrationInputError:
            pass  # refused before any connection: the generated port stays, for its 400
        else:
            mapped["port"] = int(os.environ["FUZZ_CLOSED_PORT"])
        case.body = mapped
    return case
