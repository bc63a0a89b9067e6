"""How driver errors become the store's exceptions, and what a caller is told about them."""
from __future__ import annotations

import asyncpg
import pytest

from broker.http.responses import error
from broker.store.errors import (
    StoreBusy,
    StoreConflict,
    StoreError,
    StoreInvalidValue,
    StoreUnavailable,
    mapped_errors,
)


def mapped(exc: BaseException) -> StoreError | StoreUnavailable:
    with pytest.raises((StoreError, StoreUnavailable)) as caught:
        with mapped_errors():
            raise exc
    return caught.value


@pytest.mark.parametrize("driver_error, words", [
    (asyncpg.exceptions.CharacterNotInRepertoireError(
        'invalid byte sequence for encoding "UTF8": 0x00'), "NUL character"),
    (asyncpg.exceptions.UntranslatableCharacterError(
        "unsupported Unicode escape sequence"), "NUL character"),
    (asyncpg.exceptions.NumericValueOutOfRangeError("integer out of range"), "out of range"),
    (asyncpg.exceptions.InvalidTextRepresentationError('invalid input syntax for type uuid: "x"'),
     "expected format"),
])
def test_a_refused_value_is_named_in_the_callers_terms(driver_error, words):
    exc = mapped(driver_error)
    assert isinstance(exc, StoreInvalidValue)
    assert words in str(exc) and str(exc).startswith("invalid value: ")
    assert str(driver_error) not in str(exc)


def test_an_argument_asyncpg_cannot_encode_names_no_argument_number():
    driver_error = asyncpg.exceptions.DataError(
        "invalid input for query argument $6: datetime.datetime(1, 1, 1, 0, 0, tzinfo=... "
        "(date value out of range)")
    driver_error.__cause__ = OverflowError("date value out of range")
    message = str(mapped(driver_error))
    assert message == "invalid value: a number or timestamp is out of range"


@pytest.mark.parametrize("driver_error", [
    asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout"),
    asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
])
def test_lock_and_statement_timeouts_are_busy_not_unavailable(driver_error):
    exc = mapped(driver_error)
    assert isinstance(exc, StoreBusy) and "retry later" in str(exc)
    assert "Error" not in str(exc)


def test_a_deadlock_is_a_conflict_named_without_the_driver_class():
    exc = mapped(asyncpg.exceptions.DeadlockDetectedError("deadlock detected"))
    assert isinstance(exc, StoreConflict) and "deadlock" in str(exc)
    assert "Error" not in str(exc)


def test_other_postgres_errors_show_only_their_sqlstate():
    exc = mapped(asyncpg.exceptions.UniqueViolationError('duplicate key "queues_name_key"'))
    assert type(exc) is StoreError and str(exc) == "database error (SQLSTATE 23505)"


def test_every_503_says_when_to_retry():
    assert error("Database unavailable, retry later", 503).headers["Retry-After"] == "1"
    assert "Retry-After" not in error("bad", 400).headers


def test_asyncpg_protocol_state_error_of_a_vanishing_server_is_unavailable():
    """Met when PostgreSQL shut down mid-statement; it was a 500, it is a 503 (retry)."""
    exc = mapped(asyncpg.exceptions.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"))
    assert isinstance(exc, StoreUnavailable)
