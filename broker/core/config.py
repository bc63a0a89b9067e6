"""Every environment variable the broker reads: declared, parsed, validated and documented once.

Each tunable is one ``Variable`` entry in ``VARIABLES`` (name, default as shown in the docs,
kind, one-line meaning, parser).  ``load_settings()`` turns the environment into a frozen
``Settings``; ``markdown_table()`` renders the same registry for the docs' table
(docs/operations/configuration.md), so the code and the documentation cannot drift apart.

Rules shared by all variables:
  * an empty (or whitespace-only) value means "unset" and the default applies;
  * a bad value raises ``ConfigError`` naming the variable, the value and what was expected;
  * secrets (passwords, keys) are never echoed back: not in errors, ``repr`` or boot logs.

Variable names are Queen's, so a deployment can switch brokers without renaming anything.
"""

from __future__ import annotations

import difflib
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# The parsers live in config_parsers.py; ConfigError is imported from here by callers.
from broker.core.config_parsers import (
    ConfigError,
    Parser,
    _bool,
    _choice,
    _csv,
    _float,
    _fsync_policy,
    _hex_key,
    _http_url,
    _int,
    _path,
    _peers,
    _pg_hosts,
    _str,
)

__all__ = ["ConfigError", "Settings", "Variable", "VARIABLES", "load_settings", "markdown_table"]


# --------------------------------------------------------------------------------------------
# The registry.
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variable:
    name: str
    default: str | None  # as shown in the docs; None = unset
    kind: str  # short type label for the docs
    doc: str
    parse: Parser = field(repr=False)
    attr: str = ""  # Settings attribute; lowercase of the name unless given
    aliases: tuple[str, ...] = ()  # older names, read when the main one is unset
    secret: bool = False  # never echoed; read verbatim (no whitespace stripping)
    # Computes the default from the environment when it is not a constant (e.g. from the pid).
    dynamic: Callable[[Mapping[str, str]], Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.attr:
            object.__setattr__(self, "attr", self.name.lower())

    def default_value(self, environ: Mapping[str, str]) -> Any:
        if self.dynamic is not None:
            return self.dynamic(environ)
        if self.default is None:
            return None
        # Constant defaults go through the same parser as user values, so they are typed and
        # validated exactly like them.
        return self.parse(self.name, self.default)


def _v(name, default, kind, doc, parse, **extra) -> Variable:
    return Variable(name, default, kind, doc, parse, **extra)


_PORT = _int(1, 65535)
_POSITIVE = _int(1)

LOG_LEVELS = ("trace", "debug", "info", "success", "warning", "error", "critical")
NEW_SUBSCRIPTION_MODES = ("new", "new-only")
"""The subscription modes that start a new group at the newest message; every other value
(``all``, ``from_beginning``, ``earliest``, empty, anything) starts it at the oldest one, as the
reference broker and the official clients have it."""


def subscription_starts_new(mode: str | None) -> bool:
    """Does subscription mode ``mode`` start a new group at the newest message?"""
    return (mode or "").strip().lower() in NEW_SUBSCRIPTION_MODES


def _subscription_mode(name: str, raw: str) -> str:
    # Any value is a mode (the reference reads anything but new as "from the beginning");
    # keep it as given, lower-cased, so the boot line shows what was set.
    return raw.strip().lower()

JWT_ALGORITHMS = ("HS256", "RS256", "EdDSA", "auto")

VARIABLES: list[Variable] = [
    # HTTP / process
    _v("HOST", "127.0.0.1", "str", "Address the HTTP API listens on.", _str),
    _v("PORT", "6632", "int", "TCP port of the HTTP API.", _PORT),
    _v("WORKER_ID", "broker-<pid>", "str", "Name of this broker process in logs and leases.", _str,
       dynamic=lambda env: f"broker-{os.getpid()}"),
    _v("LOG_LEVEL", "info", "choice",
       "Log level: trace, debug, info, success, warning, error or critical.",
       _choice(*LOG_LEVELS, upper=True)),
    _v("LOG_FORMAT", "text", "choice",
       "Log line format: text (one readable line each) or json (one JSON object a line: time, "
       "level, message, logger, context).", _choice("text", "json")),
    _v("ACCESS_LOG", "false", "bool",
       "Log one line per HTTP request: method, path, status, duration and, with JWT, the "
       "token's subject.", _bool),
    _v("MAX_BODY_BYTES", "16777216", "int", "Largest accepted request body; larger ones get 413.",
       _POSITIVE),
    _v("RESPONSE_COMPRESSION_MIN_BYTES", "8192", "int",
       "Answers of at least this many bytes are sent zstd- or gzip-encoded when the request's "
       "Accept-Encoding takes it (the official clients' does); 0 never compresses.", _int(0)),
    _v("HEALTH_LIVE_MAX_LAG_MS", "10000", "ms",
       "GET /health/live answers 503 when the event loop woke this much later than asked in "
       "the last 10 s (it is measured every 0.5 s), or has not measured for that long: the "
       "loop is stuck, and a restart is the cure.", _POSITIVE),
    _v("HEALTH_READY_SPOOL_MAX_PERCENT", "90", "int",
       "While PostgreSQL is unreachable, GET /health/ready answers 503 once the spool holds "
       "this percentage of FILE_BUFFER_MAX_BYTES (1 to 100), so that load balancers send "
       "pushes to brokers with room left before this one refuses them.", _int(1, 100)),
    _v("STOP_UNREADY_MS", "0", "ms",
       "On SIGTERM, how long the broker keeps serving with GET /health/ready answering 503 "
       "before it stops listening, so that a load balancer takes it out first; parked long "
       "polls are answered at once. 0 stops listening at once.", _int(0)),
    # Database
    _v("PG_HOST", None, "str",
       "PostgreSQL host, or a comma-separated list of hosts each with an optional :port "
       "(e.g. db1:5432,db2:5432) tried in order, so that the broker follows a failover; unset "
       "means start the embedded PostgreSQL.", _pg_hosts),
    _v("PG_PORT", "5432", "int", "PostgreSQL port, for hosts in PG_HOST that name none.", _PORT),
    _v("PG_USER", "postgres", "str", "PostgreSQL user.", _str),
    _v("PG_PASSWORD", "postgres", "secret", "PostgreSQL password.", _str, secret=True),
    _v("PG_DB", "postgres", "str", "PostgreSQL database name.", _str),
    _v("PG_USE_SSL", "false", "bool", "Connect to PostgreSQL over TLS.", _bool),
    _v("PG_SSL_REJECT_UNAUTHORIZED", "true", "bool",
       "With TLS, verify the server's certificate chain and host name (sslmode=verify-full; "
       "the CA file is read from PGSSLROOTCERT, else ~/.postgresql/root.crt, and the broker "
       "refuses to start without one); false = encrypt without verifying.", _bool),
    _v("PG_TARGET_SESSION_ATTRS", None, "choice",
       "Which of the PG_HOST servers to use, as libpq's target_session_attrs: read-write (the "
       "default when PG_HOST lists several: the writable primary; a standby is skipped), "
       "primary, or any (the default for one host). Standby-only values are refused: the "
       "broker writes.", _choice("read-write", "primary", "any")),
    _v("DB_POOL_SIZE", "20", "int",
       "Connections per broker process (Queen's C++ default is 150; an asyncio broker needs far "
       "fewer, and replicas x pool size must fit PostgreSQL's max_connections).", _int(2)),
    _v("DB_CONNECTION_TIMEOUT", "2000", "ms", "Timeout for opening a database connection.",
       _POSITIVE),
    _v("PG_CONNECT_WAIT_MS", "0", "ms",
       "At start, keep retrying an unreachable PostgreSQL this long before giving up "
       "(0 = give up at once).", _int(0)),
    _v("DB_STATEMENT_TIMEOUT", "30000", "ms", "statement_timeout for broker sessions.", _POSITIVE),
    _v("DB_LOCK_TIMEOUT", "10000", "ms", "lock_timeout for broker sessions.", _POSITIVE),
    _v("DB_IDLE_TIMEOUT", "30000", "ms",
       "idle_in_transaction_session_timeout for broker sessions.", _POSITIVE),
    # Embedded PostgreSQL
    _v("EMBEDDED_PG_DIR", ".queen/pgdata", "path",
       "Data directory of the embedded PostgreSQL (relative to the working directory).", _path),
    _v("EMBEDDED_PG_PORT", "54329", "int",
       "TCP port of the embedded PostgreSQL; 0 picks a free port.", _int(0, 65535)),
    # Pop / long poll
    _v("DEFAULT_TIMEOUT", "30000", "ms", "Long-poll wait of a pop that does not give one.",
       _POSITIVE),
    _v("DEFAULT_BATCH_SIZE", "1", "int", "Messages per pop when the request does not say.",
       _POSITIVE),
    _v("DEFAULT_SUBSCRIPTION_MODE", "all", "str",
       "Where a new consumer group starts when a pop names no subscriptionMode: all = at the "
       "oldest message; new or new-only = at the newest; any other value (from_beginning, "
       "earliest, ...) = at the oldest, like all.", _subscription_mode),
    _v("POP_WAIT_INITIAL_INTERVAL_MS", "100", "ms",
       "First re-check interval of a waiting pop.", _POSITIVE),
    _v("POP_WAIT_BACKOFF_THRESHOLD", "3", "int",
       "Empty re-checks before the interval starts growing.", _POSITIVE),
    _v("POP_WAIT_BACKOFF_MULTIPLIER", "2.0", "float",
       "Growth factor of the re-check interval (>= 1).", _float(1.0)),
    _v("POP_WAIT_MAX_INTERVAL_MS", "1000", "ms",
       "Cap of the re-check interval (>= the initial interval).", _POSITIVE),
    # Push / ack batching
    _v("PUSH_MAX_BATCH_ITEMS", "1000", "int",
       "Most pushed items folded into one SQL round trip.", _POSITIVE),
    _v("PUSH_MAX_ITEMS_PER_REQUEST", "10000", "int",
       "Most items one push or transaction may carry (a transaction counts its pushed items "
       "and its acks); more get 413 and nothing is stored.", _POSITIVE),
    _v("PUSH_MAX_CONCURRENT", "2", "int",
       "Concurrent push round trips per broker; pushes arriving meanwhile fold into the next "
       "one. Fewer, larger round trips cost less CPU per push: on 2 cores shared with "
       "PostgreSQL, 2 against 8 gave 1.47x the msg/s of 1-item pushes at 0.72x the broker "
       "CPU (benchmarks/README.md); raise it when PostgreSQL has many cores of its own.",
       _POSITIVE),
    _v("ACK_MAX_BATCH_ITEMS", "1000", "int",
       "Most acks folded into one SQL round trip.", _POSITIVE),
    _v("ACK_MAX_CONCURRENT", "8", "int", "Concurrent ack round trips per broker.", _POSITIVE),
    # Encryption
    _v("QUEEN_ENCRYPTION_KEY", None, "secret",
       "64 hex characters (AES-256-GCM key) enabling encrypted payloads; a malformed key is an "
       "error, not silently ignored.", _hex_key, attr="encryption_key", secret=True),
    # Mesh / HA
    _v("QUEEN_SERVER_ID", "$HOSTNAME or queen-<random>", "str",
       "Identity of this broker in the mesh.", _str,
       dynamic=lambda env: (env.get("HOSTNAME") or "").strip() or f"queen-{secrets.token_hex(4)}"),
    _v("QUEEN_SYNC_ENABLED", "true", "bool", "Take part in the broker mesh.", _bool),
    _v("QUEEN_MESH_PORT", "6633", "int",
       "TCP port the mesh listens on and dials peers at by default (legacy alias QUEEN_UDP_NOTIFY_PORT; the wire is TCP).", _PORT,
       aliases=("QUEEN_UDP_NOTIFY_PORT",)),
    _v("QUEEN_MESH_PEERS", "", "list",
       "Comma-separated host[:port] peers; port defaults to the mesh port (alias QUEEN_UDP_PEERS).",
       _peers, aliases=("QUEEN_UDP_PEERS",)),
    _v("QUEEN_MESH_HOST", "$HOST", "str",
       "Address the mesh listens on; defaults to HOST.", _str, dynamic=lambda env: None),
    _v("QUEEN_ADVERTISE_URL", "http://$HOST:$PORT", "str",
       "This broker's HTTP API as its peers reach it, sent in its mesh heartbeats: the owner of "
       "an ephemeral queue is reached there by the other brokers, which forward that queue's "
       "requests to it. Set it when HOST is 0.0.0.0 or the brokers reach each other through "
       "another address.", _http_url, dynamic=lambda env: None),
    _v("QUEEN_SYNC_SECRET", "", "secret",
       "Shared secret authenticating every mesh connection and frame (HMAC-SHA256); empty = "
       "open (unauthenticated) mode, warned about at boot and every 5 minutes.", _str,
       secret=True),
    _v("QUEEN_MESH_REQUIRE_SECRET", "false", "bool",
       "Refuse to start when QUEEN_SYNC_SECRET is empty.", _bool),
    _v("QUEEN_MESH_MAX_SKEW_MS", "30000", "ms",
       "Replay window: a mesh HELLO whose timestamp is further than this from the local clock "
       "is refused, and nonces are remembered this long.", _int(1000)),
    _v("QUEEN_MESH_MAX_FRAME_BYTES", "1048576", "int",
       "Largest mesh frame accepted (or sent); a longer length prefix closes the connection "
       "before anything is read.", _int(4096, 64 * 1024 * 1024)),
    _v("QUEEN_MESH_MAX_CONNECTIONS", "4 × peers + 4", "int",
       "Accepted mesh connections allowed at once; more are closed on accept.", _POSITIVE,
       dynamic=lambda env: None),
    _v("QUEEN_MESH_TLS_CERT", None, "path",
       "PEM certificate (chain) of this broker for mutual TLS on the mesh; set all three "
       "QUEEN_MESH_TLS_* or none.", _path),
    _v("QUEEN_MESH_TLS_KEY", None, "path", "PEM private key of QUEEN_MESH_TLS_CERT.", _path),
    _v("QUEEN_MESH_TLS_CA", None, "path",
       "PEM CA certificate(s) the peers' mesh certificates must be signed by.", _path),
    _v("QUEEN_SYNC_HEARTBEAT_MS", "1000", "ms", "Interval of mesh heartbeats.", _POSITIVE),
    _v("QUEEN_SYNC_DEAD_THRESHOLD_MS", "5000", "ms",
       "Silence after which a peer counts as dead (> heartbeat).", _POSITIVE),
    _v("QUEEN_CACHE_REFRESH_INTERVAL_MS", "60000", "ms",
       "Full refresh of cached queue configuration.", _POSITIVE),
    _v("QUEEN_HOTLIST", "true", "bool",
       "Serve wildcard pops from the in-memory hot-list of pending partitions; false = "
       "scan PostgreSQL on every wildcard pop.", _bool),
    _v("QUEEN_HOTLIST_RESEED_MS", "30000", "ms",
       "Floor for rebuilding each hot-list from PostgreSQL, even when it is not empty "
       "(plus up to 15 s of per-group jitter).", _POSITIVE),
    # Spool
    _v("FILE_BUFFER_DIR", ".queen/buffers", "path",
       "Spool directory for pushes accepted while the database is down. One broker per "
       "directory: a broker holds FILE_BUFFER_DIR/lock while it runs, and another broker on "
       "the same directory refuses to start.", _path),
    _v("FILE_BUFFER_FLUSH_MS", "100", "ms",
       "How often the spool's drain runs (finalize the active file, upload finished ones into "
       "PostgreSQL's staging table).", _POSITIVE),
    _v("FILE_BUFFER_MAX_BATCH", "10000", "int",
       "Staged events merged into the queues per transaction (the drain's merge batch).",
       _POSITIVE),
    _v("FILE_BUFFER_SETTLE_MS", "auto", "ms",
       "After PostgreSQL restarted or failed over: how long every push is staged and nothing "
       "merged, so each broker that spooled during the outage registers its backlog first and "
       "per-partition order holds across brokers. auto: DB_CONNECTION_TIMEOUT plus three "
       "FILE_BUFFER_FLUSH_MS when QUEEN_MESH_PEERS names peers, else 0 (one broker). Brokers "
       "sharing a database without the mesh set it.", _int(0), dynamic=lambda env: None),
    _v("FILE_BUFFER_EVENTS_PER_FILE", "10000", "int", "Events per spool file before rotating.",
       _POSITIVE),
    _v("FILE_BUFFER_FSYNC", "always", "policy",
       "When a spooled push is answered buffered. always: after an fdatasync that covers it "
       "(pushes arriving meanwhile share the next one), so it survives a power cut of the "
       "host. interval:MS: at once, the file synced at most MS later; a host crash may lose "
       "up to MS of acknowledged pushes (a process crash loses none).", _fsync_policy),
    _v("FILE_BUFFER_ORDER_WAIT_MS", "30000", "ms",
       "How long a broker that registered spooled pushes for a partition and then went silent "
       "(no heartbeat) holds that partition back; after it, the others proceed and its late "
       "pushes land with a counted order exception.", _POSITIVE),
    _v("FILE_BUFFER_ORDER_FORGET_MS", "3600000", "ms",
       "How long a spool that holds partitions may stay silent before the retention job deletes "
       "its rows (queen.spool_backlog, queen.spool_servers): a spool whose disk is gone for good "
       "then stops holding its partitions for good. 0 never deletes them. Must be at least twice "
       "FILE_BUFFER_ORDER_WAIT_MS.", _int(0)),
    _v("FILE_BUFFER_MAX_BYTES", "1073741824", "bytes",
       "Most bytes of spool files waiting to be replayed; a push that would pass it answers 503 "
       "with Retry-After instead of being acknowledged (the quarantine is not counted).",
       _POSITIVE),
    # Background jobs
    _v("RETENTION_INTERVAL", "5000", "ms", "How often the retention job runs.", _POSITIVE),
    _v("RETENTION_BATCH_SIZE", "1000", "int", "Messages deleted per retention round trip.",
       _POSITIVE),
    _v("PARTITION_CLEANUP_DAYS", "30", "days", "Empty, idle partitions older than this are dropped.",
       _POSITIVE),
    _v("METRICS_RETENTION_DAYS", "90", "days", "Age at which stored metrics are deleted.",
       _POSITIVE),
    _v("STATS_INTERVAL_MS", "10000", "ms", "How often queue statistics are recomputed (>= 1000).",
       _int(1000)),
    _v("METRICS_FLUSH_MS", "60000", "ms", "How often metrics are written to the database (>= 1000).",
       _int(1000)),
    _v("DASHBOARD_DEPTH_INTERVAL_MS", "15000", "ms",
       "How often the dashboard's queue-depth history (kept in memory) reads queen.stats (>= 1000).",
       _int(1000)),
    # Auth
    _v("JWT_ENABLED", "false", "bool", "Require a JWT bearer token on API requests.", _bool),
    _v("JWT_ALGORITHM", "HS256", "choice", "Token algorithm: HS256, RS256, EdDSA or auto.",
       _choice(*JWT_ALGORITHMS)),
    _v("JWT_SECRET", "", "secret", "HMAC secret for HS256 tokens.", _str, secret=True),
    _v("JWT_PUBLIC_KEY", "", "str", "PEM public key for RS256/EdDSA tokens.", _str),
    _v("JWT_JWKS_URL", "", "str", "JWKS endpoint to fetch verification keys from.", _str),
    _v("JWT_ISSUER", "", "str", "Required iss claim; empty = not checked.", _str),
    _v("JWT_AUDIENCE", "", "str", "Required aud claim; empty = not checked.", _str),
    _v("JWT_CLOCK_SKEW", "30", "s", "Tolerated clock difference for exp/nbf.", _int(0)),
    _v("JWT_ROLES_CLAIM", "role", "str", "Claim holding a single role.", _str),
    _v("JWT_ROLES_ARRAY_CLAIM", "roles", "str", "Claim holding a list of roles.", _str),
    _v("JWT_ROLE_ADMIN", "admin", "str", "Role name granting everything.", _str),
    _v("JWT_ROLE_READ_WRITE", "read-write", "str", "Role name granting push/pop/ack.", _str),
    _v("JWT_ROLE_READ_ONLY", "read-only", "str", "Role name granting reads only.", _str),
    _v("JWT_JWKS_REFRESH_INTERVAL", "3600", "s",
       "How long fetched JWKS keys are used before the endpoint is read again.", _POSITIVE),
    _v("JWT_JWKS_TIMEOUT_MS", "5000", "ms", "Timeout of one JWKS fetch.", _POSITIVE),
    _v("JWT_SKIP_PATHS", "/health,/metrics/prometheus,/metrics,/", "list",
       "Comma-separated paths served without a token.", _csv),
    # Migration (copy to another PostgreSQL)
    _v("MIGRATION_ROUTES", "false", "bool",
       "Serve /api/v1/migration/*, which make this broker connect to a PostgreSQL the caller "
       "names and copy the queen schema (every message) to it; off, they answer 404 "
       "migration_routes_off. Turn on for a migration window, with JWT_ENABLED=true.", _bool),
    _v("EPHEMERAL_MAX_BYTES", "268435456", "bytes",
       "RAM budget of all ephemeral queues: messages (payloads plus 128 bytes each) and 512 "
       "bytes per queue, partition and group; past it a push, or a pop or configure that would "
       "create one, answers 503 with Retry-After (docs/ephemeral.md).", _POSITIVE),
]


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """The parsed configuration.  Secrets are excluded from ``repr`` so logging it is safe."""

    # HTTP / process
    host: str
    port: int
    worker_id: str
    log_level: str
    log_format: str
    access_log: bool
    max_body_bytes: int
    response_compression_min_bytes: int
    health_live_max_lag_ms: int
    health_ready_spool_max_percent: int
    stop_unready_ms: int
    # Database (pg_host None = embedded PostgreSQL)
    pg_host: str | None
    pg_port: int
    pg_user: str
    pg_password: str = field(repr=False)
    pg_db: str
    pg_use_ssl: bool
    pg_ssl_reject_unauthorized: bool
    pg_target_session_attrs: str | None
    db_pool_size: int
    db_connection_timeout: int
    pg_connect_wait_ms: int
    db_statement_timeout: int
    db_lock_timeout: int
    db_idle_timeout: int
    # Embedded PostgreSQL
    embedded_pg_dir: Path
    embedded_pg_port: int
    # Pop / long poll
    default_timeout: int
    default_batch_size: int
    default_subscription_mode: str
    pop_wait_initial_interval_ms: int
    pop_wait_backoff_threshold: int
    pop_wait_backoff_multiplier: float
    pop_wait_max_interval_ms: int
    # Push / ack batching
    push_max_batch_items: int
    push_max_items_per_request: int
    push_max_concurrent: int
    ack_max_batch_items: int
    ack_max_concurrent: int
    # Encryption
    encryption_key: bytes | None = field(repr=False)
    # Mesh / HA
    queen_server_id: str
    queen_sync_enabled: bool
    queen_mesh_port: int
    queen_mesh_peers: tuple[tuple[str, int], ...]
    queen_mesh_host: str
    queen_advertise_url: str
    queen_sync_secret: str = field(repr=False)
    queen_mesh_require_secret: bool
    queen_mesh_max_skew_ms: int
    queen_mesh_max_frame_bytes: int
    queen_mesh_max_connections: int
    queen_mesh_tls_cert: Path | None
    queen_mesh_tls_key: Path | None
    queen_mesh_tls_ca: Path | None
    queen_sync_heartbeat_ms: int
    queen_sync_dead_threshold_ms: int
    queen_cache_refresh_interval_ms: int
    queen_hotlist: bool
    queen_hotlist_reseed_ms: int
    # Spool
    file_buffer_dir: Path
    file_buffer_flush_ms: int
    file_buffer_max_batch: int
    file_buffer_settle_ms: int | None
    file_buffer_events_per_file: int
    file_buffer_fsync: int | None  # None: always; else the interval in ms
    file_buffer_order_wait_ms: int
    file_buffer_order_forget_ms: int
    file_buffer_max_bytes: int
    # Background jobs
    retention_interval: int
    retention_batch_size: int
    partition_cleanup_days: int
    metrics_retention_days: int
    stats_interval_ms: int
    metrics_flush_ms: int
    dashboard_depth_interval_ms: int
    # Auth
    jwt_enabled: bool
    jwt_algorithm: str
    jwt_secret: str = field(repr=False)
    jwt_public_key: str
    jwt_jwks_url: str
    jwt_issuer: str
    jwt_audience: str
    jwt_clock_skew: int
    jwt_roles_claim: str
    jwt_roles_array_claim: str
    jwt_role_admin: str
    jwt_role_read_write: str
    jwt_role_read_only: str
    jwt_jwks_refresh_interval: int
    jwt_jwks_timeout_ms: int
    jwt_skip_paths: tuple[str, ...]
    # Migration
    migration_routes: bool
    ephemeral_max_bytes: int

    @property
    def embedded_pg(self) -> bool:
        """True when the broker runs its own PostgreSQL (PG_HOST unset)."""
        return self.pg_host is None

    @property
    def pg_servers(self) -> tuple[tuple[str, int], ...]:
        """The PG_HOST entries as (host, port), PG_PORT filling in missing ports."""
        if self.pg_host is None:
            return ()
        return tuple((host, self.pg_port if port is None else port)
                     for host, port in _peers("PG_HOST", self.pg_host))

    @property
    def pg_tls_unverified(self) -> bool:
        """TLS to PostgreSQL that encrypts without verifying the server (an explicit choice:
        PG_USE_SSL=true with PG_SSL_REJECT_UNAUTHORIZED=false)."""
        return self.pg_use_ssl and not self.pg_ssl_reject_unauthorized

    @property
    def pg_session_attrs(self) -> str:
        """target_session_attrs for the connections: read-write when several hosts are listed."""
        if self.pg_target_session_attrs:
            return self.pg_target_session_attrs
        return "read-write" if len(self.pg_servers) > 1 else "any"

    @property
    def mesh_tls(self) -> bool:
        """Mutual TLS on the mesh (all three QUEEN_MESH_TLS_* are set; checked at load)."""
        return self.queen_mesh_tls_cert is not None

    @property
    def settle_ms(self) -> int:
        """FILE_BUFFER_SETTLE_MS, with ``auto`` resolved."""
        if self.file_buffer_settle_ms is not None:
            return self.file_buffer_settle_ms
        if not self.queen_mesh_peers:
            return 0
        return self.db_connection_timeout + 3 * self.file_buffer_flush_ms

    @property
    def mesh_active(self) -> bool:
        """The mesh only does anything when enabled and there is someone to talk to."""
        return self.queen_sync_enabled and bool(self.queen_mesh_peers)

    def log_blocks(self) -> dict[str, dict]:
        """The settings as printed at boot, one block per concern; secrets are masked."""
        if self.embedded_pg:
            database = {"mode": "embedded", "dir": str(self.embedded_pg_dir),
                        "port": self.embedded_pg_port}
        else:
            database = {"mode": "external",
                        "servers": ",".join(f"{h}:{p}" for h, p in self.pg_servers),
                        "target_session_attrs": self.pg_session_attrs,
                        "ssl": self.pg_use_ssl,
                        "ssl_reject_unauthorized": self.pg_ssl_reject_unauthorized}
        database.update(
            user=self.pg_user,
            password=_mask(self.pg_password),
            db=self.pg_db,
            pool_size=self.db_pool_size,
            connection_timeout_ms=self.db_connection_timeout,
            connect_wait_ms=self.pg_connect_wait_ms,
            statement_timeout_ms=self.db_statement_timeout,
            lock_timeout_ms=self.db_lock_timeout,
            idle_timeout_ms=self.db_idle_timeout,
            encryption_key=_mask(self.encryption_key),
        )
        return {
            "config: http": {
                "host": self.host,
                "port": self.port,
                "worker_id": self.worker_id,
                "log_level": self.log_level,
                "log_format": self.log_format,
                "access_log": self.access_log,
                "max_body_bytes": self.max_body_bytes,
                "response_compression_min_bytes": self.response_compression_min_bytes,
                "jwt_enabled": self.jwt_enabled,
                "jwt_algorithm": self.jwt_algorithm,
                "jwt_secret": _mask(self.jwt_secret),
                "migration_routes": self.migration_routes,
            },
            "config: database": database,
            "config: pop": {
                "default_timeout_ms": self.default_timeout,
                "default_batch_size": self.default_batch_size,
                "default_subscription_mode": self.default_subscription_mode,
                "wait_initial_ms": self.pop_wait_initial_interval_ms,
                "wait_backoff_threshold": self.pop_wait_backoff_threshold,
                "wait_backoff_multiplier": self.pop_wait_backoff_multiplier,
                "wait_max_ms": self.pop_wait_max_interval_ms,
                "push_max_batch_items": self.push_max_batch_items,
                "push_max_items_per_request": self.push_max_items_per_request,
                "push_max_concurrent": self.push_max_concurrent,
                "ack_max_batch_items": self.ack_max_batch_items,
                "ack_max_concurrent": self.ack_max_concurrent,
            },
            "config: sync": {
                "enabled": self.queen_sync_enabled,
                "mesh_active": self.mesh_active,
                "server_id": self.queen_server_id,
                "mesh_port": self.queen_mesh_port,
                "peers": [f"{host}:{port}" for host, port in self.queen_mesh_peers],
                "secret": _mask(self.queen_sync_secret),
                "heartbeat_ms": self.queen_sync_heartbeat_ms,
                "dead_threshold_ms": self.queen_sync_dead_threshold_ms,
                "cache_refresh_ms": self.queen_cache_refresh_interval_ms,
                "auth": "hmac" if self.queen_sync_secret else "off",
                "mesh_host": self.queen_mesh_host,
                "advertise_url": self.queen_advertise_url,
                "tls": "on" if self.mesh_tls else "off",
            },
        }


def _mask(secret: str | bytes | None) -> str:
    if not secret:
        return "<unset>"
    unit = "bytes" if isinstance(secret, bytes) else "chars"
    return f"<set:{len(secret)} {unit}>"


# Settings and VARIABLES are written out separately for readability; this keeps them in step.
assert [f.name for f in fields(Settings)] == [v.attr for v in VARIABLES], \
    "Settings fields and VARIABLES must list the same attributes in the same order"


def _raw(environ: Mapping[str, str], var: Variable) -> tuple[str, str] | None:
    """(name actually used, value) of the first set name among the variable and its aliases."""
    for name in (var.name, *var.aliases):
        value = environ.get(name)
        if value is None:
            continue
        if not var.secret:
            value = value.strip()
        if value.strip():
            return name, value
    return None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse ``environ`` (default ``os.environ``) into Settings, or raise ConfigError."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for var in VARIABLES:
        found = _raw(env, var)
        if found is None:
            values[var.attr] = var.default_value(env)
        else:
            values[var.attr] = var.parse(*found)

    # Peers without an explicit port use this broker's mesh port.
    values["queen_mesh_peers"] = tuple(
        (host, values["queen_mesh_port"] if port is None else port)
        for host, port in values["queen_mesh_peers"]
    )

    # The mesh binds where the HTTP API does unless told otherwise.
    if values["queen_mesh_host"] is None:
        values["queen_mesh_host"] = values["host"]
    if values["queen_advertise_url"] is None:
        values["queen_advertise_url"] = f"http://{values['host']}:{values['port']}"
    if values["queen_mesh_max_connections"] is None:
        values["queen_mesh_max_connections"] = 4 * len(values["queen_mesh_peers"]) + 4

    _check_relations(values)
    return Settings(**values)


# Variables of the same prefixes that are not the broker's, but are no mistake either.
OTHER_KNOWN_VARIABLES = frozenset({
    "QUEEN_URL", "QUEEN_TOKEN",  # queenctl's
})
# What Kubernetes and docker links set for a service named "queen" (QUEEN_SERVICE_HOST,
# QUEEN_PORT, QUEEN_PORT_6632_TCP_ADDR...): no one's typo.
_SERVICE_LINK = re.compile(r"_SERVICE_(HOST|PORT)|_PORT_\d+_(TCP|UDP)")


def _service_link(name: str, value: str) -> bool:
    return bool(_SERVICE_LINK.search(name)) or (
        name.endswith("_PORT") and value.startswith(("tcp://", "udp://")))
WATCHED_PREFIXES = ("QUEEN_", "PG_", "JWT_", "DB_", "FILE_BUFFER_", "EMBEDDED_PG_", "POP_",
                    "PUSH_", "ACK_")


def suspicious_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per environment variable that looks like one of ours but is not (a
    typo is otherwise silently ignored): names with one of our prefixes, and names close to
    a known one."""
    env = os.environ if environ is None else environ
    known = {name for var in VARIABLES for name in (var.name, *var.aliases)}
    warnings = []
    for name in sorted(env):
        if name in known or name in OTHER_KNOWN_VARIABLES or _service_link(name, env[name]):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        # Only a name that starts like ours: PIP_DEFAULT_TIMEOUT is no typo of DEFAULT_TIMEOUT.
        if close and close[0][:3] == name[:3]:
            warnings.append(f"{name} is not a queen-broker variable (did you mean {close[0]}?); "
                            f"it is ignored")
        elif name.startswith(WATCHED_PREFIXES):
            warnings.append(f"{name} is not a queen-broker variable; it is ignored "
                            f"(docs/operations/configuration.md lists them all)")
    return warnings


MESH_TLS_VARIABLES = ("QUEEN_MESH_TLS_CERT", "QUEEN_MESH_TLS_KEY", "QUEEN_MESH_TLS_CA")


def _check_relations(v: dict[str, Any]) -> None:
    """Rules that involve more than one variable."""
    if v["pop_wait_max_interval_ms"] < v["pop_wait_initial_interval_ms"]:
        raise ConfigError(
            f"POP_WAIT_MAX_INTERVAL_MS must be >= POP_WAIT_INITIAL_INTERVAL_MS "
            f"({v['pop_wait_initial_interval_ms']}), got {v['pop_wait_max_interval_ms']}"
        )
    # A dead threshold at or below the heartbeat would declare healthy peers dead between beats.
    if v["queen_sync_dead_threshold_ms"] <= v["queen_sync_heartbeat_ms"]:
        raise ConfigError(
            f"QUEEN_SYNC_DEAD_THRESHOLD_MS must be greater than QUEEN_SYNC_HEARTBEAT_MS "
            f"({v['queen_sync_heartbeat_ms']}), got {v['queen_sync_dead_threshold_ms']}"
        )
    # Forgetting a spool within the bounded wait would end holds the wait still keeps.
    forget, wait = v["file_buffer_order_forget_ms"], v["file_buffer_order_wait_ms"]
    if forget and forget < 2 * wait:
        raise ConfigError(
            f"FILE_BUFFER_ORDER_FORGET_MS must be 0 or at least twice FILE_BUFFER_ORDER_WAIT_MS "
            f"({2 * wait}), got {forget}")
    if v["queen_mesh_require_secret"] and not v["queen_sync_secret"]:
        raise ConfigError("QUEEN_MESH_REQUIRE_SECRET is true but QUEEN_SYNC_SECRET is empty")
    tls = {name: v[name.lower()] for name in MESH_TLS_VARIABLES}
    if any(tls.values()):
        missing = [name for name, path in tls.items() if path is None]
        if missing:
            raise ConfigError(f"mesh TLS needs all of {', '.join(MESH_TLS_VARIABLES)}; "
                              f"{', '.join(missing)} not set")
        for name, path in tls.items():
            if not path.is_file():
                raise ConfigError(f"{name} names {str(path)!r}, which is not a readable file")
    if v["jwt_enabled"]:
        algorithm = v["jwt_algorithm"]
        has_public = bool(v["jwt_public_key"] or v["jwt_jwks_url"])
        if algorithm == "HS256" and not v["jwt_secret"]:
            raise ConfigError("JWT_ENABLED with JWT_ALGORITHM=HS256 requires JWT_SECRET")
        if algorithm in ("RS256", "EdDSA") and not has_public:
            raise ConfigError(
                f"JWT_ENABLED with JWT_ALGORITHM={algorithm} requires JWT_PUBLIC_KEY or JWT_JWKS_URL"
            )
        if algorithm == "auto" and not (has_public or v["jwt_secret"]):
            raise ConfigError(
                "JWT_ENABLED with JWT_ALGORITHM=auto requires JWT_SECRET, JWT_PUBLIC_KEY "
                "or JWT_JWKS_URL"
            )


# --------------------------------------------------------------------------------------------
# Documentation
# --------------------------------------------------------------------------------------------

def markdown_table() -> str:
    """All variables as a Markdown table (Variable | Default | Meaning) for
    docs/operations/configuration.md."""
    lines = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for var in VARIABLES:
        if var.default is None:
            default = "*(unset)*"
        elif var.default == "":
            default = '`""`'
        else:
            default = f"`{var.default}`"
        doc = var.doc.replace("|", "\\|")
        lines.append(f"| `{var.name}` | {default} | {doc} |")
    return "\n".join(lines) + "\n"
