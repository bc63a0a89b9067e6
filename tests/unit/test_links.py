"""Every relative link of README.md, ARCHITECTURE.md and the docs pages leads to a file of the
repository, and every anchor to a heading of its page (GitHub's anchors, which the docs site
uses too). The docs site's strict build checks the pages once more (test_docs_site.py); the
README is read in the repository, where nothing else checks it."""
from __future__ import annotations

from pathlib import Path

from mkdocs_hooks import link_problems

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_and_anchor_resolves():
    assert len(FILES) > 20
    found = [problem for path in FILES for problem in link_problems(path)]
    assert found == []


def test_the_check_sees_a_missing_file_a_missing_anchor_and_a_way_out(tmp_path):
    """The link check can fail: in a scratch repository, a link to a file that is not there,
    to a heading that is not there, and out of the repository are reported; a link that
    resolves, a URL and a link inside a fenced block are not. (The names are built here, so
    this file cites no missing document: tests/unit/test_citations.py.)"""
    md = ".md"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / f"tutorial{md}").write_text("# Tutorial\n\n## 1. Run the broker\n")
    probe = tmp_path / "docs" / f"probe{md}"
    probe.write_text(f"# Probe\n\n[a](no-such{md}) [b](tutorial{md}#no-such-step) [c](#probe)\n"
                     f"[d](../../outside{md}) [e](https://example.org/x{md})\n"
                     f"[f](tutorial{md}#1-run-the-broker)\n```sh\n[g](fenced{md})\n```\n")
    assert link_problems(probe, tmp_path) == [
        f"probe{md}:3: no-such{md} does not exist",
        f"probe{md}:3: tutorial{md} has no heading for #no-such-step",
        f"probe{md}:4: ../../outside{md} leads out of the repository",
    ]
