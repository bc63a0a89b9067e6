"""Metrics (docs/wire-contract.md §15.2, §15.3): JSON at /metrics, Prometheus text at
/metrics/prometheus.

The Prometheus page is rendered by prometheus-client from a registry built per
request: the async figures (spool stats, database counts) are gathered first
into a snapshot, then a synchronous collector turns the snapshot into metric
families. The latency histograms, the rate meters and the process figures are
the telemetry's (broker/core/telemetry.py): this module only reads and renders.
"""
from __future__ import annotations

from typing import Any

from loguru import logger
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.core.telemetry import telemetry
from broker.http.responses import json
from broker.http.types import BrokerApp, BrokerRequest
from broker.http.wire import ephemeral as ephemeral_wire
from broker.service import ephemeral as ephemeral_service
from broker.service import metrics as service
from broker.service.drain import spool_stats
from broker.service.gauges import gauges

bp = Blueprint("ops_metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def wants_prometheus_text(request: BrokerRequest) -> bool:
    """A Prometheus scraper (or promtool via curl -H) asks for the text format in
    its Accept header; the official client and browsers send */* and get JSON."""
    accept = request.headers.get("accept", "").lower()
    return "text/plain" in accept or "openmetrics" in accept


@bp.get("/metrics")
async def metrics_json(request: BrokerRequest) -> HTTPResponse:
    """JSON (docs/wire-contract.md §15.2) by default; Prometheus text for a scraper, so a
    scrape job pointed at /metrics works as well as one at /metrics/prometheus."""
    if wants_prometheus_text(request):
        return await prometheus_response(request.app)
    g = gauges(request.app.ctx)
    snap = telemetry.snapshot()
    total_requests = sum(snap["requests"].values())
    proc = telemetry.process.figures()
    spool = await spool_stats(request.app.ctx)
    queues, state = await service.json_figures(request.app.ctx)  # None: database away
    rates = telemetry.rates(total_requests)
    return json({
        "uptime": snap["uptime_s"],
        "requests": {"total": total_requests, "rate": rates["requests"],
                     "errors": sum(snap["errors"].values())},
        "messages": {"total": telemetry.pushed_total(), "rate": rates["pushed"],
                     "processed": telemetry.processed_total(),
                     "processedRate": rates["processed"],
                     "byStatus": snap["messages"],
                     # push items refused, by reason (max_size: past the queue's maxSize)
                     "refused": snap["push_refused"]},
        "database": {"poolSize": g["db_pool_size"], "maxPoolSize": g["db_pool_max"],
                     "idleConnections": g["db_pool_idle"],
                     "activeConnections": g["db_pool_size"] - g["db_pool_idle"],
                     "waitingRequests": service.pool_waiting(request.app.ctx)},
        "memory": {"rss": proc.get("rss", 0), "vms": proc.get("vms", 0)},
        "cpu": {"user": proc.get("cpu_user", 0), "system": proc.get("cpu_system", 0),
                "percent": proc.get("cpu_percent", 0), "threads": proc.get("threads", 0)},
        "maintenanceMode": g["maintenance_mode"], "popMaintenanceMode": g["pop_maintenance_mode"],
        "longPollsInFlight": g["long_polls_in_flight"],
        "spool": {key: spool[key] for key in ("pendingCount", "pendingBytes", "maxBytes",
                                              "rejectedFull", "quarantinedEvents", "dbHealthy",
                                              "orderExceptions", "registeredPartitions",
                                              "staging")},
        # per queue, as of the last stats cycle (null while the database is unreachable)
        "queues": queues,
        # key/value namespaces, locks, timers: exact now (counters: this broker's)
        "state": state,
    })


async def snapshot(app: BrokerApp) -> dict[str, Any]:
    """Every figure of the Prometheus page, gathered before rendering."""
    snap: dict[str, Any] = {"gauges": gauges(app.ctx), "telemetry": telemetry.snapshot(),
                            "process": telemetry.process.figures(),
                            "pool_waiting": service.pool_waiting(app.ctx)}
    snap["ephemeral"] = ephemeral_service.figures(app.ctx)
    try:
        snap["spool"] = await spool_stats(app.ctx)
    except Exception as exc:  # the spool actor stopped: report what we can
        logger.warning("metrics: spool stats unavailable: {}", exc)
        snap["spool"] = None
    snap.update(await service.prometheus_figures(app.ctx))
    return snap


QUEUE_GAUGES = (
    ("total", "queen_queue_messages", "Messages stored per queue (stats table)"),
    ("pending", "queen_queue_pending", "Pending messages per queue (stats table)"),
    ("processing", "queen_queue_processing", "Messages under lease per queue (stats table)"),
    ("completed", "queen_queue_completed", "Completed messages per queue (stats table)"),
    ("deadLetter", "queen_queue_dead_letter", "Dead-lettered messages per queue (stats table)"),
)
"""Per-queue gauges: the figures of broker/store/figures_sql.py, as of the last stats cycle."""


STREAM_GAUGES = (
    ("state_rows", "queen_stream_state_rows", "State rows per streaming query"),
    ("state_bytes", "queen_stream_state_bytes", "Stored bytes of state values per query"),
    ("state_partitions", "queen_stream_state_partitions",
     "Source partitions holding state, per streaming query"),
    ("cycle_partitions", "queen_stream_cycle_partitions",
     "Source partitions that committed a cycle, per streaming query"),
)
"""Per-query gauges: the figures of /api/v1/status/streams (streams_sql.STREAMS_STATUS)."""


class SnapshotCollector:
    """Turns one snapshot into metric families (prometheus collectors are sync)."""

    def __init__(self, snap: dict[str, Any]):
        self.snap = snap

    def collect(self):
        s = self.snap
        g, t, p = s["gauges"], s["telemetry"], s["process"]

        def gauge(name, doc, value, labels=None, samples=None):
            fam = GaugeMetricFamily(name, doc, labels=labels)
            if samples is not None:
                for label_values, v in samples:
                    fam.add_metric(label_values, v)
            elif value is not None:
                fam.add_metric([], value)
            return fam

        def counter(name, doc, labels, samples):
            fam = CounterMetricFamily(name, doc, labels=labels)
            for label_values, v in samples:
                fam.add_metric(label_values, v)
            return fam

        yield gauge("queen_uptime_seconds", "Seconds since this broker started", t["uptime_s"])
        if p:
            yield counter("queen_process_cpu_seconds", "CPU time of the broker process",
                          ["mode"], [(["user"], p["cpu_user"]), (["system"], p["cpu_system"])])
            yield gauge("queen_process_resident_memory_bytes", "Resident memory", p["rss"])
            yield gauge("queen_process_virtual_memory_bytes", "Virtual memory", p["vms"])
            yield gauge("queen_process_threads", "Threads of the broker process", p["threads"])
        yield gauge("queen_db_pool_size", "Open pooled PostgreSQL connections", g["db_pool_size"])
        yield gauge("queen_db_pool_idle", "Idle pooled connections", g["db_pool_idle"])
        yield gauge("queen_db_pool_active", "Pooled connections in use",
                    g["db_pool_size"] - g["db_pool_idle"])
        yield gauge("queen_db_pool_max", "Pool capacity", g["db_pool_max"])
        yield gauge("queen_db_pool_waiting", "Requests waiting for a pooled connection",
                    s["pool_waiting"])
        yield gauge("queen_database_up", "1 when the database answered the metric queries",
                    0 if s["db"] is None else 1)
        spool = s["spool"]
        if spool is not None:
            yield gauge("queen_file_buffer_pending", "Spooled pushes not yet written",
                        spool.get("pendingCount", 0))
            yield gauge("queen_file_buffer_pending_files", "Spool files waiting to drain",
                        spool.get("pendingFiles", 0))
            yield gauge("queen_file_buffer_failed", "Spooled pushes that could not be written",
                        spool.get("failedCount", 0))
            yield gauge("queen_file_buffer_db_healthy", "1 when the spool sees the database",
                        1 if spool.get("dbHealthy") else 0)
            yield gauge("queen_file_buffer_pending_bytes", "Bytes of spool files waiting to drain",
                        spool.get("pendingBytes", 0))
            yield gauge("queen_file_buffer_max_bytes", "Spool cap (FILE_BUFFER_MAX_BYTES)",
                        spool.get("maxBytes", 0))
            yield gauge("queen_file_buffer_quarantined_events",
                        "Spooled pushes set aside because PostgreSQL refused them",
                        spool.get("quarantinedEvents", 0))
            yield counter("queen_file_buffer_order_exceptions_total",
                          "Spooled pushes that landed after a push accepted later", [],
                          [([], spool.get("orderExceptions", 0))])
            yield gauge("queen_file_buffer_registered_partitions",
                        "Partitions this spool holds back cluster-wide (queen.spool_backlog)",
                        spool.get("registeredPartitions", 0))
            yield counter("queen_file_buffer_rejected_full_total",
                          "Pushed items refused with 503 because the spool was full", [],
                          [([], spool.get("rejectedFull", 0))])
            yield counter("queen_file_buffer_syncs_total",
                          "fdatasync calls that made spooled pushes durable", [],
                          [([], spool.get("syncs", 0))])
            yield counter("queen_file_buffer_sync_failures_total",
                          "Spool fsyncs that failed (their pushes were answered 503)", [],
                          [([], spool.get("syncFailures", 0))])
            yield counter("queen_file_buffer_unsafe_acknowledged_total",
                          "Pushes acknowledged before a sync that then failed "
                          "(FILE_BUFFER_FSYNC=interval only)", [],
                          [([], spool.get("unsafeAcknowledged", 0))])
            yield counter("queen_file_buffer_damaged_records_total",
                          "Spool records that failed their checksum (quarantined)", [],
                          [([], spool.get("damagedRecords", 0))])
            yield counter("queen_file_buffer_torn_bytes_total",
                          "Bytes of torn last records cut off at start (never acknowledged)",
                          [], [([], spool.get("tornBytesCut", 0))])
            staging = spool.get("staging") or {}
            yield gauge("queen_staged_events",
                        "Staged pushes (queen.staged) not merged into the queues yet",
                        staging.get("stagedEvents", 0))
            yield counter("queen_staged_merged_total",
                          "Staged pushes this broker's merge stored in the queues", [],
                          [([], staging.get("mergedEvents", 0))])
            yield counter("queen_staged_duplicates_total",
                          "Staged pushes this broker's merge dropped as duplicates", [],
                          [([], staging.get("duplicatesDropped", 0))])
            yield gauge("queen_staged_merge_rate",
                        "Staged pushes merged per second here over the last 10 s",
                        staging.get("mergeRatePerSecond", 0))
            yield gauge("queen_staged_eta_seconds",
                        "Expected seconds until staging is empty at this broker's merge rate "
                        "(-1: not merging here)",
                        -1 if staging.get("etaSeconds") is None else staging["etaSeconds"])
        holds = s.get("spool_holds")
        if holds is not None:  # cluster-wide, from PostgreSQL (docs/behaviour.md §5.8)
            yield gauge("queen_spool_silent_held_partitions",
                        "Partitions held in queen.spool_backlog by spools silent for "
                        "FILE_BUFFER_ORDER_WAIT_MS (dead, or cut off from PostgreSQL)",
                        holds.silent_partitions)
            yield gauge("queen_spool_silent_spools",
                        "Spools holding partitions whose last heartbeat is older than "
                        "FILE_BUFFER_ORDER_WAIT_MS", len(holds.silent_spools))
        ended = t.get("spool_holds_ended", {})
        yield counter("queen_spool_holds_ended_total",
                      "Spool holds (queen.spool_backlog rows) this broker removed, by reason "
                      "(expired: the spool was silent for FILE_BUFFER_ORDER_FORGET_MS; "
                      "released: by an operator)", ["reason"],
                      [(["expired"], ended.get("expired", 0)),
                       (["released"], ended.get("released", 0))])
        yield gauge("queen_long_polls_in_flight", "Long-poll pops waiting on this broker",
                    g["long_polls_in_flight"])
        yield gauge("queen_maintenance_mode_enabled", "Push maintenance mode",
                    1 if g["maintenance_mode"] else 0)
        yield gauge("queen_pop_maintenance_mode_enabled", "Pop maintenance mode",
                    1 if g["pop_maintenance_mode"] else 0)
        yield counter("queen_messages_total", "Messages seen by this broker, by outcome",
                      ["status"], sorted(([k], v) for k, v in t["messages"].items()))
        yield counter("queen_push_refused_total",
                      "Push items this broker refused, by reason (max_size: the queue's "
                      "depth would pass its maxSize)", ["reason"],
                      sorted(([k], v) for k, v in t.get("push_refused", {}).items()))
        yield counter("queen_stream_cycles", "Streams cycles on this broker, by outcome",
                      ["outcome"], sorted(([k], v) for k, v in t["stream_cycles"].items()))
        pops = t.get("pops", {})
        yield counter("queen_pop_claims_total", "Claim statements (queen.pop_messages) issued",
                      [], [([], pops.get("claim_queries", 0))])
        autopilot = t.get("autopilot", {})
        yield counter("queen_pop_autopilot_decisions_total",
                      "Pops sized by pop autopilot, by the knob the broker chose", ["knob"],
                      [(["batch"], autopilot.get("batch", 0)),
                       (["partitions"], autopilot.get("partitions", 0))])
        yield counter("queen_long_poll_rechecks_total",
                      "Timer re-checks of parked pops: own claim, or answered by another parked "
                      "pop's check of the same cohort", ["kind"],
                      [(["shared"], pops.get("shared_rechecks", 0)),
                       (["own"], pops.get("timer_rechecks", 0) - pops.get("shared_rechecks", 0))])
        yield counter("queen_requests_total", "HTTP requests by route", ["route"],
                      sorted(([k], v) for k, v in t["requests"].items()))
        yield counter("queen_request_errors_total", "HTTP 5xx answers by route", ["route"],
                      sorted(([k], v) for k, v in t["errors"].items()))
        db = s["db"]
        if db is not None:
            for key, name, doc in QUEUE_GAUGES:
                yield gauge(name, doc, None, ["queue"],
                            [([q], f[key]) for q, f in sorted(db["queues"].items())])
            yield gauge("queen_dlq_depth", "Dead letters, all queues",
                        sum(n for _q, n in db["dlq"]))
            yield gauge("queen_dlq_depth_by_queue", "Dead letters per queue", None, ["queue"],
                        [([q], n) for q, n in db["dlq"]])
            yield gauge("queen_leases_active", "Live (partition, group) leases", db["leases"])
            streams = db["streams"]
            yield gauge("queen_stream_queries", "Registered streaming queries", len(streams))
            for key, name, doc in STREAM_GAUGES:
                yield gauge(name, doc, None, ["query"], [([r["name"]], r[key]) for r in streams])
            yield counter("queen_stream_query_cycles", "Committed cycles per streaming query "
                          "(every broker's, from PostgreSQL)", ["query"],
                          [([r["name"]], r["cycles"]) for r in streams])
            yield gauge("queen_stream_last_cycle_timestamp_seconds",
                        "Unix time of the query's newest committed cycle (PostgreSQL's clock)",
                        None, ["query"], [([r["name"]], r["last_cycle_at"].timestamp())
                                          for r in streams if r["last_cycle_at"] is not None])
        if s.get("state") is not None:
            yield from state_families(s["state"], gauge, counter)
        if s.get("ephemeral") is not None:
            yield from ephemeral_wire.metric_families(s["ephemeral"], gauge, counter)
        forwards = t.get("ephemeral_forwards", {})
        yield counter("queen_ephemeral_forwarded_total",
                      "Ephemeral requests passed on to the queue's owner, by outcome "
                      "(forwarded; unreachable: answered 503)", ["outcome"],
                      [(["forwarded"], forwards.get("forwarded", 0)),
                       (["unreachable"], forwards.get("unreachable", 0))])
        yield counter("queen_ephemeral_ownership_changes_total",
                      "Changes of the brokers alive this broker saw: each may move ephemeral "
                      "queues to a new, empty owner", [], [([], forwards.get("members", 0))])
        mesh = g.get("mesh")
        if mesh is not None:
            yield counter("queen_transport_messages", "Mesh frames by direction", ["dir"],
                          [(["sent"], mesh.get("messages_sent", 0)),
                           (["received"], mesh.get("messages_received", 0)),
                           (["dropped"], mesh.get("messages_dropped", 0))])
            yield gauge("queen_servers", "Mesh peers by liveness", None, ["state"],
                        [(["alive"], mesh.get("servers_alive", 0)),
                         (["dead"], mesh.get("servers_dead", 0))])
            yield counter("queen_mesh_rejections", "Mesh connections closed, by reason",
                          ["reason"], sorted(([k], v) for k, v in
                                             (mesh.get("rejections") or {}).items()))
            yield counter("queen_mesh_handshake_failures",
                          "Mesh connections closed before a HELLO was accepted", [],
                          [([], mesh.get("handshake_failures", 0))])
            yield gauge("queen_mesh_auth_enabled", "1 when the mesh authenticates (a secret is set)",
                        1 if mesh.get("auth") == "hmac" else 0)
            yield gauge("queen_mesh_tls_enabled", "1 when the mesh runs mutual TLS",
                        1 if mesh.get("tls") else 0)
            yield gauge("queen_mesh_inbound_connections", "Open accepted mesh connections",
                        mesh.get("inbound_connections", 0))


def state_families(st: dict[str, Any], gauge, counter):
    """Key/value, locks and timers (service/state_ops.metric_figures)."""
    kv, locks, timers = st["kv"], st["locks"], st["timers"]
    yield gauge("queen_kv_keys", "Live key/value keys per namespace", None, ["namespace"],
                [([n["namespace"]], n["liveKeys"]) for n in kv])
    yield gauge("queen_kv_expired_keys",
                "Key/value rows past their TTL, not yet deleted by the retention job", None,
                ["namespace"], [([n["namespace"]], n["expired"]) for n in kv])
    yield gauge("queen_kv_bytes", "JSON bytes of the live values per namespace", None,
                ["namespace"], [([n["namespace"]], n["bytes"]) for n in kv])
    yield gauge("queen_locks_held", "Locks and semaphores with at least one live permit",
                locks["held"])
    yield gauge("queen_lock_permits_held", "Live lock and semaphore permits", locks["permits"])
    yield counter("queen_lock_acquires", "Lock acquires that took a permit (this broker)", [],
                  [([], locks["acquired"])])
    yield counter("queen_lock_renewals", "Lock renews that got a new token (this broker)", [],
                  [([], locks["renewed"])])
    yield counter("queen_lock_refusals",
                  "Lock operations refused: acquire of a held lock, renew or release of a "
                  "permit no longer the caller's (this broker)", ["op"],
                  [(["acquire"], locks["acquireRefused"]), (["renew"], locks["renewRefused"]),
                   (["release"], locks["releaseRefused"])])
    yield gauge("queen_timers_pending", "Pending timers per queue", None, ["queue"],
                [([q["queue"]], q["pending"]) for q in timers["byQueue"]])
    yield gauge("queen_timers_overdue", "Timers due and not delivered yet, per queue", None,
                ["queue"], [([q["queue"]], q["overdue"]) for q in timers["byQueue"]])
    yield counter("queen_timers_delivered", "Timers this broker delivered as messages", [],
                  [([], timers["delivered"])])
    yield counter("queen_timers_cancelled", "Timers cancelled through this broker", [],
                  [([], timers["cancelled"])])


def render(snap: dict[str, Any]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap))
    registry.register(telemetry.request_duration)
    registry.register(telemetry.cycle_duration)
    registry.register(telemetry.autopilot_batch)
    return generate_latest(registry)


@bp.get("/metrics/prometheus")
async def metrics_prometheus(request: BrokerRequest) -> HTTPResponse:
    return await prometheus_response(request.app)


async def prometheus_response(app: BrokerApp) -> HTTPResponse:
    """The Prometheus page of ``app`` (both routes answer it)."""
    return HTTPResponse(render(await snapshot(app)), status=200, content_type=CONTENT_TYPE)

