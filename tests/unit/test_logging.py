"""One logging style: stdlib logging (pykka, Sanic, asyncpg) reaches loguru's sink in the
broker's format, through the InterceptHandler that ``setup_logging`` installs."""
from __future__ import annotations

import logging
import sys
import uuid

import pytest
from loguru import logger

from broker.__main__ import SANIC_LOGGERS, route_sanic_logs, setup_logging


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
