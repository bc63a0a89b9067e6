"""The store's errors: what a caller may meet, and how asyncpg's errors become them.

Every coroutine of ``broker/store`` raises these and nothing of the driver: a driver error
goes through :func:`mapped_errors`, which sorts it by SQLSTATE class (asyncpg's own
taxonomy, ``asyncpg.exceptions``). The service layer and ``broker/core`` turn them into
the caller's answers (503 + Retry-After, 400, 409...).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import asyncpg

from broker.core.telemetry import telemetry


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
INVALID_VALUE_REASONS = {
    "22021": "a text field contains a NUL character (\\u0000)",  # character_not_in_repertoire
    "22P05": "a JSON value contains a NUL character (\\u0000)",   # untranslatable_character
    "22003": "a number is out of range",                            # numeric_value_out_of_range
    "22008": "a timestamp is out of range",                         # datetime_field_overflow
    "22007": "a timestamp is not valid",                            # invalid_datetime_format
    "22P02": "a value is not in the expected format (UUID, number or JSON)",
    "22001": "a text field is too long",                            # string_data_right_truncation
    "22032": "a JSON value is not valid",                           # invalid_json_text
}


def invalid_value_message(exc: asyncpg.exceptions.DataError) -> str:
    reason = INVALID_VALUE_REASONS.get(exc.sqlstate)
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
def mapped_errors() -> Iterator[None]:
    """Within it, asyncpg's errors are raised as the store's (the taxonomy above)."""
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
        raise StoreInvalidValue(invalid_value_message(exc)) from exc
    except UNAVAILABLE_ERRORS as exc:
        telemetry.ops["db_errors"] += 1
        raise StoreUnavailable(f"database unavailable: {exc.__class__.__name__}: {exc}") from exc
    except asyncpg.exceptions.PostgresError as exc:
        telemetry.ops["db_errors"] += 1
        raise StoreError(f"database error (SQLSTATE {exc.sqlstate})") from exc


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
