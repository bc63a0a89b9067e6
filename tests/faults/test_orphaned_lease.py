"""A pop whose claim committed in PostgreSQL but whose answer was lost with the
connection (a database crash or failover at that moment): the client got a 503 and
holds no lease, so the partition must not stay leased for the whole lease time.

Real parts: a broker whose PostgreSQL connections pass through a TCP proxy on
loopback. Armed with a marker, the proxy swallows the first reply from PostgreSQL
that carries it and closes that connection: the server has done the work and
committed (its reply is flushed at the end of the statement), the broker never
hears of it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid

import asyncpg
import httpx

from tests.conftest import free_port, start_broker


class DroppingProxy:
    """TCP proxy to PostgreSQL on its own thread and event loop (the test's blocking calls
    must not stall the broker's database traffic)."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.port = free_port()
        self.marker: bytes | None = None
        self.dropped = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DroppingProxy:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _handle(self, client_r, client_w) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return

        async def pipe(reader, writer, watch: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if watch and self.marker is not None and self.marker in data:
                        self.marker = None
                        self.dropped.set()
                        break  # swallowed: close both sides
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (client_w, server_w):
                    w.close()

        await asyncio.gather(pipe(client_r, server_w, False), pipe(server_r, client_w, True))


async def test_a_claim_whose_answer_was_lost_does_not_hold_the_partition_for_the_lease_time(
        database, tmp_path, queue_name):
    db = database
    with DroppingProxy(db.host, db.port) as proxy:
        broker = start_broker(dataclasses.replace(db, port=proxy.port), tmp_path,
                              DB_CONNECTION_TIMEOUT="1000")
        marker = f"orphan-{uuid.uuid4().hex}"
        conn = await asyncpg.connect(db.dsn)
        try:
            async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
                r = await http.post("/api/v1/push", json={"items": [
                    {"queue": queue_name, "partition": "p", "transactionId": "t1",
                     "payload": {"m": marker}}]})
                assert r.json()[0]["status"] == "queued", r.text
                pop = f"/api/v1/pop/queue/{queue_name}/partition/p"
                params = {"consumerGroup": "g", "batch": 10, "wait": "false"}

                proxy.marker = marker.encode()
                r = await http.get(pop, params=params)
                assert proxy.dropped.is_set()
                assert r.status_code == 503, r.text  # the client never got the lease
                live = await conn.fetchval(
                    "SELECT count(*) FROM queen.log_consumers lc "
                    "JOIN queen.partitions p ON p.id = lc.partition_id "
                    "JOIN queen.queues q ON q.id = p.queue_id "
                    "WHERE q.name = $1 AND lc.consumer_group = 'g' "
                    "AND lc.lease_expires_at > now()", queue_name)
                assert live == 1  # the claim committed: an orphaned lease (300 s by default)

                r = await http.get(pop, params=params)
                assert r.status_code == 200, r.text
                messages = r.json()["messages"]
                assert [m["transactionId"] for m in messages] == ["t1"]
                lease = messages[0]["leaseId"]
                assert await conn.fetchval(
                    "SELECT count(*) FROM queen.log_consumers WHERE lease_id = $1::uuid "
                    "AND lease_expires_at > now()", lease) == 1
        finally:
            await conn.close()
            broker.stop()
