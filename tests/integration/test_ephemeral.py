"""Ephemeral queues on one broker (docs/ephemeral.md), through the official client
(``Queen(url).ephemeral``) where it can say it, raw HTTP where the status or a header is the
point: the eight verbs, groups, leases, bounds, the long-poll gate, durability of the
configuration (and nothing else) across a restart, and hostile bodies."""
from __future__ import annotations

import asyncio
import contextlib
import io
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queen import Queen
from queen.errors import EphemeralError, EphemeralQueueNotFoundError

from tests.conftest import official_client
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(180)


def payloads(result: dict) -> list:
    return [m["payload"] for m in result["messages"]]


def depth(http: httpx.Client, queue: str) -> dict:
    r = http.get(f"/api/v1/ephemeral/queues/{queue}/depth")
    assert r.status_code == 200, r.text
    return r.json()


async def parked(client: httpx.AsyncClient) -> int:
    return (await client.get("/health")).json()["ephemeral"]["parkedPops"]


# -- the verbs ------------------------------------------------------------------------------

async def test_push_pop_ack_through_the_client(client, http, queue_name):
    eph = client.ephemeral
    assert await eph.push(queue_name, [{"n": 1}, {"payload": "two"}, 3]) == {"pushed": 3}
    result = await eph.pop(queue_name, batch=2)
    assert result["queue"] == queue_name and payloads(result) == [{"n": 1}, "two"]
    assert {m["partition"] for m in result["messages"]} == {"Default"}
    assert [m["attempts"] for m in result["messages"]] == [1, 1]
    answer = await eph.ack(queue_name, result["messages"])
    assert answer == {"results": [{"id": m["id"], "outcome": "acked"}
                                  for m in result["messages"]]}
    figures = depth(http, queue_name)
    assert (figures["messages"], figures["declared"]) == (1, False)
    assert figures["counters"]["pushed"] == 3 and figures["counters"]["acked"] == 2
    assert payloads(await eph.pop(queue_name, batch=5, partition="Default")) == [3]
    assert (await eph.pop(queue_name))["messages"] == []


async def test_configure_reset_delete_and_queues(client, http, queue_name):
    eph = client.ephemeral
    answer = await eph.configure(queue_name, max_length=50, policy="drop_oldest",
                                 window_buffer={"ms": 20, "count": 5})
    assert answer["queue"] == queue_name and answer["configured"] is True
    options = answer["options"]
    assert (options["maxLength"], options["policy"], options["windowBuffer"]) == (
        50, "drop_oldest", {"ms": 20, "count": 5})
    assert options["leaseSeconds"] == 30 and options["retryLimit"] == 3  # the defaults
    again = await eph.configure(queue_name, {"ttlSeconds": 60})  # merged over the first
    assert (again["options"]["maxLength"], again["options"]["ttlSeconds"]) == (50, 60)
    await eph.push(queue_name, ["a", "b"], partition="p1")
    await eph.push(queue_name + "-implicit", ["c"])
    listed = {q["queue"]: q for q in (await eph.queues())["queues"]}
    assert listed[queue_name]["declared"] and listed[queue_name]["messages"] == 2
    assert not listed[queue_name + "-implicit"]["declared"]
    assert await eph.reset(queue_name) == {"queue": queue_name, "dropped": 2}
    assert depth(http, queue_name)["options"]["maxLength"] == 50  # reset keeps the options
    assert await eph.reset(queue_name + "-never") == {"queue": queue_name + "-never",
                                                      "dropped": 0}
    assert await eph.delete(queue_name) == {"queue": queue_name, "deleted": True}
    assert await eph.delete(queue_name) == {"queue": queue_name, "deleted": False}
    with pytest.raises(EphemeralQueueNotFoundError) as err:
        await eph.depth(queue_name)
    assert err.value.code == "ephemeral_queue_not_found"
    await eph.delete(queue_name + "-implicit")


def test_bad_configure_and_the_not_found_body(http, queue_name):
    r = http.post("/api/v1/ephemeral/configure",
                  json={"queue": queue_name, "options": {"ttl_second": 5}})
    assert r.status_code == 400 and "ttl_second" in r.json()["error"]
    r = http.post("/api/v1/ephemeral/configure",
                  json={"queue": queue_name, "options": {"maxLength": -1}})
    assert r.status_code == 400 and "maxLength" in r.json()["error"]
    r = http.get(f"/api/v1/ephemeral/queues/{queue_name}/depth")
    assert r.status_code == 404
    assert r.json()["code"] == "ephemeral_queue_not_found" and r.json()["error"]


async def test_unknown_verbs_still_read_as_unsupported(client, http, queue_name):
    r = http.get("/api/v1/ephemeral/not-a-verb")
    assert r.status_code == 404 and r.json()["error"] == "ephemeral_unsupported"
    await client.ephemeral.push(queue_name, ["kept"])
    assert http.head("/api/v1/ephemeral/pop", params={"queue": queue_name}).status_code == 200
    assert payloads(await client.ephemeral.pop(queue_name, commit_on_delivery=True)) == ["kept"]


def test_names_with_slashes(http):
    queue = "test-eph/with slash"
    assert http.post("/api/v1/ephemeral/push",
                     json={"queue": queue, "messages": [{"payload": 1}]}).status_code == 200
    quoted = "test-eph%2Fwith%20slash"
    assert http.get(f"/api/v1/ephemeral/queues/{quoted}/depth").json()["queue"] == queue
    assert http.delete(f"/api/v1/ephemeral/queue/{quoted}").json()["deleted"] is True


# -- groups, leases, ack statuses -----------------------------------------------------------

async def test_fan_out_groups_and_competing_consumers(client, queue_name):
    eph = client.ephemeral
    for group in ("tail-a", "tail-b", "workers"):  # known before the push: nothing is missed
        assert (await eph.pop(queue_name, group=group))["messages"] == []
    await eph.push(queue_name, list(range(6)))
    for group in ("tail-a", "tail-b"):
        got = await eph.pop(queue_name, group=group, batch=10, commit_on_delivery=True)
        assert payloads(got) == list(range(6))
    first = await eph.pop(queue_name, group="workers", batch=3)
    second = await eph.pop(queue_name, group="workers", batch=3)
    assert payloads(first) == [0, 1, 2] and payloads(second) == [3, 4, 5]
    assert (await eph.pop(queue_name, group="workers"))["messages"] == []
    wrong_group = await eph.ack(queue_name, first["messages"], group="tail-a")
    assert {r["outcome"] for r in wrong_group["results"]} == {"unknown"}
    await eph.ack(queue_name, first["messages"] + second["messages"], group="workers")


async def test_lease_expiry_redelivers_then_the_retry_limit_drops(client, http, queue_name):
    eph = client.ephemeral
    await eph.configure(queue_name, lease_seconds=1, retry_limit=1)
    await eph.push(queue_name, ["m"])
    first = await eph.pop(queue_name, group="g")
    assert [m["attempts"] for m in first["messages"]] == [1]
    # Not acked: the lease's one second runs out and the long poll below is woken by it.
    again = await eph.pop(queue_name, group="g", wait=True, timeout=10000)
    assert payloads(again) == ["m"] and again["messages"][0]["attempts"] == 2
    assert again["messages"][0]["id"] == first["messages"][0]["id"]
    wait_until(lambda: depth(http, queue_name)["counters"]["dropped"]["retry_limit"] == 1, 15,
               "the second expiry dropped the message (1 + retryLimit deliveries)")
    assert depth(http, queue_name)["messages"] == 0
    late = await eph.ack(queue_name, again["messages"], group="g")
    assert late["results"][0]["outcome"] == "unknown"


async def test_failed_and_retry_statuses(client, queue_name):
    eph = client.ephemeral
    await eph.configure(queue_name, retry_limit=1)
    await eph.push(queue_name, ["x"])
    got = await eph.pop(queue_name)
    answer = await eph.ack(queue_name, got["messages"], status=False)  # failed
    assert answer["results"][0]["outcome"] == "redelivered"
    got = await eph.pop(queue_name)
    assert got["messages"][0]["attempts"] == 2
    answer = await eph.ack(queue_name, [{"id": got["messages"][0]["id"], "status": "retry"}])
    assert answer["results"][0] == {"id": got["messages"][0]["id"], "outcome": "acked",
                                    "dropped": True}


async def test_auto_ack_takes_no_lease(client, http, queue_name):
    await client.ephemeral.push(queue_name, ["a", "b"])
    got = await client.ephemeral.pop(queue_name, batch=5, auto_ack=True)
    assert payloads(got) == ["a", "b"]
    figures = depth(http, queue_name)
    assert figures["messages"] == 0 and figures["groups"][0]["leased"] == 0


# -- bounds ---------------------------------------------------------------------------------

def test_reject_answers_429_all_or_nothing_and_drop_oldest_evicts(http, queue_name):
    http.post("/api/v1/ephemeral/configure", json={"queue": queue_name,
                                                  "options": {"maxLength": 3}})
    push = {"queue": queue_name, "messages": [{"payload": i} for i in range(2)]}
    assert http.post("/api/v1/ephemeral/push", json=push).json() == {"pushed": 2}
    r = http.post("/api/v1/ephemeral/push", json=push)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["code"] == "ephemeral_queue_full" and "maxLength 3" in r.json()["detail"]
    assert depth(http, queue_name)["messages"] == 2  # nothing of the refused push
    r = http.post("/api/v1/ephemeral/push", json={"queue": queue_name, "messages": [
        {"payload": i} for i in range(4)]})
    assert r.status_code == 413 and r.json()["code"] == "ephemeral_push_too_large"
    http.post("/api/v1/ephemeral/configure", json={"queue": queue_name,
                                                  "options": {"policy": "drop_oldest"}})
    assert http.post("/api/v1/ephemeral/push", json=push).json() == {"pushed": 2}
    figures = depth(http, queue_name)
    assert figures["messages"] == 3 and figures["counters"]["dropped"]["length"] == 1
    assert figures["counters"]["rejected"] == {"full": 2, "memory": 0, "too_large": 4}
    popped = http.get("/api/v1/ephemeral/pop", params={"queue": queue_name, "batch": 10,
                                                       "autoAck": "true"}).json()
    assert payloads(popped) == [1, 0, 1]


async def test_the_client_sees_a_full_queue_as_an_ephemeral_error(queue_name, base_url):
    client = Queen(base_url, retry_429={"max_attempts": 1})
    try:
        await client.ephemeral.configure(queue_name, max_length=1)
        await client.ephemeral.push(queue_name, ["one"])
        with pytest.raises(EphemeralError) as err:
            await client.ephemeral.push(queue_name, ["two"])
        assert err.value.code == "ephemeral_queue_full"
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await client.close()


def test_max_bytes_drops_oldest_by_bytes(http, queue_name):
    http.post("/api/v1/ephemeral/configure", json={
        "queue": queue_name, "options": {"maxBytes": 25, "policy": "drop_oldest"}})
    for word in ("aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"):  # 12 bytes of JSON each
        http.post("/api/v1/ephemeral/push",
                  json={"queue": queue_name, "messages": [{"payload": word}]})
    figures = depth(http, queue_name)
    assert (figures["messages"], figures["bytes"]) == (2, 24)
    assert figures["counters"]["dropped"]["bytes"] == 1


def test_ttl_drops_aged_messages(http, queue_name):
    http.post("/api/v1/ephemeral/configure", json={"queue": queue_name,
                                                  "options": {"ttlSeconds": 1}})
    http.post("/api/v1/ephemeral/push", json={"queue": queue_name, "messages": [{"payload": 1}]})
    # The message's one second of life is the semantics; the broker's timer drops it.
    wait_until(lambda: depth(http, queue_name)["counters"]["dropped"]["ttl"] == 1, 10,
               "the aged message dropped")
    assert depth(http, queue_name)["messages"] == 0


# -- the long-poll gate ---------------------------------------------------------------------

async def test_a_push_wakes_a_parked_pop(client, base_url, queue_name):
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        before = await parked(http)
        started = time.monotonic()
        pop = asyncio.create_task(client.ephemeral.pop(queue_name, wait=True, timeout=20000))
        await wait_until_async(lambda: _more_parked(http, before), 10, "the pop parked")
        await client.ephemeral.push(queue_name, [{"hello": "world"}])
        result = await asyncio.wait_for(pop, 10)
    assert payloads(result) == [{"hello": "world"}]
    assert time.monotonic() - started < 15  # answered by the push, far before its timeout


async def _more_parked(http: httpx.AsyncClient, before: int) -> bool:
    return await parked(http) > before


async def test_a_waiting_pop_times_out_empty(client, queue_name):
    started = time.monotonic()
    result = await client.ephemeral.pop(queue_name, wait=True, timeout=300)
    assert result == {"queue": queue_name, "messages": []}
    assert time.monotonic() - started >= 0.25


async def test_the_window_buffer_fattens_a_waiting_batch(client, base_url, queue_name):
    eph = client.ephemeral
    await eph.configure(queue_name, window_buffer={"ms": 5000, "count": 3})
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        before = await parked(http)
        pop = asyncio.create_task(eph.pop(queue_name, batch=10, wait=True, timeout=20000))
        await wait_until_async(lambda: _more_parked(http, before), 10, "the pop parked")
        await eph.push(queue_name, ["one"])
        await eph.push(queue_name, ["two"])
        assert not pop.done()  # two of the three the window waits for
        await eph.push(queue_name, ["three"])
        result = await asyncio.wait_for(pop, 10)
    assert payloads(result) == ["one", "two", "three"]
    await eph.configure(queue_name, window_buffer={"ms": 300, "count": 3})
    await eph.push(queue_name, ["alone"])
    started = time.monotonic()
    result = await eph.pop(queue_name, batch=10, wait=True, timeout=20000)
    assert payloads(result) == ["alone"] and time.monotonic() - started >= 0.25


# -- the client's buffered push -------------------------------------------------------------

async def test_buffered_push_flushes_through(client, base_url, queue_name):
    eph = client.ephemeral
    answer = await eph.push(queue_name, [{"i": i} for i in range(5)], buffered={
        "message_count": 100, "time_millis": 60000})
    assert answer == {"buffered": True, "count": 5}
    assert (await eph.pop(queue_name, batch=10))["messages"] == []  # still in the buffer
    await eph.flush(queue_name)
    got = await eph.pop(queue_name, batch=10, commit_on_delivery=True)
    assert payloads(got) == [{"i": i} for i in range(5)]
    await eph.push(queue_name, ["on close"], partition="p", buffered=True)
    with contextlib.redirect_stdout(io.StringIO()):
        await client.close()  # drains what is buffered
    async with official_client(base_url) as other:
        got = await other.ephemeral.pop(queue_name, partition="p", commit_on_delivery=True)
    assert payloads(got) == ["on close"]


# -- restart: the configuration survives, the contents do not --------------------------------

async def test_configuration_survives_a_restart_contents_and_ids_do_not(broker_factory,
                                                                      queue_name):
    first = broker_factory(EPHEMERAL_MAX_BYTES="8192")
    async with official_client(first.url) as client:
        eph = client.ephemeral
        await eph.configure(queue_name, max_length=9, lease_seconds=7)
        await eph.push(queue_name, ["before"])
        await eph.push(queue_name + "-implicit", ["gone"])
        held = await eph.pop(queue_name)
        async with httpx.AsyncClient(base_url=first.url) as http:  # the global budget: 503
            r = await http.post("/api/v1/ephemeral/push", json={
                "queue": queue_name + "-big", "messages": [{"payload": "x" * 2000}] * 4})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["code"] == "ephemeral_memory_full"
    first.stop()
    second = broker_factory(EPHEMERAL_MAX_BYTES="8192")
    async with official_client(second.url) as client:
        eph = client.ephemeral
        figures = await eph.depth(queue_name)
        assert figures["declared"] and figures["messages"] == 0
        assert (figures["options"]["maxLength"], figures["options"]["leaseSeconds"]) == (9, 7)
        with pytest.raises(EphemeralQueueNotFoundError):
            await eph.depth(queue_name + "-implicit")  # implicit queues are RAM only
        answer = await eph.ack(queue_name, held["messages"])
        assert answer["results"][0]["outcome"] == "stale"
        assert (await eph.pop(queue_name))["messages"] == []
        await eph.delete(queue_name)
    second.stop()


# -- health and metrics ---------------------------------------------------------------------

def test_health_and_prometheus_show_the_rings(http, queue_name):
    http.post("/api/v1/ephemeral/push", json={"queue": queue_name, "messages": [
        {"payload": "abc"}, {"payload": "de"}]})
    figures = http.get("/health").json()["ephemeral"]
    assert figures["byQueue"][queue_name] == {"messages": 2, "bytes": 9}
    assert figures["counters"]["pushed"] >= 2 and figures["maxBytes"] == 268435456
    text = http.get("/metrics/prometheus").text
    assert f'queen_ephemeral_messages{{queue="{queue_name}"}} 2.0' in text
    assert f'queen_ephemeral_bytes{{queue="{queue_name}"}} 9.0' in text
    assert 'queen_ephemeral_dropped_total{reason="retry_limit"}' in text
    assert 'queen_ephemeral_rejected_total{reason="full"}' in text
    http.delete(f"/api/v1/ephemeral/queue/{queue_name}")


# -- hostile input: a 4xx, never a 5xx ------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                     | st.floats(allow_nan=False, allow_infinity=False),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
_NAME = st.sampled_from(["test-hyp", "", "x" * 300, "a\x00b"]) | st.integers() | st.none()
_PUSH = st.fixed_dictionaries({}, optional={
    "queue": _NAME, "partition": _NAME,
    "messages": st.lists(st.fixed_dictionaries({}, optional={
        "payload": _JSON, "transactionId": st.text(max_size=3)}) | _JSON, max_size=4) | _JSON,
})
_ACK = st.fixed_dictionaries({}, optional={
    "queue": _NAME, "group": _NAME,
    "acks": st.lists(st.fixed_dictionaries({}, optional={
        "id": st.text(max_size=60) | st.integers() | st.sampled_from(["0123456789ab-1-0"]),
        "status": st.sampled_from(["completed", "failed", "retry", "nope", ""]) | _JSON,
        "error": _JSON}) | _JSON, max_size=4) | _JSON,
})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_PUSH | _JSON)
def test_hostile_push_bodies_never_answer_5xx(http, body):
    r = http.post("/api/v1/ephemeral/push", json=body)
    assert r.status_code in (200, 400, 413), (body, r.status_code, r.text)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_ACK | _JSON)
def test_hostile_ack_bodies_never_answer_5xx(http, body):
    r = http.post("/api/v1/ephemeral/ack", json=body)
    assert r.status_code in (200, 400, 413), (body, r.status_code, r.text)
    if r.status_code == 200:
        assert {x["outcome"] for x in r.json()["results"]} <= {"stale", "unknown"}


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(params=st.dictionaries(st.sampled_from(["queue", "partition", "batch", "wait",
                                               "timeout", "group", "autoAck"]),
                              st.text(max_size=6), max_size=7))
def test_hostile_pop_queries_never_answer_5xx(http, params):
    if params.get("wait") in ("true", "1", "True", "TRUE"):
        params["timeout"] = "0"
    r = http.get("/api/v1/ephemeral/pop", params=params)
    assert r.status_code in (200, 400), (params, r.status_code, r.text)


# -- names alone cannot fill memory ---------------------------------------------------------

def test_made_up_queues_groups_and_partitions_are_charged_and_bounded(broker_factory):
    """Every queue, partition and group a caller brings into being (a pop of a made-up name
    creates one) is charged against EPHEMERAL_MAX_BYTES: past it they answer 503
    ephemeral_memory_full, the charged bytes never pass the budget, and deleting the made-up
    queues gives the room back."""
    b = broker_factory(EPHEMERAL_MAX_BYTES="65536")
    with httpx.Client(base_url=b.url, timeout=10) as http:
        answers = [http.get("/api/v1/ephemeral/pop", params={"queue": f"junk-{n}",
                                                             "group": f"g-{n}"})
                   for n in range(200)]
        statuses = {r.status_code for r in answers}
        assert statuses == {200, 503}, statuses
        refused = next(r for r in answers if r.status_code == 503)
        assert refused.json()["code"] == "ephemeral_memory_full"
        assert refused.headers["retry-after"] == "1"
        groups = [http.get("/api/v1/ephemeral/pop", params={"queue": "junk-0",
                                                            "group": f"more-{n}"})
                  for n in range(50)]
        assert groups[-1].status_code == 503
        parts = http.post("/api/v1/ephemeral/push", json={
            "queue": "junk-0", "partition": "new-partition", "messages": [{"payload": 1}]})
        assert parts.status_code == 503
        figures = http.get("/health").json()["ephemeral"]
        assert figures["chargedBytes"] <= 65536
        for r in answers:
            if r.status_code == 200:
                http.delete(f"/api/v1/ephemeral/queue/{r.json()['queue']}").raise_for_status()
        again = http.post("/api/v1/ephemeral/push", json={"queue": "fresh",
                                                          "messages": [{"payload": 1}]})
        assert again.status_code == 200, again.text
    b.stop()
