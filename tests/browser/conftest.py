"""A real headless Chromium (Debian's ``chromium``, driven by Playwright's Python API with
``executable_path``: Playwright's own browser download is never used) against real broker
processes on their own database (the maintenance test flips cluster-wide flags).

Every page a test opens records console errors and uncaught exceptions; the ``page``
fixture fails the test if there was any. Screenshots go to ``test-artifacts/dashboard/``
(git-ignored) for a reviewer to look at. With ``QUEEN_SCREENSHOTS=DIR`` (relative to the
repository, e.g. ``QUEEN_SCREENSHOTS=docs``) the screenshots docs/operations/dashboard.md shows (the overview,
the Streams and the State views) are also written to ``DIR/dashboard-<view>.png``.
"""
from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from tests.browser.chromium import CHROMIUM, launch
from tests.conftest import ROOT, Database, start_broker

ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
SECRET = "dashboard-test-secret-0123456789abcdef"


def _run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@pytest.fixture(scope="package")
def dash_database(database):
    """An empty database of its own, dropped at the end."""
    import asyncpg
    name = f"dash_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(database.dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    _run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield Database(database.host, database.port, database.user, database.password, name)
    finally:
        _run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture(scope="package")
def dash_brokers(dash_database, tmp_path_factory):
    started = []
    tmp = tmp_path_factory.mktemp("dash-brokers")

    def make(**env: str):
        b = start_broker(dash_database, tmp, STATS_INTERVAL_MS="1000",
                         DASHBOARD_DEPTH_INTERVAL_MS="1000", RETENTION_INTERVAL="60000", **env)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture(scope="package")
def dash(dash_brokers):
    """The broker the page tests use (JWT off)."""
    return dash_brokers()


@pytest.fixture(scope="package")
def jwt_broker(dash_brokers):
    """A second broker on the same database with JWT (HS256) on."""
    return dash_brokers(JWT_ENABLED="true", JWT_SECRET=SECRET)


@pytest.fixture(scope="package")
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium "
                    "(apt-get install chromium; .ci/run does it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = launch(p)
        try:
            yield browser
        finally:
            browser.close()


class Problems(list):
    """Console errors and page exceptions seen by one page."""


@pytest.fixture
def page(chromium):
    """A fresh browser context and page; the test fails on any console error."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    problems = Problems()
    pg.on("console", lambda m: problems.append(f"console.{m.type}: {m.text} ({m.location})")
          if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.problems = problems
    yield pg
    context.close()
    assert not problems, f"the page logged errors: {problems}"


def screenshot(pg, name: str, docs: str | None = None) -> Path:
    """Save the page to test-artifacts/dashboard/<name>.png; a screenshot the docs show
    (``docs``: its file name without .png) also to $QUEEN_SCREENSHOTS/<docs>.png when set."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    if docs is not None and (wanted := os.environ.get("QUEEN_SCREENSHOTS")):
        folder = ROOT / wanted  # an absolute DIR stays itself
        folder.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(folder / f"{docs}.png"), full_page=True)
    return path
