"""A rolling upgrade through a running cluster: brokers of the previous release (their source
taken from git at PREVIOUS_RELEASE) keep serving while a broker of this release applies its
migrations to the shared database, and the in-flight lease one of them handed out is
acknowledged after it is replaced.

Invariants: no request of the old brokers fails while the new one migrates; every message is
delivered, and acknowledged, exactly once to its group across the upgrade; a lease taken
through an old broker is still valid (and honoured) through a new one.
"""
from __future__ import annotations

import subprocess
import tarfile
import threading
from io import BytesIO
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, BrokerProcess, db_val, launch_broker, wait_healthy

PREVIOUS_RELEASE = "706b069a60b2c0b39eb370581e60ed4e2f375612"
"""The last commit of release 0.1.0, before migrations were numbered (its boot re-applied one
idempotent schema file)."""


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
                           capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"this clone lacks commit {PREVIOUS_RELEASE} (shallow?): no old broker")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar",
                              PREVIOUS_RELEASE, "broker", "actors"],
                             capture_output=True, check=True).stdout
    root = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


def start(database, tmp: Path, source: Path | None = None) -> BrokerProcess:
    """A broker of this release, or (``source``) of the one whose code is at that path:
    ``python -m broker`` imports from its working directory."""
    broker = launch_broker(database, tmp, cwd=source or ROOT)
    return wait_healthy(broker, 30)


def push(url: str, queue: str, txids: list[str], partition: str = "p") -> list[str]:
    r = httpx.post(url + "/api/v1/push", timeout=30, json={"items": [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}
        for t in txids]})
    assert r.status_code in (200, 201), r.text
    return [item["status"] for item in r.json()]


def pop(url: str, queue: str, batch: int) -> dict:
    r = httpx.get(f"{url}/api/v1/pop/queue/{queue}", timeout=30,
                  params={"batch": str(batch), "consumerGroup": "g"})
    assert r.status_code in (200, 204), r.text
    return r.json() if r.status_code == 200 else {"messages": []}


def ack(url: str, message: dict, lease_id: str) -> None:
    """Acknowledge ``message`` under ``lease_id``; the broker must accept it."""
    r = httpx.post(url + "/api/v1/ack", timeout=30, json={
        "transactionId": message["transactionId"], "partitionId": message["partitionId"],
        "leaseId": lease_id, "status": "completed", "consumerGroup": "g"})
    assert r.status_code == 200 and r.json()[0]["success"] is True, r.text


def test_old_brokers_keep_serving_while_a_new_one_migrates_and_their_leases_survive(
        previous_release, fresh_database, tmp_path, queue_name):
    old = start(fresh_database, tmp_path, previous_release)
    assert db_val(fresh_database, "SELECT to_regclass('queen.schema_migrations')") is None
    held = [f"m-{i}" for i in range(6)]
    assert push(old.url, queue_name, held, partition="held") == ["queued"] * 6
    leased = pop(old.url, queue_name, 3)  # in flight through the old broker, across the upgrade
    assert [m["transactionId"] for m in leased["messages"]] == held[:3]

    # While the new broker boots and migrates, the old one keeps taking pushes.
    failures: list[str] = []
    during: list[str] = []
    stop = threading.Event()

    def keep_pushing():
        i = 0
        while not stop.is_set() and i < 500:
            try:
                status = push(old.url, queue_name, [f"during-{i}"])
                if status != ["queued"]:
                    failures.append(f"during-{i}: {status}")
                during.append(f"during-{i}")
            except (AssertionError, httpx.HTTPError) as exc:
                failures.append(f"during-{i}: {exc}")
            i += 1

    pusher = threading.Thread(target=keep_pushing)
    pusher.start()
    try:
        new = start(fresh_database, tmp_path)
    finally:
        stop.set()
        pusher.join(60)
    delivered: dict[str, list[str]] = {"held": held[:3], "p": []}
    try:
        assert failures == [] and during
        assert "schema: applied 0001_base" in new.log()
        assert db_val(fresh_database, "SELECT max(version) FROM queen.schema_migrations") >= 2
        # The old broker still serves after the migrations: push, pop (partition "held" is
        # leased, so this batch comes from "p"), ack.
        assert push(old.url, queue_name, ["after-migration"]) == ["queued"]
        more = pop(old.url, queue_name, 2)["messages"]
        assert [m["transactionId"] for m in more] == during[:2]
        for message in more:
            ack(old.url, message, more[0]["leaseId"])
        delivered["p"] += during[:2]

        # The old broker is replaced (stopped, the new release in its place); the lease it
        # handed out lives in PostgreSQL and is acknowledged through the new broker.
        old.stop()
        lease = leased["messages"][0]["leaseId"]
        for message in leased["messages"]:
            ack(new.url, message, lease)

        # Everything else is delivered once, in order per partition, through the new broker.
        while got := pop(new.url, queue_name, 100)["messages"]:
            for message in got:
                delivered[message["partition"]].append(message["transactionId"])
                ack(new.url, message, got[0]["leaseId"])
        assert delivered == {"held": held, "p": during + ["after-migration"]}
    finally:
        old.stop()
        new.stop()
