"""``python3 dev.py`` on a machine that has nothing but a python3: a Python too old for the
project is one line before anything is built; a .venv made by another Python, or never
finished, is rebuilt instead of reused; a failed pip install is one line naming pip's
reason, no traceback; and the project's editable install prints no setuptools warning.

Each dev.py test runs a copy of dev.py in a scratch checkout whose pyproject.toml is a
one-module project (its ``queenctl`` script prints the Python it runs on), so that
``dev.py ctl`` builds a real .venv with a real pip in seconds.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(300)

SANDBOX_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "devpy-sandbox"
version = "0"
requires-python = "{requires}"

[project.optional-dependencies]
test = []

[project.scripts]
queenctl = "sandbox_ctl:main"

[tool.setuptools]
py-modules = ["sandbox_ctl"]
"""

SANDBOX_CTL = """\
import sys


def main():
    print("sandbox ctl runs on Python %d.%d" % sys.version_info[:2])
"""


def old_pythons() -> list[str]:
    """Interpreters older than 3.11 on this machine (on PATH, or installed by pyenv)."""
    candidates = [shutil.which(f"python3.{minor}") for minor in range(6, 11)]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    found: dict[tuple[int, int], str] = {}
    for path in filter(None, candidates):
        try:
            said = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30)
            version = tuple(map(int, said.stdout.split()))
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
        if said.returncode == 0 and len(version) == 2 and version < (3, 11):
            found.setdefault(version, path)  # type: ignore[arg-type]
    return [found[v] for v in sorted(found)]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "dev.py", tmp_path / "dev.py")
    (tmp_path / "pyproject.toml").write_text(SANDBOX_PYPROJECT.format(requires=">=3.11"))
    (tmp_path / "sandbox_ctl.py").write_text(SANDBOX_CTL)
    return tmp_path


def dev(checkout: Path, *args: str, python: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([python or sys.executable, "dev.py", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=240)


def venv_version(checkout: Path) -> str:
    return subprocess.run([str(checkout / ".venv/bin/python"), "-c",
                           "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


HERE = "%d.%d" % sys.version_info[:2]


def test_dev_py_asks_for_the_python_pyproject_requires():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    needs = re.search(r"^NEEDS = \((\d+), (\d+)\)", (ROOT / "dev.py").read_text(), re.M)
    assert needs is not None
    assert requires == f">={needs[1]}.{needs[2]}"


@pytest.mark.parametrize("python", old_pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no Python older than 3.11 on this machine"))])
def test_a_python_too_old_is_one_line_and_nothing_is_built(checkout, python):
    result = dev(checkout, "run", python=python)
    assert result.returncode == 1, result
    assert result.stdout == "", result
    [line] = result.stderr.splitlines()
    assert line.startswith("dev.py: needs Python 3.11 or newer, and this is Python 3."), line
    assert "`python3.11 dev.py run`" in line, line
    assert not (checkout / ".venv").exists()


def test_a_venv_made_by_another_python_is_rebuilt(checkout):
    olds = old_pythons()
    if not olds:
        pytest.skip("no Python older than 3.11 on this machine")
    subprocess.run([olds[-1], "-m", "venv", "--without-pip", str(checkout / ".venv")],
                   check=True, timeout=120)
    old = venv_version(checkout)
    # As if an install into it had finished: only the interpreter differs.
    (checkout / ".venv/.installed-base").write_text("stale")
    result = dev(checkout, "ctl")
    assert result.returncode == 0, result
    assert f"rebuilding {checkout / '.venv'}: it was made by Python {old}, this is {HERE}" \
        in result.stdout, result
    assert f"sandbox ctl runs on Python {HERE}" in result.stdout, result
    assert venv_version(checkout) == HERE


def test_a_venv_no_install_finished_in_is_rebuilt(checkout):
    """A .venv left half-built (here: no pip in it, no install ever finished) is made again,
    not handed to a pip that is not there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")],
                   check=True, timeout=120)
    result = dev(checkout, "ctl")
    assert result.returncode == 0, result
    assert "no install into it ever finished" in result.stdout, result
    assert f"sandbox ctl runs on Python {HERE}" in result.stdout, result
    again = dev(checkout, "ctl")  # finished now: reused as it is
    assert again.returncode == 0 and "rebuilding" not in again.stdout + again.stderr, again
    assert "installing" not in again.stdout, again


def test_a_failed_pip_install_is_one_line_with_pip_s_reason(checkout):
    (checkout / "pyproject.toml").write_text(SANDBOX_PYPROJECT.format(requires=">=3.99"))
    result = dev(checkout, "ctl")
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dev.py: pip could not install . into {checkout / '.venv'} "
                           "(exit 1): ERROR:"), last
    assert "requires a different Python" in last, last


def test_the_editable_install_prints_no_setuptools_warning(tmp_path):
    """The project's own pyproject.toml, installed as dev.py installs it (pip -e), with the
    pip of the project's venv (new enough to pass build-backend warnings on)."""
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True,
                   timeout=120)
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(target / "bin/python"),
                             "install", "--quiet", "--no-deps", "-e", str(ROOT)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result
    said = result.stdout + result.stderr
    assert "Editable installation" not in said and "setuptools" not in said, said
