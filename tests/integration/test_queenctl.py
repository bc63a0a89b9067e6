"""queenctl against real brokers: every subcommand's happy path, its error for a missing
queue / group / message / entry, a bad token, an unreachable broker, and --json output that
parses. Exit codes are the documented ones (queenctl.client)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import httpx
import jwt
import pytest

from actors.spool.records import encode_legacy_records
from queenctl import client
from queenctl.__main__ import main
from tests.conftest import Database, free_port, start_broker

SECRET = "queenctl-test-secret-of-at-least-32-bytes"


def _sql(database: Database, statement: str) -> None:
    async def run():
        conn = await asyncpg.connect(database.dsn)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()
    asyncio.run(run())


@pytest.fixture(scope="module")
def own_database(database):
    """A database of this module's own: the maintenance commands flip cluster-wide flags."""
    name = f"t_ctl_{uuid.uuid4().hex[:8]}"
    _sql(database, f'CREATE DATABASE "{name}"')
    yield Database(database.host, database.port, database.user, database.password, name)
    _sql(database, f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def ctl_broker(own_database, tmp_path_factory):
    """A broker whose spool holds two events an older version set aside (they become
    quarantine entries at start)."""
    tmp = tmp_path_factory.mktemp("ctl")
    spool = tmp / "spool"
    (spool / "failed").mkdir(parents=True)
    events = [{"queue": "ctl-quarantined", "partition": "p", "transactionId": f"q{i}",
               "payload": {"i": i}, "encrypted": False, "traceId": None, "producerSub": None}
              for i in range(2)]
    (spool / "failed" / "queen-1600000000000-00000000.buf").write_bytes(encode_legacy_records(events))
    broker = start_broker(own_database, tmp, FILE_BUFFER_DIR=str(spool))
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def jwt_broker(own_database, tmp_path_factory):
    broker = start_broker(own_database, tmp_path_factory.mktemp("ctljwt"), JWT_ENABLED="true",
                          JWT_ALGORITHM="HS256", JWT_SECRET=SECRET)
    yield broker
    broker.stop()


@pytest.fixture
def ctl(ctl_broker, capsys):
    """Run queenctl in-process against ctl_broker: (exit code, stdout, stderr)."""
    def run(*args: str, url: str | None = None, stdin: str | None = None):
        capsys.readouterr()
        if stdin is not None:
            import io
            sys.stdin = io.StringIO(stdin)
        try:
            code = main(["--url", url or ctl_broker.url, *args])
        finally:
            sys.stdin = sys.__stdin__
        out, err = capsys.readouterr()
        return code, out, err
    return run


def ok_json(ctl, *args: str):
    code, out, err = ctl("--json", *args)
    assert code == client.OK, (args, code, err)
    return json.loads(out)


def test_status_and_peers(ctl):
    code, out, _ = ctl("status")
    assert code == 0 and "healthy" in out and "none (mesh off)" in out
    answer = ok_json(ctl, "status")
    assert answer["health"]["database"] == "connected"
    assert ok_json(ctl, "peers")["transport"] is None
    code, out, _ = ctl("peers")
    assert code == 0 and "mesh off" in out


def test_queue_lifecycle_push_pop_ack(ctl):
    queue = f"ctl-{uuid.uuid4().hex[:8]}"
    configured = ok_json(ctl, "queues", "configure", queue, "--namespace", "ns",
                         "-o", "leaseTime=45", "-o", "deadLetterQueue=true")
    assert configured["options"]["leaseTime"] == 45
    assert configured["options"]["deadLetterQueue"] is True
    pushed = ok_json(ctl, "push", queue, '{"n": 1}', "-p", "p1")
    assert pushed[0]["status"] == "queued"
    code, _, _ = ctl("push", queue, "-p", "p1", stdin='{"n": 2}')
    assert code == 0
    code, out, _ = ctl("queues", "list")
    assert code == 0 and queue in out and "PENDING" in out
    shown = ok_json(ctl, "queues", "show", queue)
    assert shown["totals"]["pending"] == 2
    code, out, _ = ctl("queues", "show", queue)
    assert "p1" in out and "option leaseTime" in out
    popped = ok_json(ctl, "pop", queue, "-g", "g1", "-n", "1")
    [message] = popped["messages"]
    assert message["data"] == {"n": 1}
    acked = ok_json(ctl, "ack", message["partitionId"], message["transactionId"],
                    "--lease", message["leaseId"], "-g", "g1")
    assert acked[0]["success"] is True
    code, out, _ = ctl("pop", queue, "-p", "p1", "--ack")
    assert code == 0 and "n" in out
    assert ctl("pop", queue, "-g", "g1", "-n", "5", "--ack")[0] == 0
    code, out, _ = ctl("pop", queue, "-g", "g1")
    assert code == client.NOT_FOUND and "(no message)" in out
    code, out, _ = ctl("queues", "delete", queue, "--yes")
    assert code == 0 and f"deleted {queue}" in out
    code, out, err = ctl("queues", "delete", queue, "--yes")
    assert code == client.NOT_FOUND


def _acks_counted(url: str) -> int:
    """Every ack the broker applied since it started (what the dashboard's "acked" sums)."""
    by_status = httpx.get(f"{url}/metrics", timeout=10).json()["messages"]["byStatus"]
    return sum(v for k, v in by_status.items() if k.startswith("acked_")) + by_status.get("dlq", 0)


def test_global_options_work_after_the_subcommand(ctl):
    queue = f"ctl-{uuid.uuid4().hex[:8]}"
    code, out, err = ctl("queues", "configure", queue, "-o", "leaseTime=30", "--json")
    assert code == 0 and json.loads(out)["options"]["leaseTime"] == 30, err
    code, out, err = ctl("push", queue, '{"n": 1}', "--json")
    assert code == 0 and json.loads(out)[0]["status"] == "queued", err
    code, out, err = ctl("pop", queue, "--json", "-g", "g1")
    assert code == 0 and json.loads(out)["messages"][0]["data"] == {"n": 1}, err
    code, out, _ = ctl("queues", "--json", "list")  # after a group, before its subcommand
    assert code == 0 and isinstance(json.loads(out)["queues"], list)
    code, out, _ = ctl("groups", "list", "--timeout", "5", "--json")
    assert code == 0 and isinstance(json.loads(out), list)
    # given after the subcommand, --url replaces the one given before it
    code, out, err = ctl("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == client.UNREACHABLE and "cannot reach a broker" in err
    code, _, err = ctl("status", "--timeout", "0")
    assert code == client.USAGE and "--timeout" in err


def test_pop_ack_acknowledges_under_the_lease_and_is_counted_as_an_ack(ctl, ctl_broker):
    queue = f"ctl-{uuid.uuid4().hex[:8]}"
    for n in range(2):
        ok_json(ctl, "push", queue, json.dumps({"n": n}))
    before = _acks_counted(ctl_broker.url)
    popped = ok_json(ctl, "pop", queue, "-n", "2", "--ack")
    assert len(popped["messages"]) == 2
    assert all(m["leaseId"] for m in popped["messages"])  # a lease, not autoAck's ""
    assert [a["success"] for a in popped["acks"]] == [True, True]
    assert _acks_counted(ctl_broker.url) == before + 2
    shown = ok_json(ctl, "queues", "show", queue)
    assert shown["totals"]["completed"] == 2 and shown["totals"]["pending"] == 0
    code, out, _ = ctl("pop", queue, "-g", "g2", "--ack")  # a group of its own: also acked
    assert code == 0 and "{\"n\":0}" in out
    assert _acks_counted(ctl_broker.url) == before + 3


def test_pop_of_a_missing_queue_says_no_such_queue(ctl):
    code, out, err = ctl("pop", "ctl-no-such-queue-anywhere")
    assert code == client.NOT_FOUND and "(no message)" in out
    assert err == "queenctl: no such queue: ctl-no-such-queue-anywhere\n"
    answer = json.loads(ctl("pop", "ctl-no-such-queue-anywhere", "--json")[1])
    assert answer["queueExists"] is False and answer["messages"] == []
    queue = f"ctl-{uuid.uuid4().hex[:8]}"
    ok_json(ctl, "queues", "configure", queue)
    code, out, err = ctl("pop", queue)  # there, but empty: no such line
    assert code == client.NOT_FOUND and err == ""
    assert "queueExists" not in json.loads(ctl("pop", queue, "--json")[1])


def test_configure_exit_code_follows_what_was_stored(ctl):
    queue = f"ctl-{uuid.uuid4().hex[:8]}"
    code, out, err = ctl("queues", "configure", queue, "-o", "ttl=100")
    assert code == client.OK, err  # stored: a warning that nothing acts on it, not a failure
    assert "ttl=100" in out and "warning: ttl: stored only" in err and "did not store" not in err
    assert ok_json(ctl, "queues", "show", queue)["options"]["ttl"] == 100
    code, _, err = ctl("queues", "configure", queue, "-o", "leaseTme=60", "-o", "retryLimit=2")
    assert code == client.FAILED and "did not store 1 option(s): leaseTme" in err
    assert "did you mean leaseTime?" in err
    assert ok_json(ctl, "queues", "show", queue)["options"]["retryLimit"] == 2
    code, _, err = ctl("queues", "configure", queue, "-o", "deadLetterQueue=false")
    assert code == client.FAILED and "did not store 1 option(s): deadLetterQueue" in err
    assert ok_json(ctl, "queues", "show", queue)["options"]["deadLetterQueue"] is True


def test_missing_queue_and_bad_input_are_one_line_errors(ctl):
    code, out, err = ctl("queues", "show", "no-such-queue-ctl")
    assert code == client.NOT_FOUND and out == ""
    assert err.count("\n") == 1 and "Queue not found" in err and "HTTP 404" in err
    code, _, err = ctl("push", "q", "{not json")
    assert code == client.USAGE and err.count("\n") == 1 and "not JSON" in err
    code, _, err = ctl("queues", "configure", "q", "-o", "leaseTime=-5")
    assert code == client.FAILED and "HTTP 400" in err and err.count("\n") == 1
    code, _, err = ctl("groups", "seek", "g", "q")
    assert code == client.USAGE and "--to-end" in err and err.count("\n") == 1
    code, _, err = ctl("no-such-command")
    assert code == client.USAGE and err.count("\n") == 1


def test_unreachable_broker(ctl):
    code, out, err = ctl("status", url=f"http://127.0.0.1:{free_port()}")
    assert code == client.UNREACHABLE and out == ""
    assert err.count("\n") == 1 and "cannot reach a broker" in err


def test_groups_list_lag_show_seek_delete(ctl):
    queue, group = f"ctl-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:6]}"
    for n in range(3):
        ok_json(ctl, "push", queue, json.dumps({"n": n}))
    ok_json(ctl, "pop", queue, "-g", group, "--ack")
    ok_json(ctl, "pop", queue, "-g", group + "-idle")  # leased, never acknowledged
    groups = ok_json(ctl, "groups", "list")
    mine = [g for g in groups if g["name"] == group]
    assert mine and mine[0]["queueName"] == queue and mine[0]["totalLag"] == 2
    assert [g["state"] for g in groups if g["name"] == group + "-idle"] == ["Dead"]  # the wire's
    code, out, _ = ctl("groups", "list")
    assert code == 0 and group in out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    # The table says what the wire's "Dead" means: an active group that never acked.
    assert "never acked" in rows[group + "-idle"] and "Dead" not in out
    assert " stable " in rows[group], rows[group]
    lag = ok_json(ctl, "groups", "lag")
    assert any(r["consumer_group"] == group and r["offset_lag"] == 2 for r in lag)
    assert ctl("groups", "lag", "--min-lag-seconds", "5")[0] == 0
    shown = ok_json(ctl, "groups", "show", group)
    assert shown[queue]["partitions"][0]["offsetLag"] == 2
    assert ctl("groups", "show", "no-such-group-ctl")[0] == client.NOT_FOUND
    seek = ok_json(ctl, "groups", "seek", group, queue, "--to-end")
    assert seek["partitionsUpdated"] == 1
    assert ok_json(ctl, "groups", "show", group)[queue]["partitions"][0]["offsetLag"] == 0
    back = ok_json(ctl, "groups", "seek", group, queue, "--to", "1970-01-01T00:00:00Z")
    assert back["partitions"][0]["to"] == 0
    part = ok_json(ctl, "groups", "seek", group, queue, "-p", "Default", "--to-end")
    assert part["success"] is True
    assert ctl("groups", "seek", group, "no-such-queue-ctl", "--to-end")[0] == client.NOT_FOUND
    deleted = ok_json(ctl, "groups", "delete", group, "-q", queue, "--yes")
    assert deleted["deletedPartitions"] == 1
    assert ctl("groups", "delete", group, "--yes")[0] == 0


def test_dlq_list_show_retry_discard_and_messages(ctl):
    queue = f"ctl-{uuid.uuid4().hex[:8]}"
    for n in range(2):
        ok_json(ctl, "push", queue, json.dumps({"n": n}))
    for _ in range(2):
        m = ok_json(ctl, "pop", queue)["messages"][0]
        ok_json(ctl, "ack", m["partitionId"], m["transactionId"], "--lease", m["leaseId"],
                "--status", "dlq", "--error", "boom")
    listed = ok_json(ctl, "dlq", "list", "-q", queue)
    assert listed["total"] == 2
    code, out, _ = ctl("dlq", "list", "-q", queue)
    assert code == 0 and "boom" in out and "2 dead letter(s)" in out
    first, second = listed["messages"]
    shown = ok_json(ctl, "dlq", "show", first["partitionId"], first["transactionId"])
    assert shown["deadLetters"][0]["errorMessage"] == "boom"
    code, out, _ = ctl("dlq", "show", first["partitionId"], first["transactionId"])
    assert code == 0 and "boom" in out
    retried = ok_json(ctl, "dlq", "retry", first["partitionId"], first["transactionId"])
    assert retried["retried"] is True
    assert ctl("dlq", "retry", first["partitionId"], first["transactionId"])[0] == \
        client.NOT_FOUND
    assert ok_json(ctl, "dlq", "discard", second["partitionId"], second["transactionId"],
                   "--yes")["success"] is True
    assert ctl("dlq", "discard", second["partitionId"], second["transactionId"],
               "--yes")[0] == client.NOT_FOUND
    assert ok_json(ctl, "dlq", "list", "-q", queue)["total"] == 0
    msgs = ok_json(ctl, "messages", "list", "-q", queue)
    # the retried original stays (no cursor moves back), its copy is new, the discarded is gone
    assert {m["transactionId"] for m in msgs["messages"]} == {first["transactionId"],
                                                               retried["newTransactionId"]}
    code, out, _ = ctl("messages", "list", "-q", queue)
    assert code == 0 and retried["newTransactionId"] in out
    assert ctl("dlq", "show", str(uuid.uuid4()), "nope")[0] == client.NOT_FOUND


def test_maintenance_show_on_off(ctl):
    assert ok_json(ctl, "maintenance", "show")["maintenanceMode"] is False
    try:
        assert ok_json(ctl, "maintenance", "on", "pop")["pop"]["popMaintenanceMode"] is True
        shown = ok_json(ctl, "maintenance", "show")
        assert shown["popMaintenanceMode"] is True and shown["maintenanceMode"] is False
        code, out, _ = ctl("maintenance", "on", "both")
        assert code == 0 and "push maintenance on" in out and "pop maintenance on" in out
        code, out, _ = ctl("maintenance", "show")
        assert "push maintenance  yes" in out
    finally:
        both = ok_json(ctl, "maintenance", "off", "both")
    assert both["push"]["maintenanceMode"] is False and both["pop"]["popMaintenanceMode"] is False
    assert ctl("maintenance", "on", "everything")[0] == client.USAGE


def test_quarantine_list_show_replay_discard(ctl):
    listing = ok_json(ctl, "quarantine", "list")
    assert listing["count"] == 2
    code, out, _ = ctl("quarantine", "list")
    assert code == 0 and "ctl-quarantined" in out
    first, second = sorted(listing["entries"], key=lambda e: e["transactionId"])
    code, out, _ = ctl("quarantine", "show", first["id"])
    assert code == 0 and json.loads(out)["event"]["payload"] == {"i": 0}
    replayed = ok_json(ctl, "quarantine", "replay", first["id"], "-q", "ctl-replayed")
    assert replayed["status"] == "queued" and replayed["queue"] == "ctl-replayed"
    assert ok_json(ctl, "queues", "show", "ctl-replayed")["totals"]["pending"] == 1
    assert ok_json(ctl, "quarantine", "discard", second["id"], "--yes")["discarded"] is True
    for args in (("show", second["id"]), ("discard", second["id"], "--yes"),
                 ("replay", second["id"])):
        code, _, err = ctl("quarantine", *args)
        assert code == client.NOT_FOUND and err.count("\n") == 1, args
    assert ok_json(ctl, "quarantine", "list")["count"] == 0


def test_jobs_and_the_generic_api_command(ctl):
    jobs = ok_json(ctl, "jobs", "list")
    assert set(jobs) >= {"stats", "retention"}
    assert ctl("jobs", "list")[0] == 0
    assert ctl("jobs", "run", "stats")[0] == 0
    code, out, _ = ctl("api", "GET", "/api/v1/status/queues?limit=1")
    assert code == 0 and json.loads(out)["pagination"]["limit"] == 1
    code, out, _ = ctl("api", "POST", "/api/v1/configure", "-d", '{"queue": "ctl-api"}')
    assert code == 0 and json.loads(out)["configured"] is True
    assert ctl("api", "GET", "/api/v1/resources/queues/no-such-ctl")[0] == client.NOT_FOUND


def test_tokens_against_a_jwt_broker(jwt_broker, ctl):
    url = jwt_broker.url
    code, _, err = ctl("queues", "list", url=url)
    assert code == client.AUTH and "HTTP 401" in err and err.count("\n") == 1
    code, _, err = ctl("--token", "not-a-jwt", "queues", "list", url=url)
    assert code == client.AUTH and err.count("\n") == 1
    reader = jwt.encode({"sub": "ops", "role": "read-only"}, SECRET, algorithm="HS256")
    admin = jwt.encode({"sub": "ops", "role": "admin"}, SECRET, algorithm="HS256")
    assert ctl("--token", reader, "queues", "list", url=url)[0] == 0
    code, _, err = ctl("--token", reader, "maintenance", "on", "pop", url=url)
    assert code == client.AUTH and "HTTP 403" in err
    assert ctl("--token", admin, "maintenance", "show", url=url)[0] == 0


def test_the_installed_commands_help_and_version():
    bin_dir = Path(sys.executable).parent
    for args in (["--help"], ["queues", "--help"], ["dlq", "retry", "--help"]):
        run = subprocess.run([str(bin_dir / "queenctl"), *args], capture_output=True, text=True,
                             timeout=30)
        assert run.returncode == 0 and "Usage: queenctl" in run.stdout, run.stderr
    version = subprocess.run([str(bin_dir / "queenctl"), "--version"], capture_output=True,
                             text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("queenctl, version ")
    for args in (["--help"], ["--version"]):
        run = subprocess.run([str(bin_dir / "queen-broker"), *args], capture_output=True,
                             text=True, timeout=30)
        assert run.returncode == 0 and "queen-broker" in run.stdout, run.stderr
