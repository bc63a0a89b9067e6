#!/usr/bin/env python3
"""Bootstrap and run, on a machine that has nothing but python3.

    python3 dev.py run      # start the broker (embedded PostgreSQL, 127.0.0.1:6632)
    python3 dev.py test     # ruff, mypy, then the whole test suite
    python3 dev.py bench    # run the load benchmarks in benchmarks/
    python3 dev.py micro    # pytest-benchmark micro benchmarks of in-process hot paths
    python3 dev.py ha       # an HA pair (or --brokers 3) on loopback, see compose/local_ha.py
    python3 dev.py ctl ...  # queenctl, the operator's command line (e.g. `ctl status`)
    python3 dev.py reset    # stop what `run` left behind and delete .queen/ (all its data)
    python3 dev.py schema   # regenerate broker/store/schema_current.sql from the migrations
    python3 dev.py docs     # serve the docs site (mkdocs.yml, docs/) on http://127.0.0.1:8000
    python3 dev.py docs build   # build it, strict (a broken link fails), into site/

Each command first makes sure ./.venv exists and holds this project (and, for
test, bench and docs, its test dependencies). Extra arguments are passed on
(to queen-broker, queenctl, pytest, mkdocs or the benchmark script). `test` runs `ruff check` over the
project and `mypy` (on the files listed in pyproject.toml's [tool.mypy]) first, and stops
with their exit code if either fails, so CI enforces them.

`reset` refuses while a broker runs on .queen/ (it holds a spool lock there); it stops the
embedded PostgreSQL that a killed broker (`kill -9`) left running, then deletes .queen/:
every queue and message, and any push still waiting in a spool.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STATE = ROOT / ".queen"  # what `run` keeps: pgdata (the embedded PostgreSQL), buffers (the spool)


def ensure_venv(extras: str) -> None:
    if not (BIN / "python").exists():
        print(f"dev.py: creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # Reinstall only when pyproject.toml (or the extras asked for) changed. An install with
    # the test extras holds the base install too.
    stamp = VENV / f".installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    covering = [stamp] if extras else [stamp, VENV / ".installed-test"]
    if any(s.exists() and s.read_text() == digest for s in covering):
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


# Run by the venv's python (it needs psutil and the broker's EmbeddedPostgres): stop the
# embedded PostgreSQL of the data directory argv[1] unless the broker that started it still
# runs. Exit 3 when it does.
_STOP_LEFT_OVER_POSTGRES = """
import json, sys
from pathlib import Path
import psutil
from broker.store.embedded_pg import EmbeddedPostgres
pg = EmbeddedPostgres(Path(sys.argv[1]))
if pg.is_running():
    try:
        owner = json.loads(Path(sys.argv[1] + ".owner").read_text())
        if abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) < 0.5:
            sys.exit(3)
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    pg.stop()
    print(f"dev.py: stopped the embedded PostgreSQL left running in {sys.argv[1]}")
"""


def spool_holder(lock: Path) -> str | None:
    """The pid written in a spool directory's lock file while a live process holds it."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)
    return None


def reset() -> int:
    """Stop the embedded PostgreSQL a killed broker left running in .queen/, delete .queen/."""
    if not STATE.exists():
        print(f"dev.py: nothing to reset ({STATE} does not exist)")
        return 0
    for lock in sorted(STATE.glob("*/lock")):
        if (pid := spool_holder(lock)) is not None:
            print(f"dev.py: a broker (pid {pid}) is running on {lock.parent}: stop it first "
                  f"(Ctrl-C where it runs, or kill {pid}); nothing was deleted", file=sys.stderr)
            return 1
    for version in sorted(STATE.glob("*/PG_VERSION")):
        pgdata = version.parent
        if not (pgdata / "postmaster.pid").exists():
            continue
        if not (BIN / "python").exists():
            print(f"dev.py: {pgdata} has a postmaster.pid but there is no {VENV} to stop its "
                  "PostgreSQL with; nothing was deleted", file=sys.stderr)
            return 1
        code = subprocess.run([str(BIN / "python"), "-c", _STOP_LEFT_OVER_POSTGRES,
                               str(pgdata)], cwd=ROOT).returncode
        if code == 3:
            print(f"dev.py: the broker that started the PostgreSQL of {pgdata} is still "
                  "running: stop it first; nothing was deleted", file=sys.stderr)
            return 1
        if code != 0:
            print(f"dev.py: could not stop the PostgreSQL of {pgdata}; nothing was deleted",
                  file=sys.stderr)
            return code
    shutil.rmtree(STATE)
    print(f"dev.py: deleted {STATE}")
    return 0


def main() -> int:
    commands = ("run", "test", "bench", "micro", "ha", "ctl", "reset", "schema", "docs")
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "reset":
        return reset()
    if command == "run":
        ensure_venv("")
        argv = [str(BIN / "queen-broker"), *rest]
    elif command == "ctl":
        ensure_venv("")
        argv = [str(BIN / "queenctl"), *rest]
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
    elif command == "schema":
        ensure_venv("")
        argv = [str(BIN / "python"), "-m", "broker.store.schema_dump", *rest]
    elif command == "docs":
        ensure_venv("test")  # MkDocs is a test dependency: the suite builds the site
        verb, more = (rest[0], rest[1:]) if rest[:1] in (["serve"], ["build"]) else ("serve", rest)
        strict = ["--strict"] if verb == "build" else []  # serve shows warnings and goes on
        argv = [str(BIN / "mkdocs"), verb, *strict, *more]
    elif command == "ha":
        ensure_venv("")
        argv = [str(BIN / "python"), str(ROOT / "compose" / "local_ha.py"), *rest]
    else:
        ensure_venv("test")
        argv = [str(BIN / "python"), str(ROOT / "benchmarks" / "run.py"), *rest]
    if command != "ctl":  # queenctl reads files relative to where it was called from
        os.chdir(ROOT)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
