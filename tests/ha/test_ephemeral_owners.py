"""Ephemeral queues across three meshed brokers, through the official client.

Invariants: every broker serves every ephemeral verb of every queue, because each queue has
one owner among the brokers alive (rendezvous hashing, the same pick on every broker) and the
others pass its requests on; a message pushed through one broker is popped through another and
acked through the third, once, in order; when the owner dies, a new owner takes the queue,
empty, the change is counted, and clients carry on. A peer that cannot authenticate cannot make
a broker forward anything to it; an owner that cannot be reached is a 503, never a wrong answer.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import threading
import time

import httpx
import pytest
from queen import Queen

from actors.mesh.frames import HEARTBEAT
from broker.service.ownership import owner_of
from tests.conftest import free_port, official_client
from tests.ha.test_mesh_auth import RawPeer
from tests.ha.test_mesh_brokers import all_connected, mesh_env, start_cluster, transport
from tests.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(120)


def members(url: str) -> dict[str, str]:
    return {m["serverId"]: m["url"] for m in transport(url)["members"]}


def holder(brokers, queue: str) -> list[int]:
    """The brokers whose RAM holds messages of ``queue``."""
    out = []
    for n, b in enumerate(brokers):
        listed = httpx.get(b.url + "/api/v1/ephemeral/queues", timeout=10).json()["queues"]
        if any(q["queue"] == queue and q["messages"] > 0 for q in listed):
            out.append(n)
    return out


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics/prometheus", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


@contextlib.asynccontextmanager
async def clients(*urls: str):
    """The official client's ephemeral surface on each broker."""
    async with contextlib.AsyncExitStack() as stack:
        yield [(await stack.enter_async_context(official_client(u))).ephemeral for u in urls]


@pytest.fixture(scope="module")
def trio(module_broker_factory):
    brokers = start_cluster(module_broker_factory, 3)
    for b in brokers:
        wait_until(lambda b=b: all_connected(b.url, 2) and len(members(b.url)) == 3,
                   what=f"three members seen by {b.url}")
    return brokers


async def test_every_broker_serves_every_queue_through_its_owner(trio, queue_name):
    a, b, c = trio
    ids = members(a.url)
    assert ids == members(b.url) == members(c.url)  # one view, so one owner
    owner = sorted(ids).index(owner_of(ids, queue_name))
    async with clients(a.url, b.url, c.url) as (on_a, on_b, on_c):
        assert (await on_a.push(queue_name, [{"n": n} for n in range(5)],
                                partition="p")) == {"pushed": 5}
        assert (await on_b.push(queue_name, [{"n": n} for n in range(5, 10)],
                                partition="p")) == {"pushed": 5}
        assert holder(trio, queue_name) == [owner]  # the messages sit with the owner only
        got = await on_c.pop(queue_name, batch=100, group="g")
        assert [m["payload"]["n"] for m in got["messages"]] == list(range(10))
        acked = await on_a.ack(queue_name, got["messages"], group="g")
        assert [r["outcome"] for r in acked["results"]] == ["acked"] * 10
        assert (await on_b.pop(queue_name, batch=100, group="g"))["messages"] == []
        depth = await on_c.depth(queue_name)
        assert [g["pending"] for g in depth["groups"] if g["group"] == "g"] == [0]
    assert sum(metric(x.url, "queen_ephemeral_forwarded_total") for x in trio) > 0


async def test_a_long_poll_through_a_non_owner_is_woken_by_a_push_through_another(
        trio, queue_name):
    a, b, c = trio
    ids = members(a.url)
    owner = next(x for x in trio if x.env["QUEEN_SERVER_ID"] == owner_of(ids, queue_name))
    waiter = next(x for x in trio if x is not owner)
    pusher = next(x for x in trio if x is not owner and x is not waiter)
    async with clients(waiter.url, pusher.url) as (on_w, on_p):
        parked = asyncio.create_task(on_w.pop(queue_name, wait=True, timeout=20000, group="g"))
        await wait_until_async(lambda: parked_at(owner.url) == 1, 10, "the pop parked at the owner")
        started = time.monotonic()
        await on_p.push(queue_name, [{"hello": 1}])
        got = await parked
    assert [m["payload"] for m in got["messages"]] == [{"hello": 1}]
    assert time.monotonic() - started < 5  # a wake, not the 20 s timeout


def parked_at(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).json()["ephemeral"]["parkedPops"]


async def test_the_owner_killed_a_new_owner_takes_the_queue_empty_and_clients_carry_on(
        broker_factory, queue_name):
    brokers = start_cluster(broker_factory, 3)
    for b in brokers:
        wait_until(lambda b=b: len(members(b.url)) == 3, what="three members")
    ids = members(brokers[0].url)
    owner_id = owner_of(ids, queue_name)
    owner = next(b for b in brokers if b.env["QUEEN_SERVER_ID"] == owner_id)
    rest = [b for b in brokers if b is not owner]
    async with clients(rest[0].url, rest[1].url) as (on_x, on_y):
        await on_x.push(queue_name, [{"before": n} for n in range(3)])
        before = [metric(b.url, "queen_ephemeral_ownership_changes_total") for b in rest]
        owner.proc.kill()
        owner.proc.wait(10)
        for b in rest:
            wait_until(lambda b=b: owner_id not in members(b.url), 20, f"{b.url} to see it dead")
        new_owner = owner_of(members(rest[0].url), queue_name)
        assert new_owner in (b.env["QUEEN_SERVER_ID"] for b in rest)
        # each survivor's watcher counts the change (it looks every 0.5 s)
        wait_until(lambda: all(metric(b.url, "queen_ephemeral_ownership_changes_total") > n
                               for b, n in zip(rest, before)), 10, "the change counted")
        # the contents went with the dead owner; the queue carries on at the new one
        assert (await on_x.push(queue_name, [{"after": 1}])) == {"pushed": 1}
        got = await on_y.pop(queue_name, batch=10)
        assert [m["payload"] for m in got["messages"]] == [{"after": 1}]


def test_a_peer_without_the_secret_cannot_draw_requests_to_itself(broker_factory, queue_name):
    """A dialler that cannot authenticate is refused at its HELLO, so its heartbeat (and the
    URL in it) never counts: the broker serves the queue itself."""
    port = free_port()
    b = broker_factory(**mesh_env("queen-alone", port, [free_port()]))
    forged = RawPeer("queen-forged", secret="cd" * 32)
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen()
    url = f"http://127.0.0.1:{sink.getsockname()[1]}"
    refused = sum(transport(b.url)["rejections"].values())
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(forged.hello + forged.frame(HEARTBEAT, {"server_id": "queen-forged",
                                                          "url": url}))
        wait_until(lambda: sum(transport(b.url)["rejections"].values()) > refused, 10,
                   "the forged HELLO refused")
        assert "queen-forged" not in members(b.url)
        r = httpx.post(b.url + "/api/v1/ephemeral/push", timeout=10,
                       json={"queue": queue_name, "messages": [{"payload": 1}]})
    sink.close()
    assert r.status_code == 200 and r.json() == {"pushed": 1}


def test_an_owner_that_cannot_be_reached_is_a_503_and_nothing_is_stored_here(
        broker_factory, queue_name):
    """A peer holding the secret advertises an address where nothing listens. A queue it
    owns is answered 503 (Retry-After) by the broker, not served in the wrong place."""
    port = free_port()
    b = broker_factory(**mesh_env("queen-real", port, [free_port()]))
    closed = free_port()  # nothing listens there
    peer = RawPeer("queen-away")
    queue = next(f"{queue_name}-{n}" for n in range(1000)
                 if owner_of(["queen-real", "queen-away"], f"{queue_name}-{n}") == "queen-away")
    beat = peer.frame(HEARTBEAT, {"server_id": "queen-away", "url": f"http://127.0.0.1:{closed}"})
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(peer.hello)

        def heartbeats() -> None:  # alive for as long as the test needs it
            while not stop.is_set():
                s.sendall(beat)
                stop.wait(0.2)
            return None

        thread = threading.Thread(target=heartbeats, daemon=True)
        thread.start()
        try:
            wait_until(lambda: "queen-away" in members(b.url), 10, "the peer's URL heard")
            r = httpx.post(b.url + "/api/v1/ephemeral/push", timeout=10,
                           json={"queue": queue, "messages": [{"payload": 1}]})
            listed = httpx.get(b.url + "/api/v1/ephemeral/queues", timeout=10).json()["queues"]
        finally:
            stop.set()
            thread.join(5)
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "ephemeral_owner_unreachable"
    assert r.headers["retry-after"] == "1"
    assert not any(q["queue"] == queue and q["messages"] for q in listed)


async def test_conflation_and_supervision_hold_across_the_three_brokers(trio, queue_name):
    """Conflation and supervision keep their state in PostgreSQL, so any broker serves
    them: a group's conflation policy stored through one broker applies through the others,
    and a consumer's supervision status published through one is listed by another."""
    a, b, c = trio
    items = [{"queue": queue_name, "partition": "p", "payload": {"i": i}} for i in range(4)]
    assert httpx.post(a.url + "/api/v1/push", json={"items": items}, timeout=10).status_code == 200
    first = httpx.get(f"{b.url}/api/v1/pop/queue/{queue_name}", timeout=10, params={
        "consumerGroup": "last", "conflation": "true", "wait": "false"}).json()
    assert [m["data"]["i"] for m in first["messages"]] == [3] and first["conflation"] is True
    later = httpx.get(f"{c.url}/api/v1/pop/queue/{queue_name}", timeout=10, params={
        "consumerGroup": "last", "wait": "false"}).json()
    assert later["conflation"] is True  # stored through b, applied through c
    q = Queen(a.url)
    stop = asyncio.Event()
    try:
        async def handler(message):
            return None

        consumer = asyncio.ensure_future(  # consume() answers an awaitable builder
            q.queue(queue_name).group("supervised").batch(1).timeout_millis(500)
            .supervision({"group": "trio-app"}).consume(handler, signal=stop))

        def listed() -> list:
            body = httpx.get(c.url + "/api/v1/status/supervision?group=trio-app",
                             timeout=10).json()
            return [i for g in body["groups"] for i in g["instances"]
                    if i["status"] == "ok" and i["state"] == "running"]
        await wait_until_async(lambda: asyncio.to_thread(listed), 30,
                               "the consumer listed through another broker")
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 30)
        with contextlib.redirect_stdout(io.StringIO()):
            await q.close()
