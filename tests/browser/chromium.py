"""How the project starts a browser: Debian's Chromium by path, headless, with nothing that
reaches the network on its own (Playwright's own browser download is never used). Shared by
the browser tests, benchmarks/dashboard_scale.py and docs/screenshot.py; no pytest here."""
from __future__ import annotations

import os

CHROMIUM = os.environ.get("QUEEN_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def launch(playwright):
    """A Chromium browser from a started ``sync_playwright()``."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
