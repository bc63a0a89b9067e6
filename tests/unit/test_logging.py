"""One logging style: stdlib logging (pykka, Sanic, asyncpg) reaches loguru's sink in the
broker's format, through the InterceptHandler that ``setup_logging`` installs."""
from __future__ import annotations

import json
import logging
import sys
import uuid

import pytest
from loguru import logger

from broker.__main__ import SANIC_LOGGERS, route_sanic_logs, setup_logging
from broker.core.logs import Throttle


@pytest.fixture
def routed():
    """setup_logging("INFO") with a loguru sink that keeps the lines; the process's logging
    (pytest's own handlers on the root logger, loguru's default sink) is restored after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    saved_sanic = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate)
                   for name in SANIC_LOGGERS}
    lines: list[str] = []
    setup_logging("INFO")
    logger.add(lambda m: lines.append(str(m)), level="DEBUG", format="{level} {message}")
    try:
        yield lines
    finally:
        logger.remove()
        logger.add(sys.stderr)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, (handlers, propagate) in saved_sanic.items():
            logging.getLogger(name).handlers[:] = handlers
            logging.getLogger(name).propagate = propagate


def test_pykka_records_reach_loguru_with_their_level_and_braces_intact(routed):
    logging.getLogger("pykka").warning("Unexpected message received by %s: %s", "A", {"x": 1})
    assert routed == ["WARNING Unexpected message received by A: {'x': 1}\n"]


def test_records_below_the_level_are_dropped_before_loguru(routed):
    logging.getLogger("asyncpg").debug("chatty")
    assert routed == []
    assert logging.getLogger().level == logging.INFO


def test_a_stdlib_traceback_comes_with_the_line(routed):
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("pykka").exception("Unhandled exception in %s:", "Actor")
    [line] = routed
    assert line.startswith("ERROR Unhandled exception in Actor:")
    assert "ValueError: boom" in line


def test_sanic_lines_leave_its_own_handlers_for_loguru(routed):
    from sanic import Sanic

    Sanic(f"t{uuid.uuid4().hex}")  # its dictConfig gives its loggers stream handlers again
    assert logging.getLogger("sanic.root").handlers
    route_sanic_logs()
    assert not any(logging.getLogger(name).handlers for name in SANIC_LOGGERS)
    logging.getLogger("sanic.root").info("Starting worker [%s]", 42)
    assert routed == ["INFO Starting worker [42]\n"]


def test_a_connection_error_traceback_is_one_line_and_repeats_are_throttled(routed):
    """asyncpg logs each retry of its pool with a traceback; the line keeps the error's
    words, not the traceback, at DEBUG (the store's DatabaseHealth tells the outage), and
    repeats within a minute are dropped."""
    from broker.__main__ import NOISY
    NOISY._last.clear()
    for _ in range(3):
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError:
            logging.getLogger("asyncpg.pool").warning(
                "Failed to restore the pool connection floor; retrying", exc_info=True)
    assert routed == ["DEBUG Failed to restore the pool connection floor; retrying "
                      "(ConnectionRefusedError: [Errno 111] Connection refused)\n"]


def test_json_format_one_object_a_line_with_context_and_exception(capsys):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("INFO", "json")
        logger.bind(method="GET", status=200).info("hello {}", "{braces}")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
        logging.getLogger("sanic.root").info("Starting worker [%s]", 7)
        err = capsys.readouterr().err
    finally:
        logger.remove()
        logger.add(sys.stderr)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    first, second, third = (json.loads(line) for line in err.splitlines())
    assert first["message"] == "hello {braces}" and first["level"] == "INFO"
    assert first["context"] == {"method": "GET", "status": 200}
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]
    assert "Traceback" in second["exception"]
    assert third["message"] == "Starting worker [7]"  # stdlib records: the same format


def test_throttle_lets_one_line_a_period_through_and_counts_the_rest():
    throttle = Throttle(every_s=3600)
    assert throttle.allow("k") == 0
    assert throttle.allow("k") is None and throttle.allow("k") is None
    assert throttle.allow("other") == 0
    throttle._last["k"] = (throttle._last["k"][0] - 7200, throttle._last["k"][1])
    assert throttle.allow("k") == 2  # the next line says two were dropped
