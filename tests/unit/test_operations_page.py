"""The operator's pages (docs/operations.md, deploy/kubernetes/README.md): every command block
runs as written here, or is marked ``<!-- readme-test: no-run: REASON -->`` with a reason, as
every docs page's are (tests/integration/test_readme_snippets.py). The commands that run here
are the suite's own tests, named by path: the check is that each is a `dev.py test` of a test
file that exists (the suite runs those files itself, so the page cannot name one that is
gone)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "operations.md", ROOT / "deploy" / "kubernetes" / "README.md"]
FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- readme-test: no-run: (\S.*?) -->\s*$")


def blocks(text: str) -> list[tuple[str, str, str | None]]:
    """(kind, body, no-run reason or None) of every fenced block."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        marker = MARKER.search(before[-1]) if before else None
        found.append((match.group(1), match.group(2), marker.group(1) if marker else None))
    return found


def problems(text: str) -> list[str]:
    found = []
    for kind, body, reason in blocks(text):
        if kind == "text" or reason is not None:
            continue
        if kind != "sh":
            found.append(f"a {kind or 'bare'} block: write sh (a command) or text")
            continue
        for line in body.strip().splitlines():
            argv = shlex.split(line)
            if argv[:3] != ["python3", "dev.py", "test"] or not all(
                    (ROOT / a).is_file() for a in argv[3:] if not a.startswith("-")):
                found.append(f"{line!r} is neither marked no-run nor a dev.py test of a "
                             "test file that exists")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_runs_as_written_or_says_why_not(page: Path):
    assert problems(page.read_text()) == []


def test_an_unmarked_command_and_a_gone_test_file_are_reported():
    page = ("```sh\nkubectl apply -k deploy/kubernetes/overlays/trio\n```\n\n"
            "```sh\npython3 dev.py test tests/ha/test_gone.py -q\n```\n\n"
            "<!-- readme-test: no-run: needs a cluster -->\n```sh\nkubectl get pods\n```\n")
    assert len(problems(page)) == 2
