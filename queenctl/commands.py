"""queenctl's commands: each is one or two calls of the broker's HTTP API (see /docs on the
broker for every route), printed as a table or, with --json, as the broker's JSON."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
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


GLOBAL_HELP = {
    "url": "The broker's base URL (or QUEEN_URL).",
    "token": "JWT bearer token, for a broker with JWT_ENABLED (or QUEEN_TOKEN).",
    "timeout": "Seconds to wait for each answer.",
    "json": "Print the broker's JSON answer instead of a table.",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--url", envvar="QUEEN_URL", default=DEFAULT_URL, show_default=True,
              help=GLOBAL_HELP["url"])
@click.option("--token", envvar="QUEEN_TOKEN", default=None, help=GLOBAL_HELP["token"])
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help=GLOBAL_HELP["timeout"])
@click.option("--json", "as_json", is_flag=True, help=GLOBAL_HELP["json"])
@click.version_option(package_name="queen-broker", prog_name="queenctl")
@click.pass_context
def cli(ctx: click.Context, url: str, token: str | None, timeout: float, as_json: bool) -> None:
    """Operate a queen-broker over its HTTP API.

    \b
    The options above (--url, --token, --timeout, --json) are accepted after any
    subcommand too: `queenctl pop Q --json` is `queenctl --json pop Q`.

    \b
    Exit codes: 0 done; 1 the broker refused or the operation failed; 2 bad command line;
    3 not found; 4 authentication or permission (401/403); 5 no broker reachable at --url;
    6 the broker's database is unavailable (503, retry); 7 other server error.
    Errors are one line on stderr.
    """
    ctx.obj = State(url, token, timeout, as_json)
    ctx.call_on_close(lambda: ctx.obj._broker.close() if ctx.obj._broker else None)


def _set_global(field: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """A global option given after a subcommand: it overrides the group's value (the group's
    callback has made the State by then; the broker connection is made on first use)."""
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is None or value is False:  # not given here: the group's value stands
            return
        state = ctx.find_object(State)
        if state is not None:  # None only for --help, which runs before the group's callback
            setattr(state, field, value)
    return callback


def _global_options() -> list[click.Option]:
    """The group's options as a subcommand accepts them: no default and no envvar (those
    are the group's), so they change the State only when written after the subcommand."""
    return [
        click.Option(["--url"], default=None, expose_value=False, callback=_set_global("url"),
                     help=GLOBAL_HELP["url"]),
        click.Option(["--token"], default=None, expose_value=False,
                     callback=_set_global("token"), help=GLOBAL_HELP["token"]),
        click.Option(["--timeout"], default=None, type=click.FloatRange(min=0.1),
                     expose_value=False, callback=_set_global("timeout"),
                     help=GLOBAL_HELP["timeout"]),
        click.Option(["--json"], is_flag=True, default=False, expose_value=False,
                     callback=_set_global("json"), help=GLOBAL_HELP["json"]),
    ]


def accept_global_options(group: click.Group) -> None:
    """Give every subcommand (and sub-group) below ``group`` the global options, so they work
    before or after the subcommand alike. Run once every command is registered (__main__)."""
    for command in group.commands.values():
        names = {opt for p in command.params for opt in getattr(p, "opts", ())}
        if "--json" not in names:
            command.params.extend(_global_options())
        if isinstance(command, click.Group):
            accept_global_options(command)


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
              help="A queue option, e.g. -o leaseTime=60 (repeatable; "
                   "see the broker's /docs for every option).")
@click.pass_context
def queues_configure(ctx: click.Context, queue: str, namespace: str | None, task: str | None,
                     options: tuple[str, ...]) -> None:
    """Create QUEUE or change its options (options left out keep their value).

    Options the broker stored but does not act on (e.g. ttl) are warned about on stderr;
    the exit code is still 0, since what was asked is stored. Exit 1 when an option was not
    stored (a misspelt name, or deadLetterQueue=false): the other options were."""
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
    if not ignored:
        return
    # The answer's `ignored` names every option the broker does not act on, whether it
    # stored it (ttl, priority: kept and shown) or not (an unknown name). What was stored
    # is in the answer's `options` with the value sent: only the rest is a failure.
    stored = answer.get("options") or {}
    for warning in answer.get("warnings") or ():
        click.echo(f"queenctl: warning: {warning}", err=True)
    not_stored = [name for name in ignored
                  if name not in stored or name not in parsed or stored[name] != parsed[name]]
    if not_stored:
        raise CtlError(f"the broker did not store {len(not_stored)} option(s): "
                       f"{', '.join(not_stored)} (the other options were stored)", client.FAILED)


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
@click.option("--ack", "ack_them", is_flag=True,
              help="Acknowledge what was popped (an ack under the pop's lease, as a consumer "
                   "would; counted as acks).")
@click.pass_context
def pop(ctx: click.Context, queue: str, partition: str | None, group: str | None, batch: int,
        wait: bool, wait_ms: int, ack_them: bool) -> None:
    """Pop messages (each gets a lease; `queenctl ack` or --ack settles them).
    Exit 3 when nothing was there, or when there is no such queue (said on stderr)."""
    path = f"/api/v1/pop/queue/{seg(queue)}"
    if partition:
        path += f"/partition/{seg(partition)}"
    # --ack pops under a lease and acknowledges afterwards, as the client's consumers do.
    # Not the wire's autoAck (the client's commit_on_delivery()): that moves the cursor at
    # delivery and is no ack, so the broker's ack figures would never see these messages.
    answer = call(ctx, "GET", path, params={
        "consumerGroup": group, "batch": batch, "wait": wait, "timeout": wait_ms})
    messages = [m for m in answer.get("messages") or [] if m]
    acks = _ack_popped(ctx, group, messages) if ack_them and messages else None
    if acks is not None:
        answer = {**answer, "acks": acks}
    emit(ctx, answer, lambda a: table(a.get("messages", []), [
        ("partition", "partition"), ("partition id", "partitionId"),
        ("transaction", "transactionId"), ("lease", "leaseId"), ("data", "data")],
        empty="(no message)"))
    if acks is not None:
        failed = [r for r in acks if not isinstance(r, dict) or not r.get("success")
                  or r.get("error")]
        if failed:
            raise CtlError(f"popped {len(messages)} message(s) but {len(failed)} ack(s) failed: "
                           + "; ".join(str(r.get("error") if isinstance(r, dict) else r)
                                       for r in failed), client.FAILED)
    if not messages:
        if answer.get("queueExists") is False:  # the broker's word: the queue is not there
            click.echo(f"queenctl: no such queue: {queue}", err=True)
        sys.exit(client.NOT_FOUND)


def _ack_popped(ctx: click.Context, group: str | None, messages: list[dict]) -> list:
    """Acknowledge popped messages in one ack/batch, each under its lease."""
    items = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
              "status": "completed", **({"leaseId": m["leaseId"]} if m.get("leaseId") else {})}
             for m in messages]
    return call(ctx, "POST", "/api/v1/ack/batch",
                body={"consumerGroup": group, "acknowledgments": items})


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
