"""The repository speaks of itself: no tracked file of the code, docs, tests or benchmarks
cites a ticket (the word for one followed by its number, or by a colon, or in the possessive)
or speaks of what its owners chose. A reader has no tracker to look them up in: a comment says
what the thing is and why. The forms are in CITATION below.

Not citations, and not matched: "issue" as a verb (a cohort of parked pops issues one timer
query; ``tests/mesh_pki.py``'s ``issue()`` issues a certificate) and "owner" for a queue's
owning broker or a file's owner; the possessive is spelled "the owning broker's" where a
broker is meant, so no exception is needed.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("broker", "actors", "queenctl", "tests", "benchmarks", "compose", "deploy", "docs",
           ".ci")
TOP_FILES = ("README.md", "ARCHITECTURE.md", "dev.py", "pyproject.toml", "mkdocs.yml",
             "mkdocs_hooks.py")
CITATION = re.compile(r"\bissue(?:[\s-]*#?\d+|'s\b|:|\s+requirement)|\bowner[']s", re.IGNORECASE)


def tracked_files() -> list[Path]:
    """The files git tracks in the scanned folders and the top files (what a reader of the
    repository sees), without the vendored dashboard libraries."""
    listed = subprocess.run(["git", "ls-files", "--", *SCANNED, *TOP_FILES], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed if "/vendor/" not in name]


def citations(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for n, line in enumerate(text.splitlines(), 1):
            for m in CITATION.finditer(line):
                found.append(f"{where}:{n}: {m.group(0)!r} in {line.strip()[:100]!r}")
    return found


def test_no_file_cites_a_ticket_or_an_owner():
    files = tracked_files()
    assert len(files) > 300  # git listed the project
    found = citations(files)
    assert not found, ("say what the thing is and why, not which ticket made it:\n"
                       + "\n".join(found))


def test_the_scan_sees_citations_and_leaves_the_verb_alone(tmp_path):
    """The scan can fail. The probe's words are built here, so this file cites nothing."""
    issue, owner = "iss" + "ue", "own" + "er's"
    probe = tmp_path / "probe.py"
    probe.write_text(f"# ({issue} 14)\n# the {issue}-14 targets\n# {issue.title()} 8: folds\n"
                     f"# the {issue}'s scenario\n# ({owner} choice)\n"
                     f"# a cohort {issue}s one query; {issue}(ca, name)\n")
    assert [line.split(":")[1] for line in citations([probe])] == ["1", "2", "3", "4", "5"]
