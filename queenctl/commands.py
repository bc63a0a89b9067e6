"""queenctl's commands: each is one or two calls of the broker's HTTP API (see /docs on the
broker for every route), printed as a table or, with --json, as the broker's JSON."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import click

from queenctl import client
from queenctl.client import Broker, CtlError, seg
from queenctl.output import emit, pairs, table

DEFAULT_URL = "http://127.0.0.1:6632"


@dataclass
class State:
    url: str
    token: str | None
    timeout: float
    json: bool
    _broker: Broker | None = None

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = Broker(self.url, self.token, self.timeout)
        return self._broker


def call(ctx: click.Context, method: str, path: str, **kwargs: Any) -> Any:
    return ctx.obj.broker.call(method, path, **kwargs)


def json_value(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON ({exc.msg})", param_hint=what) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--url", envvar="QUEEN_URL", default=DEFAULT_URL, show_default=True,
              help="The broker's base URL (or QUEEN_URL).")
@click.option("--token", envvar="QUEEN_TOKEN", default=None,
              help="JWT bearer token, for a broker with JWT_ENABLED (or QUEEN_TOKEN).")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for each answer.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the broker's JSON answer instead of a table.")
@click.version_option(package_name="queen-broker", prog_name="queenctl")
@click.pass_context
def cli(ctx: click.Context, url: str, token: str | None, timeout: float, as_json: bool) -> None:
    """Operate a queen-broker over its HTTP API.

    \b
    Exit codes: 0 done; 1 the broker refused or the operation failed; 2 bad command line;
    3 not found; 4 authentication or permission (401/403); 5 no broker reachable at --url;
    6 the broker's database is unavailable (503, retry); 7 other server error.
    Errors are one line on stderr.
    """
    ctx.obj = State(url, token, timeout, as_json)
    ctx.call_on_close(lambda: ctx.obj._broker.close() if ctx.obj._broker else None)


# -- status, peers, api --------------------------------------------------------------


@cli.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """The broker's health, counts, maintenance flags and spool."""
    health = call(ctx, "GET", "/health", ok=(503,))
    overview = call(ctx, "GET", "/api/v1/resources/overview") \
        if health.get("database") == "connected" else None
    maint = call(ctx, "GET", "/api/v1/system/maintenance")
    answer = {"health": health, "overview": overview, "maintenance": maint}

    def human(a: dict) -> str:
        h, o, m = a["health"], a["overview"] or {}, a["maintenance"]
        msgs = o.get("messages", {})
        spool = h.get("spool", {})
        return pairs([
            ("broker", f"{h.get('server')} ({ctx.obj.url}), version {h.get('brokerVersion')}"),
            ("status", h.get("status")), ("database", h.get("database")),
            ("queues", o.get("queues")), ("partitions", o.get("partitions")),
            ("messages", " ".join(f"{k}={msgs.get(k)}" for k in
                                  ("total", "pending", "processing", "completed", "deadLetter"))
             if msgs else None),
            ("push maintenance", m.get("maintenanceMode")),
            ("pop maintenance", m.get("popMaintenanceMode")),
            ("spool pending", spool.get("pendingCount")),
            ("quarantined", m.get("quarantinedEvents")),
            ("mesh peers", _peer_summary(h.get("shared_state", {}).get("transport"))),
        ])
    emit(ctx, answer, human)
    if health.get("status") != "healthy":
        sys.exit(client.UNAVAILABLE)


def _peer_summary(transport: dict | None) -> str:
    if not transport:
        return "none (mesh off)"
    peers = transport.get("peers", [])
    up = sum(1 for p in peers if p.get("connected"))
    return f"{up}/{len(peers)} connected"


@cli.command()
@click.pass_context
def peers(ctx: click.Context) -> None:
    """The mesh peers this broker dials, and whether each is connected."""
    state = call(ctx, "GET", "/api/v1/system/shared-state")
    transport = state.get("transport") or {}

    def human(_s: dict) -> str:
        if not transport:
            return "mesh off: no peers configured (QUEEN_MESH_PEERS)"
        head = pairs([("server", transport.get("server_id")),
                      ("listening", f"{transport.get('host')}:{transport.get('port')}"),
                      ("tls", transport.get("tls")),
                      ("alive / dead", f"{transport.get('servers_alive')} / "
                                       f"{transport.get('servers_dead')}")])
        return head + "\n\n" + table(transport.get("peers", []), [
            ("host", "host"), ("port", "port"), ("connected", "connected"),
            ("address", "resolved_ip")])
    emit(ctx, state, human)


@cli.command()
@click.argument("method", type=click.Choice(["GET", "POST", "DELETE", "PUT"],
                                            case_sensitive=False))
@click.argument("path")
@click.option("--data", "-d", help="JSON body ('-' reads it from stdin).")
@click.pass_context
def api(ctx: click.Context, method: str, path: str, data: str | None) -> None:
    """Any route of the HTTP API, e.g. `queenctl api GET /api/v1/status`.

    PATH may carry a query string. The answer is printed as JSON. Every route is in the
    broker's reference at /docs.
    """
    if data == "-":
        data = sys.stdin.read()
    body = json_value(data, "--data") if data else None
    path, _, query = path.partition("?")
    params = {key: value for key, _, value in (p.partition("=") for p in query.split("&") if p)}
    answer = call(ctx, method.upper(), "/" + path.lstrip("/"), params=params, body=body)
    click.echo(json.dumps(answer, indent=2, ensure_ascii=False) if not isinstance(answer, str)
               else answer)


# -- queues --------------------------------------------------------------------------


@cli.group()
def queues() -> None:
    """List, show, configure and delete queues."""


COUNT_COLUMNS = [("pending", "messages.pending"), ("processing", "messages.processing"),
                 ("completed", "messages.completed"), ("dead", "messages.deadLetter")]


@queues.command("list")
@click.pass_context
def queues_list(ctx: click.Context) -> None:
    """Every queue with its message counts."""
    answer = call(ctx, "GET", "/api/v1/resources/queues")
    emit(ctx, answer, lambda a: table(a["queues"], [
        ("queue", "name"), ("namespace", "namespace"), ("task", "task"),
        ("partitions", "partitions"), *COUNT_COLUMNS]))


@queues.command("show")
@click.argument("queue")
@click.pass_context
def queues_show(ctx: click.Context, queue: str) -> None:
    """A queue's options, totals and partitions."""
    answer = call(ctx, "GET", f"/api/v1/resources/queues/{seg(queue)}")

    def human(a: dict) -> str:
        head = pairs([("queue", a["name"]), ("namespace", a.get("namespace")),
                      ("task", a.get("task")), ("created", a.get("createdAt")),
                      *[(f"option {k}", v) for k, v in a.get("options", {}).items()],
                      ("totals", " ".join(f"{k}={v}" for k, v in a["totals"].items()))])
        return head + "\n\n" + table(a["partitions"], [
            ("partition", "name"), ("pending", "stats.pending"),
            ("processing", "stats.processing"), ("completed", "stats.completed"),
            ("dead", "stats.deadLetter"), ("oldest", "oldestMessage"),
            ("newest", "newestMessage")])
    emit(ctx, answer, human)


@queues.command("configure")
@click.argument("queue")
@click.option("--namespace", help="The queue's namespace.")
@click.option("--task", help="The queue's task.")
@click.option("--option", "-o", "options", multiple=True, metavar="NAME=VALUE",
              help="A queue option, e.g. -o leaseTime=60 -o deadLetterQueue=true (repeatable; "
                   "see the broker's /docs for every option).")
@click.pass_context
def queues_configure(ctx: click.Context, queue: str, namespace: str | None, task: str | None,
                     options: tuple[str, ...]) -> None:
    """Create QUEUE or change its options (options left out keep their value).

    Exit 1 when the broker ignored an option it was sent (a misspelt name, or a value it
    does not act on; its warnings on stderr): the other options were applied."""
    parsed: dict[str, Any] = {}
    for item in options:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--option")
        parsed[name] = json_value(value, f"--option {name}")
    body: dict[str, Any] = {"queue": queue, "options": parsed}
    if namespace is not None:
        body["namespace"] = namespace
    if task is not None:
        body["task"] = task
    answer = call(ctx, "POST", "/api/v1/configure", body=body)
    emit(ctx, answer, lambda a: f"configured {a['queue']}: " + " ".join(
        f"{k}={v}" for k, v in a["options"].items()))
    ignored = (answer.get("ignored") or []) if isinstance(answer, dict) else []
    if ignored:  # applied what it could, but not all that was asked: not a success
        for warning in answer.get("warnings") or ():
            click.echo(f"queenctl: warning: {warning}", err=True)
        raise CtlError(f"the broker ignored {len(ignored)} option(s): {', '.join(ignored)} "
                       "(the other options were applied)", client.FAILED)


yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")


def confirm(ctx: click.Context, yes: bool, what: str) -> None:
    if not yes and not click.confirm(f"{what}?", err=True):
        raise CtlError("not confirmed (pass --yes to skip the question)", client.FAILED)


@queues.command("delete")
@click.argument("queue")
@yes_option
@click.pass_context
def queues_delete(ctx: click.Context, queue: str, yes: bool) -> None:
    """Delete QUEUE with every message in it. Exit 3 when there was no such queue."""
    confirm(ctx, yes, f"delete queue {queue!r} and all its messages")
    answer = call(ctx, "DELETE", f"/api/v1/resources/queues/{seg(queue)}")
    emit(ctx, answer, lambda a: f"deleted {queue}" if a["existed"] else f"no queue {queue}")
    if not answer["existed"]:
        sys.exit(client.NOT_FOUND)


# -- push, pop, ack ------------------------------------------------------------------


@cli.command()
@click.argument("queue")
@click.argument("payload", required=False)
@click.option("--partition", "-p", default="Default", show_default=True)
@click.option("--transaction-id", help="Deduplication key (default: generated).")
@click.pass_context
def push(ctx: click.Context, queue: str, payload: str | None, partition: str,
         transaction_id: str | None) -> None:
    """Push one message (PAYLOAD is JSON; '-' or nothing reads it from stdin)."""
    if payload is None or payload == "-":
        payload = sys.stdin.read()
    item: dict[str, Any] = {"queue": queue, "partition": partition,
                            "payload": json_value(payload, "PAYLOAD")}
    if transaction_id:
        item["transactionId"] = transaction_id
    answer = call(ctx, "POST", "/api/v1/push", body={"items": [item]})
    emit(ctx, answer, lambda a: table(a, [("status", "status"), ("message", "message_id"),
                                          ("transaction", "transaction_id"),
                                          ("error", "error")]))
    if any(r.get("status") == "failed" for r in answer):
        sys.exit(client.FAILED)


@cli.command()
@click.argument("queue")
@click.option("--partition", "-p", help="Only this partition.")
@click.option("--group", "-g", help="Consumer group (default: queue mode).")
@click.option("--batch", "-n", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--wait", is_flag=True, help="Long poll until a message arrives.")
@click.option("--wait-ms", default=10000, show_default=True, help="Long-poll limit.")
@click.option("--ack", "auto_ack", is_flag=True, help="Acknowledge on delivery.")
@click.pass_context
def pop(ctx: click.Context, queue: str, partition: str | None, group: str | None, batch: int,
        wait: bool, wait_ms: int, auto_ack: bool) -> None:
    """Pop messages (each gets a lease; `queenctl ack` or --ack settles them).
    Exit 3 when nothing was there."""
    path = f"/api/v1/pop/queue/{seg(queue)}"
    if partition:
        path += f"/partition/{seg(partition)}"
    answer = call(ctx, "GET", path, params={
        "consumerGroup": group, "batch": batch, "wait": wait, "timeout": wait_ms,
        "autoAck": auto_ack})
    emit(ctx, answer, lambda a: table(a.get("messages", []), [
        ("partition", "partition"), ("partition id", "partitionId"),
        ("transaction", "transactionId"), ("lease", "leaseId"), ("data", "data")],
        empty="(no message)"))
    if not answer.get("messages"):
        sys.exit(client.NOT_FOUND)


@cli.command()
@click.argument("partition_id")
@click.argument("transaction_id")
@click.option("--lease", help="The lease id the pop answered.")
@click.option("--group", "-g", help="Consumer group (default: queue mode).")
@click.option("--status", default="completed", show_default=True,
              type=click.Choice(["completed", "failed", "retry", "dlq"]),
              help="failed/retry count an attempt; dlq dead-letters it at once.")
@click.option("--error", help="The reason, for failed / dlq.")
@click.pass_context
def ack(ctx: click.Context, partition_id: str, transaction_id: str, lease: str | None,
        group: str | None, status: str, error: str | None) -> None:
    """Acknowledge a popped message (or fail / dead-letter it with --status)."""
    body: dict[str, Any] = {"partitionId": partition_id, "transactionId": transaction_id,
                            "status": status}
    for key, value in (("leaseId", lease), ("consumerGroup", group), ("error", error)):
        if value:
            body[key] = value
    answer = call(ctx, "POST", "/api/v1/ack", body=body)
    emit(ctx, answer, lambda a: table(a, [("transaction", "transactionId"),
                                          ("success", "success"), ("error", "error"),
                                          ("dead-lettered", "dlq")]))
    if not all(r.get("success") for r in answer):
        sys.exit(client.FAILED)
