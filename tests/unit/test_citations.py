"""The repository stands alone: every document the code and the docs cite is a
file in the repository, and every section they cite (``docs/behaviour.md §5.2``) is a heading
of that document. No relative path leads out of the repository."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where citations live.
SCANNED = ("broker", "actors", "queenctl", "tests", "benchmarks", "compose", "docs", ".ci")
TOP_FILES = ("README.md", "ARCHITECTURE.md", "dev.py", "pyproject.toml", "mkdocs.yml",
             "mkdocs_hooks.py")
SUFFIXES = {".py", ".md", ".sql", ".toml", ".js", ".html", ".css", ".yml", ".yaml", ".sh", ""}

# A Markdown file name, optionally with a folder, optionally followed by a section sign.
CITATION = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b(?:\s+§\s?([0-9]+(?:\.[0-9]+)*))?")
# A relative path that climbs (``../x``), not one inside a longer path (``/dashboard/../x``).
CLIMB = re.compile(r"(?<![\w/.])(?:\.\./)+[\w.-]+(?:/[\w.-]+)*")


def scanned_files() -> list[Path]:
    out = [ROOT / name for name in TOP_FILES]
    for folder in SCANNED:
        for path in (ROOT / folder).rglob("*"):
            if (path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
                    and "vendor" not in path.parts):
                out.append(path)
    return out


def resolve(cited: str, citing: Path) -> Path | None:
    """The file a citation names: relative to the citing file, then to the repository root,
    then in docs/ (prose often says ``behaviour.md`` for ``docs/behaviour.md``)."""
    for base in (citing.parent, ROOT, ROOT / "docs"):
        if (base / cited).is_file():
            return base / cited
    return None


def sections(doc: Path) -> set[str]:
    """Section numbers of a document's headings: ``## 5. The disk spool`` -> ``5``,
    ``### 5.2 Naming`` -> ``5.2``."""
    found = set()
    for line in doc.read_text().splitlines():
        if m := re.match(r"#+\s+§?([0-9]+(?:\.[0-9]+)*)\.?\s", line):
            found.add(m.group(1))
    return found


def broken_citations(files: list[Path]) -> list[str]:
    broken = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for n, line in enumerate(text.splitlines(), 1):
            for climb in CLIMB.findall(line):
                if not (path.parent / climb).resolve().is_relative_to(ROOT):
                    broken.append(f"{where}:{n}: {climb} leads out of the repository")
            for m in CITATION.finditer(line):
                doc = resolve(m.group(1), path)
                if doc is None:
                    broken.append(f"{where}:{n}: {m.group(1)} is not in the repository")
                elif m.group(2) and m.group(2) not in cache.setdefault(doc, sections(doc)):
                    broken.append(f"{where}:{n}: {m.group(1)} has no section §{m.group(2)}")
    return broken


def test_every_cited_document_and_section_exists():
    files = scanned_files()
    assert len(files) > 200  # the walk found the project
    assert broken_citations(files) == []


def test_the_check_sees_a_missing_document_a_missing_section_and_a_way_out(tmp_path):
    """The citation test can fail. The probe's names are built here, so this file cites
    nothing that is missing."""
    missing, no_section = "no-such-spec" + ".md", "99.9"
    way_out = "../" * (len(tmp_path.parts) + 1) + "elsewhere/spec"
    probe = tmp_path / "probe.txt"
    probe.write_text(f"see {missing}, docs/behaviour.md §{no_section} and {way_out}\n"
                     "and docs/behaviour.md §5, which exists\n")
    broken = broken_citations([probe])
    assert broken == [
        f"probe.txt:1: {way_out} leads out of the repository",
        f"probe.txt:1: {missing} is not in the repository",
        f"probe.txt:1: docs/behaviour.md has no section §{no_section}",
    ]
