#!/usr/bin/env python3
"""Bootstrap and run, on a machine that has nothing but python3.

    python3 dev.py run      # start the broker (embedded PostgreSQL, 127.0.0.1:6632)
    python3 dev.py test     # ruff, mypy, then the whole test suite
    python3 dev.py bench    # run the load benchmarks in benchmarks/
    python3 dev.py micro    # pytest-benchmark micro benchmarks of in-process hot paths
    python3 dev.py ha       # an HA pair (or --brokers 3) on loopback, see compose/local_ha.py

Each command first makes sure ./.venv exists and holds this project (and, for
test and bench, its test dependencies). Extra arguments are passed on
(to queen-broker, pytest or the benchmark script). `test` runs `ruff check` over the
project and `mypy` (on the files listed in pyproject.toml's [tool.mypy]) first, and stops
with their exit code if either fails, so CI enforces them.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"


def ensure_venv(extras: str) -> None:
    if not (BIN / "python").exists():
        print(f"dev.py: creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # Reinstall only when pyproject.toml (or the extras asked for) changed.
    stamp = VENV / f".installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    target = f".[{extras}]" if extras else "."
    print(f"dev.py: installing {target} into {VENV}", flush=True)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                   check=True, cwd=ROOT)
    subprocess.run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "-e", target],
                   check=True, cwd=ROOT)
    stamp.write_text(digest)


def lint() -> int:
    """ruff, then mypy, as configured in pyproject.toml: 0 when both pass."""
    for tool, *args in (("ruff", "check", "."), ("mypy",)):
        print(f"dev.py: {' '.join((tool, *args))}", flush=True)
        code = subprocess.run([str(BIN / tool), *args], cwd=ROOT).returncode
        if code != 0:
            print(f"dev.py: {tool} failed (exit {code}); the tests did not run",
                  file=sys.stderr, flush=True)
            return code
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test", "bench", "micro", "ha"):
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "run":
        ensure_venv("")
        argv = [str(BIN / "queen-broker"), *rest]
    elif command == "test":
        ensure_venv("test")
        code = lint()
        if code != 0:
            return code
        argv = [str(BIN / "python"), "-m", "pytest", *rest]
    elif command == "micro":
        ensure_venv("test")
        argv = [str(BIN / "python"), "-m", "pytest", str(ROOT / "benchmarks" / "test_micro.py"),
                "--benchmark-only", "-p", "no:cacheprovider", *rest]
    elif command == "ha":
        ensure_venv("")
        argv = [str(BIN / "python"), str(ROOT / "compose" / "local_ha.py"), *rest]
    else:
        ensure_venv("test")
        argv = [str(BIN / "python"), str(ROOT / "benchmarks" / "run.py"), *rest]
    os.chdir(ROOT)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
