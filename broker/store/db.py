"""The store: the only code that talks to PostgreSQL.

Every public coroutine is one round trip for one request (or one fold of
several requests), and raises :class:`StoreUnavailable` when PostgreSQL cannot
be reached, so routes can answer 503 and pushes can go to the spool.
"""
from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import ujson
from loguru import logger

from broker.core.domain import AckRow
from broker.core.telemetry import telemetry
from broker.store import sql
from broker.store.health import DatabaseHealth
from broker.store.schema import apply_schema


class StoreUnavailable(Exception):
    """PostgreSQL could not be reached (refused, timed out, pool exhausted)."""


class StoreError(Exception):
    """PostgreSQL refused the request; the message is safe to show a caller."""


# Errors that mean "the database is not there" rather than "the request is wrong".
UNAVAILABLE_ERRORS = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.InterfaceError,
    # A read-only server (a standby, or a primary being demoted) is not a place to write:
    # the push is spooled rather than failed, and the connection is dropped so the pool
    # opens a new one through PG_HOST's list (see Store.connection).
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    # Every PG_HOST server answered, none with the session attributes asked for (only
    # standbys, e.g. between a primary's death and a standby's promotion).
    asyncpg.exceptions.TargetServerAttributeNotMatched,
    # asyncpg's own protocol state error, met when the server goes away mid-statement
    # ("cannot switch to state 12; another operation (2) is in progress"): it was a 500.
    asyncpg.exceptions.InternalClientError,
)


class StoreInvalidValue(StoreError):
    """PostgreSQL refused a value the caller sent (SQLSTATE class 22: a NUL
    character, NaN, a number out of range...): the caller's mistake, a 400."""


class PartitionHeld(StoreError):
    """A push that cannot wait behind staged pushes (a transaction, a DLQ retry)
    went to a partition that has staged rows or some broker's spooled pushes,
    or arrived while the database settles after a restart: nothing was
    committed; a 503, retry shortly."""

    def __init__(self, queue: str, partition: str):
        super().__init__(f"pushes to {queue}/{partition} are still being drained from a "
                         "spool after a database outage or maintenance; retry shortly")


class StoreConflict(StoreError):
    """PostgreSQL aborted the transaction (deadlock, serialization); safe to rerun."""


class StoreBusy(StoreError):
    """PostgreSQL is there but the request waited too long (lock_timeout, statement_timeout):
    nothing was written, and the caller should retry later (503 + Retry-After). Unlike
    StoreUnavailable a push is not spooled for it: the database is up, just contended."""


# What the caller sent that PostgreSQL refused, by SQLSTATE (class 22), in the caller's terms.
_INVALID_VALUE_REASONS = {
    "22021": "a text field contains a NUL character (\\u0000)",  # character_not_in_repertoire
    "22P05": "a JSON value contains a NUL character (\\u0000)",   # untranslatable_character
    "22003": "a number is out of range",                            # numeric_value_out_of_range
    "22008": "a timestamp is out of range",                         # datetime_field_overflow
    "22007": "a timestamp is not valid",                            # invalid_datetime_format
    "22P02": "a value is not in the expected format (UUID, number or JSON)",
    "22001": "a text field is too long",                            # string_data_right_truncation
    "22032": "a JSON value is not valid",                           # invalid_json_text
}


def _invalid_value_message(exc: asyncpg.exceptions.DataError) -> str:
    reason = _INVALID_VALUE_REASONS.get(exc.sqlstate)
    if reason is None and isinstance(exc.__cause__, (OverflowError, ValueError)):
        # asyncpg could not encode an argument ("invalid input for query argument $6: ...").
        reason = ("a number or timestamp is out of range" if "range" in str(exc.__cause__)
                  else "a value has the wrong type")
    return f"invalid value: {reason or 'PostgreSQL refused a value of this request'}"


def fails_every_request(exc: BaseException) -> bool:
    """An error about the database rather than about one request (it is
    unreachable, or busy past a timeout): every request of a folded round trip
    would meet it alike, so none is retried alone, and a spooled event that
    meets it is kept for a later replay."""
    return isinstance(exc, (StoreUnavailable, StoreBusy))


@contextlib.contextmanager
def _mapped_errors():
    try:
        yield
    except (asyncpg.exceptions.DeadlockDetectedError,
            asyncpg.exceptions.SerializationError) as exc:
        what = ("deadlock" if isinstance(exc, asyncpg.exceptions.DeadlockDetectedError)
                else "serialization failure")
        raise StoreConflict(f"database conflict with a concurrent request ({what}); "
                            f"retry later") from exc
    except asyncpg.exceptions.LockNotAvailableError as exc:
        telemetry.ops["db_errors"] += 1
        raise StoreBusy("database busy: waited too long for a lock another request holds; "
                        "retry later") from exc
    except asyncpg.exceptions.QueryCanceledError as exc:  # statement_timeout, pg_cancel_backend
        telemetry.ops["db_errors"] += 1
        raise StoreBusy("database busy: the request took longer than the statement timeout; "
                        "retry later") from exc
    except asyncpg.exceptions.DataError as exc:
        raise StoreInvalidValue(_invalid_value_message(exc)) from exc
    except UNAVAILABLE_ERRORS as exc:
        telemetry.ops["db_errors"] += 1
        raise StoreUnavailable(f"database unavailable: {exc.__class__.__name__}: {exc}") from exc
    except asyncpg.exceptions.PostgresError as exc:
        telemetry.ops["db_errors"] += 1
        raise StoreError(f"database error (SQLSTATE {exc.sqlstate})") from exc


@contextlib.asynccontextmanager
async def _jsonb_for_copy(conn: asyncpg.Connection):
    """COPY is binary, and the pool's jsonb codec is text: for the duration,
    jsonb goes as its binary form (a version byte, 1, then the JSON text,
    given as str), then the pool's codec is set again (_json_codecs)."""
    await conn.set_type_codec("jsonb", schema="pg_catalog", format="binary",
                              encoder=lambda text: b"\x01" + text.encode(),
                              decoder=lambda data: ujson.loads(data[1:]))
    try:
        yield
    finally:
        if not conn.is_closed():
            await _json_codecs(conn)


async def _json_codecs(conn: asyncpg.Connection) -> None:
    """Every pooled connection's json and jsonb codecs: Python values in, out."""
    await conn.set_type_codec("jsonb", encoder=_dumps, decoder=ujson.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=_dumps, decoder=ujson.loads, schema="pg_catalog")


MAX_CACHED_HANDLES = 100_000
"""Partition handles kept in memory at most (Store.partition_handles)."""

MAX_ORPHANED_LEASES = 10_000
"""Orphaned lease ids remembered at most (Store.pop); past it they end at their lease time."""


def _uniform(values: list[Any]) -> tuple[Any, list[Any] | None]:
    """(the value, None) when every element of ``values`` (not empty) equals the first,
    else (None, ``values``): a compact call's scalar-or-array pair (see sql.PUSH_ORDERED)."""
    first = values[0]
    return (first, None) if values.count(first) == len(values) else (None, values)


def now_us() -> int:
    """Wall-clock microseconds: the accept time of a push."""
    return time.time_ns() // 1000


def _dumps(value: Any) -> str:
    return ujson.dumps(value, escape_forward_slashes=False)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing. asyncpg's default resets every session on release
    (RESET ALL, UNLISTEN, advisory unlock), which costs a full round trip per
    request. The broker never changes session state on a pooled connection; an
    open transaction is still rolled back by asyncpg itself, and the retention
    job releases its advisory lock explicitly (or terminates the connection)."""


_WHICH_SERVER = """
SELECT coalesce(host(inet_server_addr()), 'local socket') AS host,
       coalesce(inet_server_port(), 0) AS port,
       pg_is_in_recovery() AS in_recovery
"""
"""The server a connection landed on (PG_HOST may list several) and whether it is a standby."""


@dataclass
class ServerInUse:
    """The PostgreSQL server the pool's connections go to, as its newest connection found it.
    With several PG_HOST entries this moves after a failover; each move is logged once."""
    host: str | None = None
    port: int | None = None
    read_only: bool | None = None

    @property
    def address(self) -> str | None:
        return None if self.host is None else f"{self.host}:{self.port}"

    def saw(self, host: str, port: int, read_only: bool) -> None:
        before = self.address
        self.host, self.port, self.read_only = host, port, read_only
        if self.address != before:
            role = "read-only: a standby, nothing will be written" if read_only else "writable"
            if before is None:
                logger.info("database: connected to {} ({})", self.address, role)
            else:
                logger.warning("database: now on {} ({}); was {}", self.address, role, before)


def unverified_tls() -> ssl.SSLContext:
    """Encrypt without verifying the server (PG_SSL_REJECT_UNAUTHORIZED=false). Given to
    asyncpg as a context because its sslmode=require still verifies whenever a CA file is
    found (PGSSLROOTCERT, ~/.postgresql/root.crt), which would make "false" mean "maybe"."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _connection_setup(server: ServerInUse):
    async def init(conn: asyncpg.Connection) -> None:
        await _json_codecs(conn)
        row = await conn.fetchrow(_WHICH_SERVER)
        server.saw(row["host"], row["port"], row["in_recovery"])
    return init


@dataclass(slots=True)  # not frozen: per item, like broker.core.domain.AckRow
class PushRow:
    """One item of a push, validated and ready to insert."""
    queue: str
    partition: str
    message_id: str
    transaction_id: str
    trace_id: str | None
    payload: Any
    encrypted: bool = False
    producer_sub: str | None = None
    payload_json: str | None = None  # ``payload`` already serialized (and checked)
    # The client push request this item came in: its items of a queue with maxSize are
    # admitted or refused together. None: not checked (an acknowledged push replayed, a
    # timer delivered, a dead letter retried: they must not be lost).
    request: int | None = None


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
        """A pool on ``dsn``; ``tls``, when given, is the TLS context of every connection
        (else the DSN's sslmode decides)."""
        server_settings = {
            "timezone": "UTC",  # timestamps go out with a literal Z
            "statement_timeout": str(statement_timeout_ms),
            "lock_timeout": str(lock_timeout_ms),
            "idle_in_transaction_session_timeout": str(idle_timeout_ms),
            "application_name": application_name,
        }
        timeout = connect_timeout_ms / 1000
        tls_arg = {} if tls is None else {"ssl": tls}
        if apply:
            conn = await asyncpg.connect(dsn, timeout=timeout, server_settings=server_settings,
                                         **tls_arg)
            try:
                await apply_schema(conn)
            finally:
                await conn.close()
        server = ServerInUse()
        pool = await asyncpg.create_pool(
            dsn, min_size=min(2, pool_size), max_size=pool_size, timeout=timeout,
            server_settings=server_settings, init=_connection_setup(server),
            reset=_keep_session, max_inactive_connection_lifetime=60, **tls_arg,
        )
        store = cls(pool, acquire_timeout=timeout)
        store.server = server
        return store

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def connection(self):
        try:
            with _mapped_errors():
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
                row = await conn.fetchrow(_WHICH_SERVER)
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

    async def queue_detail(self, queue: str) -> tuple[asyncpg.Record | None, list[asyncpg.Record]]:
        async with self.connection() as conn:
            q = await conn.fetchrow(sql.QUEUE_BY_NAME, queue)
            if q is None:
                return None, []
            return q, await conn.fetch(sql.QUEUE_PARTITION_STATS, q["id"])

    # -- data path ---------------------------------------------------------
    def _push_args(self, rows: Sequence[PushRow], accept: Sequence[int]) -> tuple:
        """push_ordered_v3's plain parallel arrays: the streams cycle passes them on
        (store/streams.py); the data path's own call is ``_push_call``."""
        return (
            list(range(len(rows))),
            [r.queue for r in rows],
            [r.partition for r in rows],
            [r.message_id for r in rows],
            [r.transaction_id for r in rows],
            [r.trace_id for r in rows],
            [r.payload_json if r.payload_json is not None else _dumps(r.payload) for r in rows],
            [r.encrypted for r in rows],
            [r.producer_sub for r in rows],
            list(accept), self.server_id, self.order_wait_ms, self.settle_ms,
        )

    def _push_call(self, rows: Sequence[PushRow], accept_us: int) -> tuple:
        """``sql.PUSH_ORDERED``'s arguments: columns whose items all agree go as one value."""
        n = len(rows)
        queue, queues = _uniform([r.queue for r in rows])
        partition, partitions = _uniform([r.partition for r in rows])
        traces = [r.trace_id for r in rows]
        encrypted = [r.encrypted for r in rows]
        sub, subs = _uniform([r.producer_sub for r in rows])
        request, requests = _uniform([r.request for r in rows])
        return (
            n, queues, queue, partitions, partition,
            [r.message_id for r in rows],
            [r.transaction_id for r in rows],
            None if traces.count(None) == n else traces,
            [r.payload_json if r.payload_json is not None else _dumps(r.payload) for r in rows],
            encrypted if True in encrypted else None,
            subs, sub, accept_us, self.server_id, self.order_wait_ms, self.settle_ms,
            requests, request,
        )

    async def push(self, rows: Sequence[PushRow], conn: asyncpg.Connection | None = None,
                   accept_us: int | None = None) -> list[asyncpg.Record]:
        """Insert ``rows``, accepted at ``accept_us`` (broker clock, default
        now); returns (idx, message_id, partition_id, status, late, peer, error)
        in input order. Items to partitions with staged rows or another broker's
        spooled pushes, and every item while the database settles after a
        restart, answer ``staged``: they are in queen.staged, durable, and the
        merge moves them on in accept order. Rows with a ``request`` whose queue
        has maxSize answer ``refused`` (with the reason in ``error``) when their
        request would take the queue past it (see push_ordered_v4)."""
        if not rows:
            return []
        args = self._push_call(rows, accept_us if accept_us is not None else now_us())
        if conn is not None:
            with _mapped_errors():
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
        async with self.connection() as c, _jsonb_for_copy(c):
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

        async with self.connection() as c, _jsonb_for_copy(c):
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

    @staticmethod
    def _ack_call(rows: Sequence[AckRow], failed_to_dlq: bool) -> tuple:
        """``sql.ACK``'s arguments: columns whose items all agree go as one value."""
        status, statuses = _uniform([r.status for r in rows])
        error, errors = _uniform([r.error for r in rows])
        group, groups = _uniform([r.consumer_group for r in rows])
        lease, leases = _uniform([r.lease_id for r in rows])
        return (len(rows), [r.transaction_id for r in rows], [r.partition_id for r in rows],
                statuses, status, errors, error, groups, group, leases, lease, failed_to_dlq)

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
            with _mapped_errors():
                result = await conn.fetch(statement, *self._ack_call(rows, failed_to_dlq))
        else:
            async with self.connection() as c:
                result = await c.fetch(statement, *self._ack_call(rows, failed_to_dlq))
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
        with _mapped_errors():
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
            with _mapped_errors():
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


class TransactionAborted(Exception):
    """The transaction was rolled back: nothing of it is committed. ``failed_at`` is the
    (step, row) of the ack that failed; ``dead_lease`` the required lease that was not
    live (the transaction then failed before any step ran)."""

    def __init__(self, reason: str, *, failed_at: tuple[int, int] | None = None,
                 dead_lease: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.failed_at = failed_at
        self.dead_lease = dead_lease


Hook = Callable[[asyncpg.Connection], Awaitable[None]]
"""Extra work of a transaction on its connection (the key/value and timer riders): it
keeps its own results, and raises to roll the whole transaction back. It runs again
when the transaction is rerun after a deadlock, so it must overwrite, not append."""


async def run_transaction(store: Store, steps: list[tuple[str, list]],
                          required_leases: list[str], *, before: Hook | None = None,
                          after: Hook | None = None) -> list:
    """Run push and ack steps atomically, in order, on one connection.

    ``steps`` is a list of ("push", [PushRow]) / ("ack", [AckRow]); consecutive
    operations of one kind arrive folded into one step, so each step is one
    round trip. Returns the per-step result rows. Any failed ack, or a
    required lease that is not live, raises TransactionAborted and nothing is
    committed. Acks marked failed go straight to the DLQ (docs/wire-contract.md §7).
    ``before`` runs after the lease check and before the first step, ``after``
    after the last step, both inside the same PostgreSQL transaction.
    """
    return await rerun_on_conflict(
        lambda: _transaction_once(store, steps, required_leases, before, after))


T = TypeVar("T")


async def rerun_on_conflict(once: Callable[[], Awaitable[T]]) -> T:
    """Run a transaction (``once``), again when PostgreSQL aborted it for a deadlock or a
    serialization failure (StoreConflict), at most three times; then StoreBusy (a 503)."""
    for attempt in range(3):
        try:
            return await once()
        except StoreConflict:
            # Two transactions locked partitions and cursors in opposite orders;
            # PostgreSQL aborted this one, so nothing was committed: run it again.
            if attempt == 2:
                raise StoreBusy("transaction kept deadlocking; retry later") from None
            logger.info("transaction deadlocked; retrying")
    raise AssertionError("unreachable")


async def _transaction_once(store: Store, steps: list[tuple[str, list]],
                            required_leases: list[str], before: Hook | None,
                            after: Hook | None) -> list:
    results: list = []
    async with store.connection() as conn:
        with _mapped_errors():
            async with conn.transaction():
                if required_leases:
                    live = await store.live_leases(required_leases, conn)
                    dead = [lid for lid in required_leases if lid not in live]
                    if dead:
                        raise TransactionAborted(f"Invalid or expired lease: {dead[0]}",
                                                 dead_lease=dead[0])
                if before is not None:
                    await before(conn)
                for step, (kind, rows) in enumerate(steps):
                    if kind == "push":
                        pushed = await store.push(rows, conn=conn)
                        refused = next((r for r in pushed if r["status"] == "refused"), None)
                        if refused is not None:  # past the queue's maxSize: roll it all back
                            raise TransactionAborted(refused["error"])
                        held = next((n for n, r in enumerate(pushed)
                                     if r["status"] == "staged"), None)
                        if held is not None:
                            raise PartitionHeld(rows[held].queue, rows[held].partition)
                        results.append(pushed)
                    else:
                        acked = await store.ack(rows, failed_to_dlq=True, conn=conn)
                        results.append(acked)
                        bad = next((n for n, r in enumerate(acked) if not r["success"]), None)
                        if bad is not None:
                            raise TransactionAborted(acked[bad]["error"] or "ack failed",
                                                     failed_at=(step, bad))
                if after is not None:
                    await after(conn)
    return results
