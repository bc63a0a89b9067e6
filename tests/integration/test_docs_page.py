"""/docs in a real browser (Chromium, headless): the page a broker serves renders every
operation of /openapi.json, offline (it has nothing to load from elsewhere)."""
from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
def test_the_reference_page_renders_every_operation(base_url, tmp_path):
    document = httpx.get(base_url + "/openapi.json", timeout=10).json()
    operations = sum(len(methods) for methods in document["paths"].values())
    # --dump-dom prints the DOM once the page has loaded; with the network limited to the
    # broker itself (a proxy that does not exist for every other host), a page needing a
    # CDN would fail to render its parts.
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
         "--proxy-server=127.0.0.1:9", f"--proxy-bypass-list={base_url.split('//')[1]}",
         "--dump-dom", base_url + "/docs"],
        capture_output=True, text=True, timeout=120)
    dom = run.stdout
    assert run.returncode == 0 and "queen-broker HTTP API" in dom, run.stderr[-2000:]
    assert dom.count('<section class="op"') == operations
    for path in document["paths"]:
        assert f"<code>{path}</code>" in dom
