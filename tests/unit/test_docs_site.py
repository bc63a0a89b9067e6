"""The docs site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken link or
anchor, a page missing from the nav or a nav entry without its page, and a link out of docs/ to
a file the repository does not have (mkdocs_hooks.py) each fail the build. The build goes to a
temporary directory; nothing is written into the checkout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Material's banner about its own end of life is not a warning of the build.
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)], cwd=config.parent, env=ENV,
                          capture_output=True, text=True, timeout=180)


def test_the_site_builds_strict(tmp_path):
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    built = tmp_path / "site"
    # the generated pages are there, ARCHITECTURE.md and compose/haproxy.cfg included whole
    assert "A map of the house" in (built / "design/architecture/index.html").read_text()
    assert "option httpchk GET /health/ready" in (built / "load-balancer/index.html").read_text()
    assert "QUEEN_SYNC_SECRET" in (built / "operations/configuration/index.html").read_text()


def test_a_broken_link_anchor_or_page_fails_the_build(tmp_path):
    """The strict build can fail: a copy of the site with one fault at a time."""
    md = ".md"  # names built here, so this file cites no missing document (test_citations.py)
    faults = {
        "a link to a page that is not there": ("index.md", f"[gone](no-such-page{md})",
                                               f"no-such-page{md}"),
        "an anchor no heading has": ("index.md", "[gone](tutorial.md#no-such-step)",
                                     "no-such-step"),
        "a file out of docs/ that is not there": ("index.md", "[gone](../compose/gone.cfg)",
                                                  "gone.cfg does not exist"),
        "a page left out of the nav": (f"orphan{md}", "# An orphan\n", f"orphan{md}"),
    }
    for fault, (page, text, said) in faults.items():
        copy = tmp_path / fault.replace(" ", "-")
        shutil.copytree(ROOT / "docs", copy / "docs")
        for name in ("mkdocs.yml", "mkdocs_hooks.py", "ARCHITECTURE.md"):
            shutil.copy(ROOT / name, copy / name)
        (copy / "compose").mkdir()
        shutil.copy(ROOT / "compose" / "haproxy.cfg", copy / "compose" / "haproxy.cfg")
        target = copy / "docs" / page
        target.write_text((target.read_text() if target.exists() else "") + "\n" + text + "\n")
        result = build(copy / "mkdocs.yml", copy / "site")
        assert result.returncode != 0, f"{fault}: the build passed"
        assert said in result.stdout + result.stderr, (fault, result.stdout + result.stderr)
