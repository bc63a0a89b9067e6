"""Modules that fit in a head: no Python module outside tests/ is over 800 lines.
A module that grows past it is split by job (the spool and the benchmarks were)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 800


def oversized(paths: list[Path], most: int = MOST_LINES) -> dict[str, int]:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in paths}
    return {name: n for name, n in sizes.items() if n > most}


def test_no_module_outside_tests_is_over_800_lines():
    paths = [p for folder in ("broker", "actors", "queenctl", "benchmarks", "compose")
             for p in (ROOT / folder).rglob("*.py")] + [ROOT / "dev.py"]
    assert len(paths) > 100  # the walk found the project
    assert oversized(paths) == {}


def test_the_size_check_sees_a_long_module():
    this = Path(__file__).resolve()
    n = len(this.read_text().splitlines())
    assert oversized([this], most=n) == {}
    assert oversized([this], most=n - 1) == {"tests/unit/test_module_size.py": n}
