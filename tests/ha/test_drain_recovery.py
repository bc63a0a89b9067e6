"""Recovery after a PostgreSQL outage while traffic continues (docs/spool-drain.md), with
three real brokers behind a round-robin "load balancer" and no mesh.

Producer *i* owns partition ``k<i>`` and sends one message at a time (it waits for the
answer before the next), its *n*-th message to broker *(i + n) % 3*, so every partition's
pushes interleave across the three spools. Invariants, for a stop-and-start of PostgreSQL
and for a failover to a promoted synchronous standby:

* pushes answer ``queued`` again while the load goes on (before this drain design, a
  partition held by a spool stayed held as long as pushes kept coming);
* every push answered ``queued`` or ``buffered`` is stored exactly once, in the order its
  producer sent it, and a consumer group receives it in that order;
* no order exception: the database settles (FILE_BUFFER_SETTLE_MS) after its restart or
  promotion, so every broker that spooled during the outage registers before anything
  is merged past its pushes.

The figures at 1,000 msg/s are the ``outage_ha`` benchmark's; these runs are small.
"""
from __future__ import annotations

import threading
import time

import httpx

from tests.conftest import start_broker
from tests.faults.test_maintenance_and_outage import db, stored  # noqa: F401
from tests.faults.test_spool_order import consume_all
from tests.ha.test_pg_failover import database, pg_pair  # noqa: F401
from tests.waiting import wait_until, wait_until_async

PRODUCERS = 4
SETTLE_MS = "1500"


class Producers:
    """One thread per producer, round-robin over the brokers, one message at a time."""

    def __init__(self, urls: list[str], queue: str):
        self.urls, self.queue = urls, queue
        self.acknowledged: dict[str, list[str]] = {f"k{i}": [] for i in range(PRODUCERS)}
        self.answers: list[tuple[float, str]] = []  # (monotonic time sent, status)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(PRODUCERS)]

    def _run(self, i: int) -> None:
        partition, n = f"k{i}", 0
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                txid = f"{partition}-{n:05d}"
                sent = time.monotonic()
                try:
                    r = http.post(self.urls[(i + n) % len(self.urls)] + "/api/v1/push",
                                  json={"items": [{"queue": self.queue, "partition": partition,
                                                   "transactionId": txid,
                                                   "payload": {"t": txid}}]})
                except httpx.HTTPError as exc:
                    self.errors.append(f"{txid}: {exc!r}")
                    time.sleep(0.05)
                    n += 1
                    continue
                status = r.json()[0]["status"] if r.status_code in (200, 201) else str(r.status_code)
                self.answers.append((sent, status))
                if status in ("queued", "buffered"):
                    self.acknowledged[partition].append(txid)
                n += 1
                time.sleep(0.005)

    def __enter__(self) -> Producers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def queued_since(self, since: float) -> int:
        return sum(1 for sent, status in list(self.answers) if sent > since and status == "queued")

    def buffered(self) -> int:
        return sum(1 for _, status in list(self.answers) if status == "buffered")


async def stored_in_order(database, queue: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for partition, txid in await stored(database, queue):
        out.setdefault(partition, []).append(txid)
    return out


async def check_delivered_in_order(urls: list[str], database, load: Producers) -> None:
    assert not load.errors, load.errors[:5]
    total = sum(len(v) for v in load.acknowledged.values())

    async def all_stored() -> bool:
        got = await stored_in_order(database, load.queue)
        return sum(len(v) for v in got.values()) >= total
    await wait_until_async(all_stored, 60, f"all {total} acknowledged pushes stored")
    got = await stored_in_order(database, load.queue)
    for partition, txids in load.acknowledged.items():
        assert got.get(partition, []) == txids, partition
        assert consume_all(urls[0], load.queue, partition, "g1") == txids
    spools = [httpx.get(u + "/health", timeout=10).json()["spool"] for u in urls]
    assert sum(s["orderExceptions"] for s in spools) == 0, spools


async def test_three_brokers_under_load_recover_from_a_database_stop_in_order(
        db, tmp_path, queue_name):  # noqa: F811
    brokers = [start_broker(db, tmp_path, DB_CONNECTION_TIMEOUT="500",
                            FILE_BUFFER_SETTLE_MS=SETTLE_MS, QUEEN_SERVER_ID=f"rec-{x}")
               for x in "abc"]
    urls = [b.url for b in brokers]
    try:
        with Producers(urls, queue_name) as load:
            wait_until(lambda: load.queued_since(0) >= 40, 30, "traffic flowing")
            db.embedded.stop(mode="immediate")
            try:
                wait_until(lambda: load.buffered() >= 40, 30, "pushes spooled during the stop")
                time.sleep(2)
            finally:
                db.embedded.start()
            back = time.monotonic()
            # Back to queued while the load goes on, on every producer's round of brokers.
            wait_until(lambda: load.queued_since(back) >= 3 * PRODUCERS * len(urls), 60,
                       "pushes answered queued again after the database returned")
        await check_delivered_in_order(urls, db, load)
    finally:
        for b in brokers:
            b.stop()


async def test_a_failover_under_continuous_traffic_returns_to_queued_without_order_exceptions(
        pg_pair, tmp_path, queue_name):  # noqa: F811
    primary, standby = pg_pair
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    brokers = [start_broker(database(primary), tmp_path, PG_HOST=hosts, DB_CONNECTION_TIMEOUT="500",
                            FILE_BUFFER_SETTLE_MS=SETTLE_MS, QUEEN_SERVER_ID=f"fo-{x}",
                            RETENTION_INTERVAL="3600000")
               for x in "abc"]
    urls = [b.url for b in brokers]
    try:
        with Producers(urls, queue_name) as load:
            wait_until(lambda: load.queued_since(0) >= 40, 30, "traffic flowing")
            primary.stop(mode="immediate")
            wait_until(lambda: load.buffered() >= 8, 30, "pushes spooled during the failover")
            standby.promote()
            back = time.monotonic()
            wait_until(lambda: load.queued_since(back) >= 3 * PRODUCERS * len(urls), 60,
                       "pushes answered queued again on the promoted standby")
        await check_delivered_in_order(urls, database(standby), load)
    finally:
        for b in brokers:
            b.stop()
