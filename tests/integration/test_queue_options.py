"""No silent queue option: every option a client sends is applied, refused
with a 400 naming it, or accepted with an explicit ``ignored`` list in the configure answer.

maxSize: a push that would take the queue's depth past it is refused for that queue's items
(``Queue '<name>' would exceed max capacity (<max>). Current: <depth>, Batch: <n>``),
counted in queen_push_refused_total{reason="max_size"}; a push acknowledged as buffered is
never refused later (admitted past the limit, and counted in the depth).
retryDelay: a failed ack makes the partition's next delivery to that group wait so long.
Each behaviour through HTTP and through the official client where it sends the option.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import time

import httpx
import pytest
from queen import Queen

from queenctl import client as ctl_client
from queenctl.__main__ import main as queenctl_main
from tests.conftest import start_broker
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(120)

CAPACITY = re.compile(r"^Queue '(?P<queue>[^']+)' would exceed max capacity \((?P<max>\d+)\)\. "
                      r"Current: (?P<current>\d+), Batch: (?P<batch>\d+)$")


# -- helpers -----------------------------------------------------------------------------------

def configure(http: httpx.Client, queue: str, **options) -> dict:
    r = http.post("/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


def push(http: httpx.Client, queue: str, *txids: str, partition: str = "Default"
         ) -> httpx.Response:
    return http.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}
        for t in txids]})


def pop(http: httpx.Client, queue: str, group: str | None = None, **params) -> list[dict]:
    params.setdefault("wait", "false")
    if group:
        params["consumerGroup"] = group
    r = http.get(f"/api/v1/pop/queue/{queue}", params=params, timeout=60)
    assert r.status_code in (200, 204), r.text
    return r.json()["messages"] if r.status_code == 200 else []


def ack(http: httpx.Client, msg: dict, status: str = "completed", group: str | None = None
        ) -> dict:
    r = http.post("/api/v1/ack", json={
        "transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
        "leaseId": msg["leaseId"], "status": status, "consumerGroup": group})
    assert r.status_code == 200, r.text
    return r.json()[0]


def refused_total(http: httpx.Client) -> int:
    return http.get("/metrics").json()["messages"]["refused"]["max_size"]


def capacity(text: str) -> dict:
    m = CAPACITY.match(text)
    assert m, text
    return {k: (v if k == "queue" else int(v)) for k, v in m.groupdict().items()}


# -- configure: applied, refused, or ignored out loud ------------------------------------------

def test_an_unknown_option_is_answered_ignored_with_a_warning_and_one_log_line(
        http, broker, queue_name):
    body = configure(http, queue_name, leaseTim=60, leaseTime=30)
    assert body["configured"] is True
    assert body["options"]["leaseTime"] == 30  # the known one is applied
    assert body["ignored"] == ["leaseTim"]
    assert body["applied"] == ["leaseTime"]
    [warning] = body["warnings"]
    assert warning.startswith("leaseTim: ") and "unknown" in warning and "leaseTime" in warning
    lines = wait_until(lambda: [line for line in broker.log().splitlines()
                                if queue_name in line and "leaseTim" in line], 10,
                       "the configure log line")
    assert len(lines) == 1, lines


def test_a_clean_configure_answers_empty_ignored_and_warnings(http, queue_name):
    body = configure(http, queue_name, leaseTime=30, retryLimit=2, maxSize=10, retryDelay=0)
    assert body["ignored"] == [] and body["warnings"] == []
    assert sorted(body["applied"]) == ["leaseTime", "maxSize", "retryDelay", "retryLimit"]


def test_options_stored_but_not_applied_are_listed_ignored(http, queue_name):
    """A value asking for behaviour this broker does not have is ignored out loud; a value
    that only says what the broker does anyway (priority 0, dlqAfterMaxRetries true) is not."""
    body = configure(http, queue_name, priority=5, ttl=60, deadLetterQueue=False,
                     dlqAfterMaxRetries=True, retryLimit=1)
    assert body["ignored"] == ["priority", "ttl", "deadLetterQueue"]
    assert [w.split(":")[0] for w in body["warnings"]] == body["ignored"]
    assert body["options"]["priority"] == 5  # still stored and reported
    assert sorted(body["applied"]) == ["dlqAfterMaxRetries", "retryLimit"]
    assert configure(http, queue_name, priority=0, deadLetterQueue=True)["ignored"] == []


def test_dead_lettering_options_are_true_and_false_is_not_stored(http, queue_name):
    """Dead-lettering is always on, so a queue says so: true for a configured queue, for a
    queue a push created, and after a configure that sent false (not stored)."""
    created = configure(http, queue_name)["options"]
    assert created["deadLetterQueue"] is True and created["dlqAfterMaxRetries"] is True
    body = configure(http, queue_name, deadLetterQueue=False, dlqAfterMaxRetries=False)
    assert body["ignored"] == ["deadLetterQueue", "dlqAfterMaxRetries"]
    assert body["options"]["deadLetterQueue"] is True
    assert body["options"]["dlqAfterMaxRetries"] is True
    pushed = f"{queue_name}-pushed"
    r = http.post("/api/v1/push", json={"items": [{"queue": pushed, "payload": {"n": 1}}]})
    assert r.status_code in (200, 201), r.text
    shown = http.get(f"/api/v1/resources/queues/{pushed}").json()
    assert shown["options"]["deadLetterQueue"] is True
    assert shown["options"]["dlqAfterMaxRetries"] is True


def test_retention_ages_are_ignored_while_retention_is_off(http, queue_name):
    assert configure(http, queue_name, retentionSeconds=60)["ignored"] == ["retentionSeconds"]
    body = configure(http, queue_name, retentionEnabled=True, completedRetentionSeconds=30)
    assert body["ignored"] == []
    # retention now on (stored): the age alone is applied
    assert configure(http, queue_name, retentionSeconds=90)["ignored"] == []


def test_values_of_the_wrong_type_are_refused_with_a_400_naming_the_option(http, queue_name):
    r = http.post("/api/v1/configure", json={"queue": queue_name,
                                             "options": {"maxSize": "ten"}})
    assert r.status_code == 400 and "maxSize" in r.json()["error"]
    r = http.post("/api/v1/configure", json={"queue": queue_name,
                                             "options": {"retryDelay": -1}})
    assert r.status_code == 400 and "retryDelay" in r.json()["error"]


def test_encryption_without_a_key_is_ignored_out_loud(broker_factory, queue_name):
    keyless = broker_factory()  # no QUEEN_ENCRYPTION_KEY
    with httpx.Client(base_url=keyless.url, timeout=30) as http:
        body = configure(http, queue_name, encryptionEnabled=True)
    assert body["ignored"] == ["encryptionEnabled"]
    assert "QUEEN_ENCRYPTION_KEY" in body["warnings"][0]


async def test_the_official_clients_configure_is_all_applied(client, queue_name):
    """queue(...).create() sends the client's defaults: nothing of it is ignored."""
    result = await client.queue(queue_name).create()
    assert result["configured"] is True
    assert result["ignored"] == [] and result["warnings"] == []
    assert set(result["applied"]) >= {"leaseTime", "retryLimit", "maxSize", "windowBuffer"}


async def test_the_official_client_hears_of_a_misspelt_option(client, queue_name):
    result = await client.queue(queue_name).config({"lease_tim": 60, "retry_delay": 250}).create()
    assert result["ignored"] == ["leaseTim"]
    assert result["options"]["retryDelay"] == 250


def test_queenctl_configure_with_a_misspelt_option_exits_non_zero(broker, queue_name, capsys):
    capsys.readouterr()
    code = queenctl_main(["--url", broker.url, "queues", "configure", queue_name,
                          "-o", "leaseTim=60", "-o", "retryLimit=2"])
    out, err = capsys.readouterr()
    assert code == ctl_client.FAILED, (out, err)
    assert "leaseTim" in err and "ignored" in err and "leaseTime" in err
    assert "retryLimit=2" in out  # what was applied is still printed
    code = queenctl_main(["--url", broker.url, "--json", "queues", "configure", queue_name,
                          "-o", "retryLimit=3"])
    out, err = capsys.readouterr()
    assert code == ctl_client.OK, err
    assert json.loads(out)["ignored"] == []


# -- maxSize ------------------------------------------------------------------------------------

def test_max_size_refuses_the_pushes_past_it(http, queue_name):
    """The measured report: maxSize 2, then 4 pushes: 2 queued, 2 refused with the
    reference's text; a consumed message makes room again."""
    configure(http, queue_name, maxSize=2)
    before = refused_total(http)
    answers = [push(http, queue_name, f"m{i}") for i in range(4)]
    assert [r.status_code for r in answers] == [200, 200, 409, 409]
    assert [r.json()[0]["status"] for r in answers[:2]] == ["queued", "queued"]
    for r in answers[2:]:
        assert capacity(r.json()["error"]) == {"queue": queue_name, "max": 2, "current": 2,
                                               "batch": 1}
    assert refused_total(http) - before == 2
    [m] = pop(http, queue_name)
    ack(http, m)
    r = push(http, queue_name, "m4")
    assert r.status_code == 200 and r.json()[0]["status"] == "queued"
    assert push(http, queue_name, "m5").status_code == 409


def test_a_push_is_admitted_or_refused_whole_per_queue(http, queue_name):
    configure(http, queue_name, maxSize=3)
    assert push(http, queue_name, "a", "b").status_code == 200
    r = push(http, queue_name, "c", "d")
    assert r.status_code == 409
    assert capacity(r.json()["error"])["batch"] == 2
    assert push(http, queue_name, "c").status_code == 200  # exactly to the limit


def test_only_the_full_queues_items_are_refused(http, queue_name):
    other = queue_name + "-other"
    configure(http, queue_name, maxSize=1)
    assert push(http, queue_name, "x").status_code == 200
    r = http.post("/api/v1/push", json={"items": [
        {"queue": other, "transactionId": "o1", "payload": 1},
        {"queue": queue_name, "transactionId": "y", "payload": 2},
        {"queue": other, "transactionId": "o2", "payload": 3}]})
    assert r.status_code == 200, r.text
    first, refused, third = r.json()
    assert (first["status"], third["status"]) == ("queued", "queued")
    assert refused["status"] == "failed" and refused["transactionId"] == "y"
    assert capacity(refused["error"])["queue"] == queue_name


def test_a_duplicate_is_answered_duplicate_not_refused(http, queue_name):
    configure(http, queue_name, maxSize=1)
    assert push(http, queue_name, "once").json()[0]["status"] == "queued"
    r = push(http, queue_name, "once")
    assert r.status_code == 200 and r.json()[0]["status"] == "duplicate"
    assert push(http, queue_name, "twice").status_code == 409


def test_depth_is_what_the_slowest_consumer_has_not_finished(http, queue_name):
    """Depth = messages after the least advanced cursor (groups and queue mode that read the
    partition); a group that finished does not make room while another is behind."""
    configure(http, queue_name, maxSize=2)
    assert push(http, queue_name, "a", "b").status_code == 200
    fast = pop(http, queue_name, "fast", batch=2, subscriptionMode="all")
    for m in fast:
        ack(http, m, group="fast")
    slow = pop(http, queue_name, "slow", batch=1, subscriptionMode="all")
    r = push(http, queue_name, "c")
    assert r.status_code == 409 and capacity(r.json()["error"])["current"] == 2
    ack(http, slow[0], group="slow")
    assert push(http, queue_name, "c").status_code == 200


def test_a_transactions_push_past_max_size_rolls_it_back(http, queue_name):
    configure(http, queue_name, maxSize=1)
    assert push(http, queue_name, "in").status_code == 200
    r = http.post("/api/v1/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": queue_name, "transactionId": "t1", "payload": 1}]}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is False
    assert capacity(body["error"])["queue"] == queue_name


def test_the_refusal_counter_is_in_prometheus(http, queue_name):
    configure(http, queue_name, maxSize=1)
    push(http, queue_name, "a")
    assert push(http, queue_name, "b").status_code == 409
    text = http.get("/metrics/prometheus").text
    [line] = [x for x in text.splitlines() if x.startswith("queen_push_refused_total{")]
    assert 'reason="max_size"' in line and float(line.split()[-1]) >= 1


async def test_the_official_client_raises_the_capacity_error(client, queue_name):
    await client.queue(queue_name).config({"max_size": 1}).create()
    await client.queue(queue_name).push([{"data": 1}])
    with pytest.raises(Exception) as refused:
        await client.queue(queue_name).push([{"data": 2}])
    assert capacity(str(refused.value)) == {"queue": queue_name, "max": 1, "current": 1,
                                            "batch": 1}


async def test_buffered_pushes_are_admitted_past_max_size_and_count_in_the_depth(
        fresh_database, tmp_path, queue_name):
    """An acknowledged push is never lost: pushes spooled during push maintenance are
    merged past maxSize, and the direct pushes after them are refused until consumers
    bring the depth back under it."""
    broker = start_broker(fresh_database, tmp_path)
    try:
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
            r = await http.post("/api/v1/configure", json={"queue": queue_name,
                                                           "options": {"maxSize": 2}})
            assert r.status_code == 200
            assert (await http.post("/api/v1/system/maintenance",
                                    json={"enabled": True})).status_code == 200
            for i in range(4):
                r = await http.post("/api/v1/push", json={"items": [
                    {"queue": queue_name, "transactionId": f"b{i}", "payload": i}]})
                assert r.status_code == 201 and r.json()[0]["status"] == "buffered", r.text
            assert (await http.post("/api/v1/system/maintenance",
                                    json={"enabled": False})).status_code == 200

            async def stored() -> bool:
                q = (await http.get(f"/api/v1/resources/queues/{queue_name}")).json()
                return q.get("totals", {}).get("total") == 4
            await wait_until_async(stored, 30, "the 4 buffered pushes merged", interval=0.2)
            r = await http.post("/api/v1/push", json={"items": [
                {"queue": queue_name, "transactionId": "direct", "payload": 9}]})
            assert r.status_code == 409
            assert capacity(r.json()["error"])["current"] == 4
    finally:
        broker.stop()


# -- retryDelay ---------------------------------------------------------------------------------

def test_retry_delay_holds_the_partition_after_a_failed_ack(http, queue_name):
    configure(http, queue_name, retryDelay=1500, retryLimit=3)
    push(http, queue_name, "m0")
    [m] = pop(http, queue_name)
    nacked = time.monotonic()
    assert ack(http, m, status="failed")["leaseReleased"] is True
    assert pop(http, queue_name) == []  # held
    again = pop(http, queue_name, wait="true", timeout="10000")
    waited = time.monotonic() - nacked
    assert [x["transactionId"] for x in again] == ["m0"]
    assert 1.4 <= waited < 1.5 + 3.0, waited


def test_retry_delay_holds_only_the_group_that_failed(http, queue_name):
    configure(http, queue_name, retryDelay=30000, retryLimit=3)
    push(http, queue_name, "m0")
    [m] = pop(http, queue_name, "g1", subscriptionMode="all")
    ack(http, m, status="failed", group="g1")
    assert pop(http, queue_name, "g1") == []
    assert [x["transactionId"] for x in pop(http, queue_name, "g2", subscriptionMode="all")] \
        == ["m0"]


def test_without_retry_delay_a_failed_message_comes_back_at_once(http, queue_name):
    assert configure(http, queue_name, retryLimit=3)["options"]["retryDelay"] == 0  # default
    push(http, queue_name, "m0")
    [m] = pop(http, queue_name)
    ack(http, m, status="failed")
    assert [x["transactionId"] for x in pop(http, queue_name)] == ["m0"]


def test_a_dead_lettered_message_does_not_hold_the_next_one(http, queue_name):
    configure(http, queue_name, retryDelay=30000, retryLimit=0)
    push(http, queue_name, "m0", "m1")
    [m] = pop(http, queue_name)
    assert ack(http, m, status="failed")["dlq"] is True
    assert [x["transactionId"] for x in pop(http, queue_name)] == ["m1"]


async def test_retry_delay_through_the_official_client(client, queue_name):
    await client.queue(queue_name).config({"retry_delay": 1200, "retry_limit": 3}).create()
    await client.queue(queue_name).push([{"transactionId": "m0", "data": 0}])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        [m] = await client.queue(queue_name).batch(1).wait(False).pop()
        nacked = time.monotonic()
        assert (await client.ack(m, False))["success"] is True
        assert await client.queue(queue_name).batch(1).wait(False).pop() == []
        again = await client.queue(queue_name).batch(1).wait(True).timeout_millis(10000).pop()
    waited = time.monotonic() - nacked
    assert "Pop failed" not in out.getvalue(), out.getvalue()
    assert [x["transactionId"] for x in again] == ["m0"]
    assert 1.1 <= waited < 1.2 + 3.0, waited


async def test_consume_retries_after_the_delay(base_url, queue_name):
    """consume() nacks a failing handler and keeps polling: the delay slows the retry, it
    does not lose it (the client's own retry semantics)."""
    q = Queen(base_url)
    try:
        await q.queue(queue_name).config({"retry_delay": 500, "retry_limit": 3}).create()
        await q.queue(queue_name).push([{"transactionId": "m0", "data": 0}])
        seen: list[float] = []

        async def handler(_msg):
            seen.append(time.monotonic())
            if len(seen) == 1:
                raise RuntimeError("transient")

        await asyncio.wait_for(q.queue(queue_name).batch(1).limit(2).timeout_millis(2000)
                               .consume(handler), 30)
        assert len(seen) == 2 and seen[1] - seen[0] >= 0.45, seen
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()
