"""Sustained load across a database failover, and what it shows: for the Patroni fault test
and its benchmark (benchmarks/patroni_failover.py).

Producers push single messages, each producer to its own partition through one broker, and
record every answer; two consumer groups pop and acknowledge through every broker and record
what they receive. ``run`` applies a fault in the middle (a thread: it blocks) and watches
Patroni's REST health check (GET /primary) for the moment another member takes writes.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
import httpx

from tests.waiting import wait_until_async

ACKNOWLEDGED = ("queued", "buffered")
GROUPS = ("g1", "g2")


@dataclass
class Push:
    txid: str
    partition: str
    sent: float
    answered: float
    status: str  # queued / buffered / http_<code> / an exception's name


@dataclass
class Run:
    queue: str
    pushes: list[Push] = field(default_factory=list)
    # group -> (receive time, partition, txid) in the order received
    received: dict[str, list[tuple[float, str, str]]] = field(
        default_factory=lambda: {g: [] for g in GROUPS})
    fault_at: float = 0.0
    writable_at: float | None = None  # GET /primary answered 200 on the new leader
    first_errors: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ views

    def acknowledged(self) -> dict[str, list[str]]:
        """partition -> the txids answered queued or buffered, in push order."""
        out: dict[str, list[str]] = defaultdict(list)
        for p in sorted(self.pushes, key=lambda p: p.sent):
            if p.status in ACKNOWLEDGED:
                out[p.partition].append(p.txid)
        return dict(out)

    def statuses(self) -> Counter:
        return Counter(p.status for p in self.pushes)

    def errors(self) -> list[Push]:
        return [p for p in self.pushes if p.status not in ACKNOWLEDGED]

    def back_to_queued(self) -> float:
        """Seconds from the new leader taking writes to the first push answered ``queued``
        after which every answer is ``queued`` (0 when the answers never left ``queued``
        after it took writes; negative when the brokers were there before Patroni said so)."""
        assert self.writable_at is not None, "the new leader never answered GET /primary"
        answers = sorted(self.pushes, key=lambda p: p.answered)
        last_other = max((i for i, p in enumerate(answers) if p.status != "queued"),
                         default=None)
        if last_other is None:
            return 0.0
        assert last_other + 1 < len(answers), "the pushes never answered queued again"
        return answers[last_other + 1].answered - self.writable_at

    def _back_to_queued_or_none(self) -> float | None:
        """For the figures, which a failing test prints: None where back_to_queued fails."""
        try:
            return round(self.back_to_queued(), 2)
        except AssertionError:
            return None

    def delivered(self, group: str) -> dict[str, list[str]]:
        """partition -> txids ``group`` received, in the order received (repeats kept)."""
        out: dict[str, list[str]] = defaultdict(list)
        for _, partition, txid in self.received[group]:
            out[partition].append(txid)
        return dict(out)

    def delivery_ms(self) -> list[float]:
        """Push sent to first received, per acknowledged push and group, in ms."""
        sent = {p.txid: p.sent for p in self.pushes if p.status in ACKNOWLEDGED}
        out = []
        for g in GROUPS:
            first: dict[str, float] = {}
            for t, _, txid in self.received[g]:
                first.setdefault(txid, t)
            out += [(first[tx] - s) * 1000 for tx, s in sent.items() if tx in first]
        return out

    def figures(self) -> dict:
        delivery = sorted(self.delivery_ms())
        counts = self.statuses()

        def pct(q: float) -> float | None:
            return round(delivery[min(len(delivery) - 1, int(q * len(delivery)))], 1) \
                if delivery else None
        return {"pushes": len(self.pushes),
                "acknowledged": sum(counts[s] for s in ACKNOWLEDGED),
                "queued": counts["queued"], "buffered": counts["buffered"],
                "errors": len(self.pushes) - sum(counts[s] for s in ACKNOWLEDGED),
                "back_to_queued_s": self._back_to_queued_or_none(),
                "delivery_p50_ms": pct(0.50), "delivery_p99_ms": pct(0.99),
                "delivery_max_ms": round(delivery[-1], 1) if delivery else None}


async def stored(dsns: list[str], queue: str) -> dict[str, list[str]]:
    """partition -> txids stored in PostgreSQL, in seq order (read from the writable one)."""
    conn = await _connect_writable(dsns)
    try:
        rows = await conn.fetch(
            "SELECT p.name AS partition, m.transaction_id FROM queen.messages m "
            "JOIN queen.partitions p ON p.id = m.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY m.seq", queue)
    finally:
        await conn.close()
    out: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        out[r["partition"]].append(r["transaction_id"])
    return dict(out)


async def _connect_writable(dsns: list[str]) -> asyncpg.Connection:
    for dsn in dsns:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError):
            continue
        if not await conn.fetchval("SELECT pg_is_in_recovery()"):
            return conn
        await conn.close()
    raise AssertionError(f"no writable server among {dsns}")


def losses(run: Run, in_db: dict[str, list[str]]) -> list[str]:
    """Every way the acknowledged pushes were lost, duplicated or reordered, in PostgreSQL
    and in what each group received (empty when none)."""
    problems = []
    acked = run.acknowledged()
    acked_set = {tx for txs in acked.values() for tx in txs}
    views = {"PostgreSQL": in_db} | {f"group {g}": run.delivered(g) for g in GROUPS}
    for where, seen in views.items():
        for partition, want in acked.items():
            got = seen.get(partition, [])
            repeats = [tx for tx, n in Counter(got).items() if n > 1]
            if repeats:
                problems.append(f"{where}, {partition}: duplicated {repeats[:5]}")
            kept = [tx for tx in dict.fromkeys(got) if tx in acked_set]
            lost = [tx for tx in want if tx not in set(kept)]
            if lost:
                problems.append(f"{where}, {partition}: lost {len(lost)} {lost[:5]}")
            elif kept != want:
                first = next(i for i, (a, b) in enumerate(zip(kept, want, strict=True))
                             if a != b)
                problems.append(f"{where}, {partition}: reordered at {first}: "
                                f"{kept[first:first + 3]} vs {want[first:first + 3]}")
    return problems


async def run(urls: list[str], queue: str, fault: Callable[[], None],
              watch_primary: list[str], *, before_s: float, after_s: float,
              producers: int = 3, interval_s: float = 0.05, drain_s: float = 60.0) -> Run:
    """Load ``before_s``, then ``fault()`` (in a thread) while watching the REST URLs in
    ``watch_primary`` for GET /primary, load ``after_s`` more, then drain."""
    result = Run(queue)
    stop_producers, stop_consumers = asyncio.Event(), asyncio.Event()

    async def producer(k: int) -> None:
        partition = f"p{k}"
        async with httpx.AsyncClient(base_url=urls[k % len(urls)], timeout=30) as client:
            n = 0
            while not stop_producers.is_set():
                txid = f"{partition}-{n}"
                sent = time.monotonic()
                try:
                    r = await client.post("/api/v1/push", json={"items": [{
                        "queue": queue, "partition": partition, "transactionId": txid,
                        "payload": {"n": n}}]})
                    status = r.json()[0]["status"] if r.status_code in (200, 201) \
                        else f"http_{r.status_code}"
                    if r.status_code not in (200, 201):
                        result.first_errors.setdefault(status, r.text[:300])
                except (httpx.HTTPError, ValueError, LookupError) as exc:
                    status = type(exc).__name__
                    result.first_errors.setdefault(status, repr(exc)[:300])
                result.pushes.append(Push(txid, partition, sent, time.monotonic(), status))
                n += 1
                await asyncio.sleep(max(0.0, sent + interval_s - time.monotonic()))

    async def consumer(group: str, url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            while not stop_consumers.is_set():
                try:
                    r = await client.get(f"/api/v1/pop/queue/{queue}", params={
                        "consumerGroup": group, "batch": "10", "wait": "true",
                        "timeout": "1000"})
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)
                    continue
                if r.status_code != 200:
                    await asyncio.sleep(0.2 if r.status_code != 204 else 0)
                    continue
                messages = r.json().get("messages") or []
                t = time.monotonic()
                for m in messages:
                    result.received[group].append((t, m["partition"], m["transactionId"]))
                if messages:
                    await ack(client, group, messages)

    async def ack(client: httpx.AsyncClient, group: str, messages: list[dict]) -> None:
        body = {"consumerGroup": group, "acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"} for m in messages]}
        # Retried as a client honouring Retry-After would: the lease is still ours.
        while not stop_consumers.is_set():
            try:
                r = await client.post("/api/v1/ack/batch", json=body)
                if r.status_code == 200:
                    return
                result.first_errors.setdefault(f"ack http_{r.status_code}", r.text[:300])
                if r.status_code != 503:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)

    async def watch() -> None:
        async with httpx.AsyncClient(timeout=1) as client:
            while result.writable_at is None:
                for rest in watch_primary:
                    try:
                        if (await client.get(f"{rest}/primary")).status_code == 200:
                            result.writable_at = time.monotonic()
                    except httpx.HTTPError:
                        pass
                await asyncio.sleep(0.05)

    consumers = [asyncio.create_task(consumer(g, u)) for g in GROUPS for u in urls]
    pushing = [asyncio.create_task(producer(k)) for k in range(producers)]
    watcher: asyncio.Task | None = None
    try:
        await asyncio.sleep(before_s)
        result.fault_at = time.monotonic()
        watcher = asyncio.create_task(watch())
        await asyncio.to_thread(fault)
        await asyncio.wait_for(asyncio.shield(watcher), 60)
        await asyncio.sleep(after_s)
        stop_producers.set()
        await asyncio.gather(*pushing)
        acked = {tx for txs in result.acknowledged().values() for tx in txs}
        with contextlib.suppress(AssertionError):  # not drained: the checks say what is missing
            await wait_until_async(lambda: not any(
                acked - {tx for _, _, tx in result.received[g]} for g in GROUPS),
                drain_s, "both groups receiving every acknowledged push")
        await asyncio.sleep(1.0)  # a last round: anything delivered twice shows up
    finally:
        stop_producers.set()
        stop_consumers.set()
        tasks = [*pushing, *consumers, *([watcher] if watcher else [])]
        _, pending = await asyncio.wait(tasks, timeout=10)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result
