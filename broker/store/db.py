"""The Store: the pool and the data path (push, pop, ack, the spool's upload and the
staging merge, queue configuration, dead letters).

Every public coroutine is one round trip for one request (or one fold of
several requests), and raises :class:`~broker.store.errors.StoreUnavailable` when
PostgreSQL cannot be reached, so routes can answer 503 and pushes can go to the spool.
The errors are errors.py's, the connection setup connect.py's, the argument shapes
codecs.py's, and several steps in one transaction transactions.py's.
"""
from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import asyncpg

from broker.core.domain import AckRow, PushRow
from broker.core.telemetry import telemetry
from broker.store import codecs, sql
from broker.store.connect import WHICH_SERVER, ServerInUse, open_pool
from broker.store.errors import PartitionHeld, StoreError, StoreUnavailable, mapped_errors
from broker.store.health import DatabaseHealth

MAX_CACHED_HANDLES = 100_000
"""Partition handles kept in memory at most (Store.partition_handles)."""

MAX_ORPHANED_LEASES = 10_000
"""Orphaned lease ids remembered at most (Store.pop); past it they end at their lease time."""


def now_us() -> int:
    """Wall-clock microseconds: the accept time of a push."""
    return time.time_ns() // 1000


class Store:
    def __init__(self, pool: asyncpg.Pool, acquire_timeout: float):
        self.pool = pool
        self._acquire_timeout = acquire_timeout
        # Who this broker is in queen.spool_backlog, and how long a silent
        # peer's spooled pushes hold a partition (FILE_BUFFER_ORDER_WAIT_MS).
        self.server_id = "queen"
        self.order_wait_ms = 30_000
        # How long the cluster settles after the database restarted or failed
        # over (queen.db_settling); 0 for a broker without peers.
        self.settle_ms = 0
        # Lease ids of pops that failed with the database (see pop).
        self.orphaned_leases: set[str] = set()
        # Partition id -> handle (migration 0012): a handle never changes, so each is read once.
        self._handles: dict[Any, int] = {}
        self.server = ServerInUse()
        self.health = DatabaseHealth()

    # -- lifecycle ---------------------------------------------------------
    @classmethod
    async def connect(cls, dsn: str, *, pool_size: int, connect_timeout_ms: int,
                      statement_timeout_ms: int, lock_timeout_ms: int,
                      idle_timeout_ms: int, application_name: str = "queen-broker",
                      apply: bool = True, tls: ssl.SSLContext | None = None) -> Store:
        """A pool on ``dsn`` (connect.open_pool: the schema applied first with ``apply``)."""
        pool, server = await open_pool(
            dsn, pool_size=pool_size, connect_timeout_ms=connect_timeout_ms,
            statement_timeout_ms=statement_timeout_ms, lock_timeout_ms=lock_timeout_ms,
            idle_timeout_ms=idle_timeout_ms, application_name=application_name, apply=apply,
            tls=tls)
        store = cls(pool, acquire_timeout=connect_timeout_ms / 1000)
        store.server = server
        return store

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            with mapped_errors():
                # Requests waiting for a free pooled connection (the collector's job queue).
                telemetry.db_waiting += 1
                try:
                    conn = await self.pool.acquire(timeout=self._acquire_timeout)
                finally:
                    telemetry.db_waiting -= 1
                try:
                    yield conn
                except asyncpg.exceptions.ReadOnlySQLTransactionError:
                    # This server stopped taking writes (demoted, or a standby reached
                    # with PG_TARGET_SESSION_ATTRS=any): its connection is dropped so the
                    # next one is opened anew through PG_HOST's list, to the primary when
                    # there is one.
                    conn.terminate()
                    raise
                finally:
                    await self.pool.release(conn)
        except StoreUnavailable as exc:
            self.health.failed(exc)
            raise
        self.health.succeeded()

    async def ping(self) -> bool:
        """True when PostgreSQL answers and takes writes (a standby answers but does not)."""
        try:
            async with self.connection() as conn:
                row = await conn.fetchrow(WHICH_SERVER)
        except (StoreUnavailable, StoreError):
            return False
        self.server.saw(row["host"], row["port"], row["in_recovery"])
        return not row["in_recovery"]

    # -- queue configuration and system state ------------------------------
    async def load_encryption_flags(self, queues: list[str]) -> dict[str, bool]:
        """Encryption flag of each existing queue (uncached; see QueueConfigCache)."""
        async with self.connection() as conn:
            rows = await conn.fetch(sql.QUEUE_ENCRYPTION_FLAGS, queues)
        return {r["name"]: r["encryption_enabled"] for r in rows}

    async def read_system_flags(self) -> dict[str, bool]:
        """Both maintenance flags from queen.system_state."""
        async with self.connection() as conn:
            rows = await conn.fetch(sql.SYSTEM_FLAGS)
        return {r["key"]: bool(r["enabled"]) for r in rows}

    async def set_system_flag(self, key: str, enabled: bool) -> None:
        async with self.connection() as conn:
            await conn.execute(sql.SET_SYSTEM_FLAG, key, enabled)

    async def configure(self, queue: str, namespace: str | None, task: str | None,
                        options: dict[str, Any]) -> asyncpg.Record:
        """Upsert a queue; options (by wire name) left out keep their values."""
        async with self.connection() as conn:
            row = await conn.fetchrow(sql.CONFIGURE_QUEUE, queue, namespace, task,
                                      *(options.get(name) for name, *_ in sql.QUEUE_OPTIONS))
        return row

    async def delete_queue(self, queue: str) -> bool:
        async with self.connection() as conn:
            existed = await conn.fetchval(sql.DELETE_QUEUE, queue)
        return bool(existed)

    async def list_queues(self) -> list[asyncpg.Record]:
        async with self.connection() as conn:
            return await conn.fetch(sql.LIST_QUEUES)

    async def queue_exists(self, queue: str) -> bool:
        async with self.connection() as conn:
            return bool(await conn.fetchval(sql.QUEUE_EXISTS, queue))

    async def queue_detail(self, queue: str) -> tuple[asyncpg.Record | None, list[asyncpg.Record]]:
        async with self.connection() as conn:
            q = await conn.fetchrow(sql.QUEUE_BY_NAME, queue)
            if q is None:
                return None, []
            return q, await conn.fetch(sql.QUEUE_PARTITION_STATS, q["id"])

    # -- data path ---------------------------------------------------------
    async def push(self, rows: Sequence[PushRow], conn: asyncpg.Connection | None = None,
                   accept_us: int | None = None) -> list[asyncpg.Record]:
        """Insert ``rows``, accepted at ``accept_us`` (broker clock, default
        now); returns (idx, message_id, partition_id, status, late, peer, error)
        in input order. Items to partitions with staged rows or another broker's
        spooled pushes, and every item while the database settles after a
        restart, answer ``staged``: they are in queen.staged, durable, and the
        merge moves them on in accept order. Rows with a ``request`` whose queue
        has maxSize answer ``refused`` (with the reason in ``error``) when their
        request would take the queue past it (see push_ordered_v4, which push_ordered_v5 hands such calls to)."""
        if not rows:
            return []
        args = codecs.push_call(rows, accept_us if accept_us is not None else now_us(),
                                self.server_id, self.order_wait_ms, self.settle_ms)
        if conn is not None:
            with mapped_errors():
                return await conn.fetch(sql.PUSH_ORDERED, *args)
        async with self.connection() as c:
            return await c.fetch(sql.PUSH_ORDERED, *args)

    # -- the spool's drain (queen.staged) ----------------------------------
    async def upload_spooled(self, spool_id: str, file_ms: int, file_seq: int,
                             records: Sequence[tuple],
                             oldest: Mapping[tuple[str, str], int]) -> bool:
        """Stage one spool file in one transaction: its ledger row, its records
        (tuples in ``sql.STAGED_COLUMNS`` order) by COPY, the partitions'
        counters, and this spool's backlog rows replaced by ``oldest`` (what
        is still on its disk). False when the file was uploaded before (a
        crash between the commit and the file's deletion): nothing is done."""
        counts: dict[tuple[str, str], int] = {}
        for r in records:
            pair = (r[5], r[6])
            counts[pair] = counts.get(pair, 0) + 1
        pairs = list(oldest.items())
        async with self.connection() as c, codecs.jsonb_for_copy(c):
            async with c.transaction():
                if not await c.fetchval(sql.UPLOAD_LEDGER, spool_id, file_ms, file_seq,
                                        len(records)):
                    return False
                await c.execute(sql.PRUNE_UPLOADED, spool_id, file_ms, file_seq)
                if records:
                    await c.copy_records_to_table("staged", schema_name="queen",
                                                  columns=sql.STAGED_COLUMNS, records=records)
                    await c.execute(sql.STAGE_COUNT, [q for q, _ in counts],
                                    [p for _, p in counts], list(counts.values()))
                await c.execute(sql.SPOOL_REGISTER, spool_id, [q for (q, _), _ in pairs],
                                [p for (_, p), _ in pairs], [t for _, t in pairs],
                                self.order_wait_ms)
        return True

    async def rejected_records(self, records: Sequence[tuple]) -> dict[int, str]:
        """Which of ``records`` PostgreSQL refuses for good, by position, and
        why: each half is tried under a savepoint, down to single records,
        inside a transaction that is always rolled back. Raises the store's
        error when the database fails as a whole (nothing is judged then)."""
        bad: dict[int, str] = {}

        async def probe(c: asyncpg.Connection, lo: int, hi: int) -> None:
            try:
                async with c.transaction():  # a savepoint
                    await c.copy_records_to_table("staged", schema_name="queen",
                                                  columns=sql.STAGED_COLUMNS,
                                                  records=records[lo:hi])
                return
            except (asyncpg.exceptions.DataError, asyncpg.exceptions.IntegrityConstraintViolationError,
                    ValueError, TypeError, OverflowError) as exc:
                if hi - lo == 1:
                    bad[lo] = f"{exc.__class__.__name__}: {exc}"
                    return
            mid = (lo + hi) // 2
            await probe(c, lo, mid)
            await probe(c, mid, hi)

        async with self.connection() as c, codecs.jsonb_for_copy(c):
            tx = c.transaction()
            await tx.start()
            try:
                await probe(c, 0, len(records))
            finally:
                await tx.rollback()
        return bad

    async def merge_staged(self, limit: int) -> list[asyncpg.Record]:
        """One merge batch; [] when another broker merges, the database
        settles, or nothing is eligible."""
        async with self.connection() as c:
            return await c.fetch(sql.MERGE_STAGED, limit, self.server_id, self.order_wait_ms,
                                 self.settle_ms)

    async def staging_summary(self) -> asyncpg.Record:
        async with self.connection() as c:
            return await c.fetchrow(sql.STAGING_SUMMARY)

    async def register_spool(self, oldest: Mapping[tuple[str, str], int] | None) -> None:
        """This broker's whole spool backlog (None: heartbeat only)."""
        if oldest is None:
            args: tuple = (None, None, None)
        else:
            pairs = list(oldest.items())
            args = ([q for (q, _), _ in pairs], [p for (_, p), _ in pairs], [t for _, t in pairs])
        async with self.connection() as c:
            await c.execute(sql.SPOOL_REGISTER, self.server_id, *args, self.order_wait_ms)

    async def spool_backlog_summary(self) -> list[asyncpg.Record]:
        async with self.connection() as c:
            return await c.fetch(sql.SPOOL_BACKLOG_SUMMARY)

    async def pop(self, *, queue: str | None, partition: str | None, namespace: str | None,
                  task: str | None, group: str, batch: int, max_partitions: int,
                  auto_ack: bool, lease_id: str, hints: list[str] | None = None,
                  only_hints: bool = False) -> list[asyncpg.Record]:
        """Claim and read (rows as ``sql.POP`` gives them: payloads as JSON text, creation
        times as ``created_us``); ``hints`` are tried first, and with ``only_hints`` they
        are the only partitions looked at (the hot-list's candidates). When the
        database fails during the call, the claim may have committed with
        nobody to receive it: ``lease_id`` is remembered as orphaned (the caller
        must not use it again) and ended before this broker's next pop."""
        try:
            async with self.connection() as conn:
                if self.orphaned_leases:
                    orphans = list(self.orphaned_leases)
                    await conn.execute(sql.EXPIRE_ORPHANED_LEASES, orphans)
                    self.orphaned_leases.difference_update(orphans)
                return await conn.fetch(sql.POP,
                                        queue, partition, namespace, task, group,
                                        batch, max_partitions, auto_ack, lease_id,
                                        hints or None, only_hints)
        except StoreUnavailable:
            if len(self.orphaned_leases) < MAX_ORPHANED_LEASES:  # beyond: they expire on time
                self.orphaned_leases.add(lease_id)
            raise

    async def group_policy(self, queue: str, group: str, conflation: bool) -> bool:
        """Whether the group conflates on the queue: what it first declared, stored then."""
        async with self.connection() as conn:
            return bool(await conn.fetchval(sql.GROUP_POLICY, queue, group, conflation))

    async def group_policy_scope(self, namespace: str | None, task: str | None, group: str,
                                 conflation: bool) -> bool:
        """A discovery pop's declaration stored on every matching queue that has no policy
        for the group; True when every matching queue's policy is ``conflation``."""
        async with self.connection() as conn:
            any_plain = await conn.fetchval(sql.GROUP_POLICY_SCOPE, namespace, task, group,
                                            conflation)
        return conflation and not any_plain

    async def partition_handles(self, ids: Sequence[Any]) -> dict[Any, int]:
        """The handles of partitions by id (asyncpg's UUIDs); a partition that no longer
        exists is absent. Read from PostgreSQL once per partition and kept: bounded by
        MAX_CACHED_HANDLES, past which the kept ones are dropped and read again as needed."""
        missing = [i for i in ids if i not in self._handles]
        if missing:
            async with self.connection() as conn:
                rows = await conn.fetch(sql.PARTITION_HANDLES, missing)
            if len(self._handles) + len(rows) > MAX_CACHED_HANDLES:
                self._handles.clear()
            self._handles.update((r["id"], r["handle"]) for r in rows)
        known = self._handles
        return {i: known[i] for i in ids if i in known}

    async def pending_partitions(self, queue: str, group: str, limit: int = 100_000) -> list[str]:
        async with self.connection() as conn:
            rows = await conn.fetch(sql.PENDING_PARTITIONS, queue, group, limit)
        return [r["name"] for r in rows]

    async def ack(self, rows: Sequence[AckRow], *, failed_to_dlq: bool = False,
                  conn: asyncpg.Connection | None = None) -> list[asyncpg.Record]:
        """Apply acknowledgements; returns one row per item, in input order. A partition may
        be named by its handle (a decimal number, never a UUID's form); only a batch that
        holds one pays for resolving them in SQL."""
        if not rows:
            return []
        statement = (sql.ACK_BY_REF if any(len(r.partition_id) <= 20 and r.partition_id.isdigit()
                                           for r in rows) else sql.ACK)
        if conn is not None:
            with mapped_errors():
                result = await conn.fetch(statement, *codecs.ack_call(rows, failed_to_dlq))
        else:
            async with self.connection() as c:
                result = await c.fetch(statement, *codecs.ack_call(rows, failed_to_dlq))
        return sorted(result, key=lambda r: r["idx"])

    async def ensure_subscription(self, *, group: str, queue: str, partition: str,
                                  namespace: str, task: str, mode: str, start: Any) -> None:
        """Record where a named group starts, once (later requests cannot change it)."""
        async with self.connection() as conn:
            await conn.execute(sql.ENSURE_SUBSCRIPTION, group, queue, partition, namespace,
                               task, mode, start)

    async def extend_lease(self, lease_id: str, seconds: int) -> tuple[int, Any, str | None]:
        """Returns (rows renewed, new expiry, error)."""
        async with self.connection() as conn:
            rows = await conn.fetch(sql.EXTEND_LEASE, lease_id, seconds)
            if rows:
                return len(rows), max(r["lease_expires_at"] for r in rows), None
            # Nothing renewed: tell the caller why.
            known = await conn.fetchval(sql.LEASE_KNOWN, lease_id)
            return 0, None, "Lease already expired" if known else "Lease not found"

    async def live_leases(self, lease_ids: list[str], conn: asyncpg.Connection) -> set[str]:
        with mapped_errors():
            rows = await conn.fetch(sql.LIVE_LEASES, lease_ids)
        return {str(r["lease_id"]) for r in rows}

    # -- dead letters --------------------------------------------------------
    async def dlq(self, *, queue: str | None, partition: str | None, group: str | None,
                  since: Any, until: Any, limit: int, offset: int
                  ) -> tuple[int, list[asyncpg.Record]]:
        async with self.connection() as conn:
            args = (queue, partition, group, since, until)
            total = await conn.fetchval(sql.DLQ_COUNT, *args)
            rows = await conn.fetch(sql.DLQ_PAGE, *args, limit, offset)
        return total, rows

    async def retry_dead_letter(self, partition_id: str, transaction_id: str,
                                copy_message_id: str, copy_transaction_id: str
                                ) -> tuple[list[asyncpg.Record], asyncpg.Record | None]:
        """Remove a message's DLQ rows and push a copy of it to the same partition,
        atomically. Returns (removed DLQ rows, push row of the copy); ([], None)
        when the message is not dead-lettered."""
        async with self.connection() as conn:
            with mapped_errors():
                async with conn.transaction():
                    dead = await conn.fetch(sql.RETRY_DLQ, partition_id, transaction_id)
                    if not dead:
                        return [], None
                    first = dead[0]
                    copy = PushRow(queue=first["queue"], partition=first["partition"],
                                   message_id=copy_message_id,
                                   transaction_id=copy_transaction_id,
                                   trace_id=str(first["trace_id"]) if first["trace_id"] else None,
                                   payload=first["payload"], encrypted=first["is_encrypted"],
                                   producer_sub=first["producer_sub"])
                    pushed = await self.push([copy], conn=conn)
                    if pushed[0]["status"] == "staged":
                        raise PartitionHeld(first["queue"], first["partition"])
        return dead, pushed[0]

    # -- pool figures (what /metrics reads of the pool, read here: the pool is the store's) --
    def pool_sizes(self) -> tuple[int, int, int]:
        """The pool's connections now, the idle ones among them, and its ceiling."""
        return self.pool.get_size(), self.pool.get_idle_size(), self.pool.get_max_size()

    def pool_waiting(self) -> int:
        """Acquirers waiting for a pooled connection right now (asyncpg keeps them on
        its queue; 0 when the pool does not expose it)."""
        queue = getattr(self.pool, "_queue", None)
        getters = getattr(queue, "_getters", None)
        return len(getters) if getters is not None else 0
