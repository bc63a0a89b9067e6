"""queenctl's operator groups: consumer groups, dead letters, messages, maintenance, the
spool's quarantine, the cluster's spool holds and the background jobs."""
from __future__ import annotations

import sys
from typing import Any

import click

from queenctl import client
from queenctl.client import CtlError, seg
from queenctl.commands import call, cli, confirm, yes_option
from queenctl.output import emit, pairs, table

# -- consumer groups -----------------------------------------------------------------


@cli.group()
def groups() -> None:
    """Consumer groups: list, lag, show, seek, delete."""


# The wire's group states (Queen's words, which --json keeps) as they read in a table: the
# wire's "Dead" means no member ever acknowledged a message, not a dead consumer.
GROUP_STATES = {"Stable": "stable", "Lagging": "lagging", "Dead": "never acked"}


def group_state(row: dict) -> str | None:
    state = row.get("state")
    return GROUP_STATES.get(state, state) if isinstance(state, str) else state


@groups.command("list")
@click.pass_context
def groups_list(ctx: click.Context) -> None:
    """Every (group, queue) with its lag and state (stable, lagging over 300 s, or never
    acked: no message of the queue acknowledged by the group yet)."""
    answer = call(ctx, "GET", "/api/v1/consumer-groups")
    emit(ctx, answer, lambda a: table(a, [
        ("group", "name"), ("queue", "queueName"), ("state", group_state),
        ("partitions", "members"), ("lag", "totalLag"), ("max lag s", "maxTimeLag"),
        ("leases", "activeLeases"), ("subscription", "subscriptionMode")]))


@groups.command("lag")
@click.option("--min-lag-seconds", default=0, show_default=True, type=click.IntRange(min=0),
              help="Only cursors whose oldest unconsumed message is at least this old.")
@click.pass_context
def groups_lag(ctx: click.Context, min_lag_seconds: int) -> None:
    """Cursors that lag, per partition."""
    answer = call(ctx, "GET", "/api/v1/consumer-groups/lagging",
                  params={"minLagSeconds": min_lag_seconds})
    emit(ctx, answer, lambda a: table(a, [
        ("group", "consumer_group"), ("queue", "queue_name"), ("partition", "partition_name"),
        ("lag", "offset_lag"), ("lag s", "time_lag_seconds"),
        ("oldest unconsumed", "oldest_unconsumed_at")]))


@groups.command("show")
@click.argument("group")
@click.pass_context
def groups_show(ctx: click.Context, group: str) -> None:
    """A group's cursor on every partition. Exit 3 for a group without cursors."""
    answer = call(ctx, "GET", f"/api/v1/consumer-groups/{seg(group)}")
    rows = [{"queue": q, **p} for q, v in answer.items() for p in v["partitions"]]
    emit(ctx, answer, lambda _a: table(rows, [
        ("queue", "queue"), ("partition", "partition"), ("cursor", "cursor"),
        ("last", "lastSeq"), ("lag", "offsetLag"), ("lease", "leaseActive"),
        ("last consumed", "lastConsumedAt")]))
    if not rows:
        sys.exit(client.NOT_FOUND)


@groups.command("seek")
@click.argument("group")
@click.argument("queue")
@click.option("--to-end", is_flag=True, help="Skip everything not yet consumed.")
@click.option("--to", "timestamp", metavar="ISO-8601", help="Re-read from this time on.")
@click.option("--partition", "-p", help="Only this partition (to its end).")
@click.pass_context
def groups_seek(ctx: click.Context, group: str, queue: str, to_end: bool,
                timestamp: str | None, partition: str | None) -> None:
    """Move GROUP's cursors on QUEUE to the end or to a time (releases their leases)."""
    if to_end == (timestamp is not None):
        raise click.UsageError("give exactly one of --to-end and --to")
    if partition:
        if not to_end:
            raise click.UsageError("--partition seeks to the end only: add --to-end")
        answer = call(ctx, "POST", f"/api/v1/consumer-groups/{seg(group)}/queues/{seg(queue)}"
                                   f"/partitions/{seg(partition)}/seek")
        emit(ctx, answer, lambda a: f"{group} on {queue}/{partition}: cursor at "
                                    f"{a['cursorMovedTo']['seq']}")
        return
    body: dict[str, Any] = {"toEnd": True} if to_end else {"timestamp": timestamp}
    answer = call(ctx, "POST", f"/api/v1/consumer-groups/{seg(group)}/queues/{seg(queue)}/seek",
                  body=body)
    emit(ctx, answer, lambda a: table(a["partitions"], [
        ("partition", "partition"), ("from", "from"), ("to", "to")]))


@groups.command("delete")
@click.argument("group")
@click.option("--queue", "-q", help="Only on this queue.")
@click.option("--keep-subscription", is_flag=True, help="Keep the stored subscription.")
@yes_option
@click.pass_context
def groups_delete(ctx: click.Context, group: str, queue: str | None, keep_subscription: bool,
                  yes: bool) -> None:
    """Delete GROUP's cursors (its next pop starts again from its subscription)."""
    confirm(ctx, yes, f"delete consumer group {group!r}" + (f" on {queue!r}" if queue else ""))
    path = f"/api/v1/consumer-groups/{seg(group)}"
    if queue:
        path += f"/queues/{seg(queue)}"
    answer = call(ctx, "DELETE", path, params={"deleteMetadata": not keep_subscription})
    emit(ctx, answer, lambda a: f"deleted {group}: {a['deletedPartitions']} cursor(s)")


# -- dead letters and messages -------------------------------------------------------


@cli.group()
def dlq() -> None:
    """Dead-lettered messages: list, show, retry, discard."""


@dlq.command("list")
@click.option("--queue", "-q")
@click.option("--partition", "-p")
@click.option("--group", "-g")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--offset", default=0, type=click.IntRange(min=0))
@click.pass_context
def dlq_list(ctx: click.Context, queue: str | None, partition: str | None, group: str | None,
             limit: int, offset: int) -> None:
    """Dead letters, newest first."""
    answer = call(ctx, "GET", "/api/v1/dlq", params={
        "queue": queue, "partition": partition, "consumerGroup": group, "limit": limit,
        "offset": offset})
    emit(ctx, answer, lambda a: table(a["messages"], [
        ("queue", "queue"), ("partition", "partition"), ("partition id", "partitionId"),
        ("transaction", "transactionId"), ("group", "consumerGroup"),
        ("retries", "retryCount"), ("error", "errorMessage"), ("failed", "failedAt")])
        + f"\n{a['total']} dead letter(s)")


def _message_path(partition_id: str, transaction_id: str) -> str:
    return f"/api/v1/messages/{seg(partition_id)}/{seg(transaction_id)}"


@dlq.command("show")
@click.argument("partition_id")
@click.argument("transaction_id")
@click.pass_context
def dlq_show(ctx: click.Context, partition_id: str, transaction_id: str) -> None:
    """One message with its payload and dead letters."""
    answer = call(ctx, "GET", _message_path(partition_id, transaction_id))

    def human(a: dict) -> str:
        return pairs([("queue", f"{a['queue']}/{a['partition']}"), ("status", a["status"]),
                      ("transaction", a["transactionId"]), ("created", a.get("createdAt")),
                      ("payload", a.get("payload")), ("error", a.get("errorMessage")),
                      ("retries", a.get("retryCount"))]) + "\n\n" + table(
            a.get("deadLetters", []), [("group", "consumerGroup"), ("error", "errorMessage"),
                                       ("retries", "retryCount"), ("failed", "failedAt")],
            empty="(not dead-lettered)")
    emit(ctx, answer, human)


@dlq.command("retry")
@click.argument("partition_id")
@click.argument("transaction_id")
@click.pass_context
def dlq_retry(ctx: click.Context, partition_id: str, transaction_id: str) -> None:
    """Re-enqueue a dead letter (a copy is pushed; its dead-letter rows go)."""
    answer = call(ctx, "POST", _message_path(partition_id, transaction_id) + "/retry")
    emit(ctx, answer, lambda a: f"retried as {a['newTransactionId']}")


@dlq.command("discard")
@click.argument("partition_id")
@click.argument("transaction_id")
@yes_option
@click.pass_context
def dlq_discard(ctx: click.Context, partition_id: str, transaction_id: str, yes: bool) -> None:
    """Delete the message and its dead letters for good."""
    confirm(ctx, yes, f"delete message {transaction_id!r}")
    answer = call(ctx, "DELETE", _message_path(partition_id, transaction_id))
    emit(ctx, answer, lambda a: f"deleted {transaction_id}")


@cli.group()
def messages() -> None:
    """Browse messages: list, show, delete (any status)."""


@messages.command("list")
@click.option("--queue", "-q")
@click.option("--partition", "-p")
@click.option("--status", type=click.Choice(["pending", "processing", "completed",
                                             "dead_letter"]))
@click.option("--from", "since", metavar="ISO-8601")
@click.option("--to", "until", metavar="ISO-8601")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.pass_context
def messages_list(ctx: click.Context, queue: str | None, partition: str | None,
                  status: str | None, since: str | None, until: str | None, limit: int) -> None:
    """Messages of the last hour (or --from/--to), newest first."""
    answer = call(ctx, "GET", "/api/v1/messages", params={
        "queue": queue, "partition": partition, "status": status, "from": since,
        "to": until, "limit": limit})
    emit(ctx, answer, lambda a: table(a["messages"], [
        ("queue", "queue"), ("partition", "partition"), ("partition id", "partitionId"),
        ("transaction", "transactionId"), ("status", "status"), ("created", "createdAt")]))


messages.add_command(dlq_show, "show")
messages.add_command(dlq_discard, "delete")

# -- maintenance ---------------------------------------------------------------------

WHICH = click.Choice(["push", "pop", "both"])


@cli.group()
def maintenance() -> None:
    """Maintenance modes: push (pushes go to the spool) and pop (pops answer empty)."""


@maintenance.command("show")
@click.pass_context
def maintenance_show(ctx: click.Context) -> None:
    """Both flags and the spool's backlog."""
    answer = call(ctx, "GET", "/api/v1/system/maintenance")
    emit(ctx, answer, lambda a: pairs([
        ("push maintenance", a["maintenanceMode"]), ("pop maintenance", a["popMaintenanceMode"]),
        ("buffered", a.get("bufferedMessages")), ("quarantined", a.get("quarantinedEvents"))]))


def _flip(ctx: click.Context, which: str, enabled: bool) -> None:
    answers = {}
    for mode, path in (("push", "/api/v1/system/maintenance"),
                       ("pop", "/api/v1/system/maintenance/pop")):
        if which in (mode, "both"):
            answers[mode] = call(ctx, "POST", path, body={"enabled": enabled})
    emit(ctx, answers, lambda a: "\n".join(f"{m} maintenance {'on' if enabled else 'off'}"
                                           for m in a))


@maintenance.command("on")
@click.argument("which", type=WHICH)
@click.pass_context
def maintenance_on(ctx: click.Context, which: str) -> None:
    """Turn push, pop or both maintenance modes on (cluster-wide)."""
    _flip(ctx, which, True)


@maintenance.command("off")
@click.argument("which", type=WHICH)
@click.pass_context
def maintenance_off(ctx: click.Context, which: str) -> None:
    """Turn push, pop or both maintenance modes off (the spool drains)."""
    _flip(ctx, which, False)


# -- the spool's quarantine ----------------------------------------------------------

QUARANTINE = "/api/v1/system/spool/quarantine"


@cli.group()
def quarantine() -> None:
    """Spooled pushes the replay could not store (node-local: ask the broker holding them)."""


@quarantine.command("list")
@click.pass_context
def quarantine_list(ctx: click.Context) -> None:
    """Every quarantined event, without payloads."""
    answer = call(ctx, "GET", QUARANTINE)
    emit(ctx, answer, lambda a: table(a["entries"], [
        ("id", "id"), ("queue", "queue"), ("partition", "partition"),
        ("transaction", "transactionId"), ("reason", "reason"), ("error", "error"),
        ("since", "quarantinedAt")]))


@quarantine.command("show")
@click.argument("ident")
@click.pass_context
def quarantine_show(ctx: click.Context, ident: str) -> None:
    """One entry with its event (always JSON)."""
    ctx.obj.json = True
    emit(ctx, call(ctx, "GET", f"{QUARANTINE}/{seg(ident)}"), str)


@quarantine.command("replay")
@click.argument("ident")
@click.option("--queue", "-q", help="Push it to this queue instead.")
@click.option("--partition", "-p", help="Push it to this partition instead.")
@click.pass_context
def quarantine_replay(ctx: click.Context, ident: str, queue: str | None,
                      partition: str | None) -> None:
    """Push a quarantined event now; it leaves the quarantine once stored."""
    body = {k: v for k, v in (("queue", queue), ("partition", partition)) if v}
    answer = call(ctx, "POST", f"{QUARANTINE}/{seg(ident)}/replay", body=body)
    emit(ctx, answer, lambda a: f"replayed {ident}: {a['status']}")


@quarantine.command("discard")
@click.argument("ident")
@yes_option
@click.pass_context
def quarantine_discard(ctx: click.Context, ident: str, yes: bool) -> None:
    """Drop a quarantined event for good."""
    confirm(ctx, yes, f"discard quarantined event {ident!r}")
    answer = call(ctx, "DELETE", f"{QUARANTINE}/{seg(ident)}")
    emit(ctx, answer, lambda a: f"discarded {ident}")


# -- the cluster's spool holds -------------------------------------------------------

SPOOLS = "/api/v1/system/spools"


@cli.group(invoke_without_command=True)
@click.pass_context
def spools(ctx: click.Context) -> None:
    """Spools holding partitions back, cluster-wide; without a subcommand, list them.

    A broker's spool registers the partitions it holds spooled pushes for (queen.spool_backlog,
    with a heartbeat); pushes to them are staged behind it so each partition keeps its order.
    A spool silent for FILE_BUFFER_ORDER_WAIT_MS no longer holds back a broker that has beaten
    that long; the retention job removes a spool silent for FILE_BUFFER_ORDER_FORGET_MS."""
    if ctx.invoked_subcommand is None:
        _spools_list(ctx)


def _spools_list(ctx: click.Context) -> None:
    answer = call(ctx, "GET", SPOOLS)
    emit(ctx, answer, lambda a: table(a["spools"], [
        ("spool", "spool"), ("state", lambda r: "silent" if r["silent"] else "live"),
        ("partitions", "partitions"), ("last heartbeat", "lastHeartbeat"),
        ("silent s", "silentSeconds"), ("oldest push", "oldestAcceptedAt")],
        empty="(no spool holds partitions)") + (
        f"\n{a['silentHeldPartitions']} partition(s) held by {a['silentSpools']} silent "
        f"spool(s) (silent: no heartbeat for {a['boundMs']} ms)" if a["spools"] else ""))


@spools.command("list")
@click.pass_context
def spools_list(ctx: click.Context) -> None:
    """Every spool holding partitions: live or silent, how many, its last heartbeat."""
    _spools_list(ctx)


@spools.command("release")
@click.argument("spool_id")
@click.option("--force", is_flag=True,
              help="Release it even though it beat within FILE_BUFFER_ORDER_WAIT_MS (it looks "
                   "alive): only for a spool whose disk is gone for good.")
@yes_option
@click.pass_context
def spools_release(ctx: click.Context, spool_id: str, force: bool, yes: bool) -> None:
    """Release SPOOL_ID's holds: delete its queen.spool_backlog rows and its heartbeat row, so
    no push waits behind it any more.

    What releasing means: if that spool's disk ever comes back, its pushes land later than
    pushes accepted after them, each counted as an order exception; nothing already in
    PostgreSQL changes (staged and stored messages stay as they are). The broker refuses
    (exit 1) a spool that beat within FILE_BUFFER_ORDER_WAIT_MS unless --force, and the
    name (staged) always; exit 3 when no spool has that id."""
    confirm(ctx, yes, f"release the holds of spool {spool_id!r}")
    answer = call(ctx, "POST", f"{SPOOLS}/{seg(spool_id)}/release", body={"force": force})
    emit(ctx, answer, lambda a: f"released {spool_id}: {a['partitions']} partition(s) "
                                f"(last heartbeat {a['lastHeartbeat'] or 'never'})")


# -- background jobs -----------------------------------------------------------------


@cli.group()
def jobs() -> None:
    """The broker's background jobs (retention, stats, metrics)."""


@jobs.command("list")
@click.pass_context
def jobs_list(ctx: click.Context) -> None:
    answer = call(ctx, "GET", "/api/v1/system/jobs")
    rows = [{"job": name, **figures} for name, figures in answer.items()]
    columns = [("job", "job")] + [(k, k) for k in (rows[0] if rows else {}) if k != "job"][:6]
    emit(ctx, answer, lambda _a: table(rows, columns))


@jobs.command("run")
@click.argument("name", type=click.Choice(["retention", "stats", "metrics"]))
@click.pass_context
def jobs_run(ctx: click.Context, name: str) -> None:
    """Run one cycle of a job now."""
    answer = call(ctx, "POST", f"/api/v1/system/jobs/{seg(name)}/run")
    emit(ctx, answer, lambda a: pairs(list(a.items())))
    if isinstance(answer, dict) and answer.get("error"):
        raise CtlError(f"job {name} failed: {answer['error']}")
