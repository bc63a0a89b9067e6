#!/usr/bin/env python3
"""Bootstrap and run, on a machine that has nothing but python3.

    python3 dev.py run      # start the broker (embedded PostgreSQL, 127.0.0.1:6632)
    python3 dev.py test     # ruff, mypy, then the whole test suite
    python3 dev.py bench    # run the load benchmarks in benchmarks/
    python3 dev.py micro    # pytest-benchmark micro benchmarks of in-process hot paths
    python3 dev.py ha       # an HA pair (or --brokers 3) on loopback, on a temporary database
                            # (deleted at stop); `dev.py ha --help` for its ports
    python3 dev.py ctl ...  # queenctl, the operator's command line (e.g. `ctl status`)
    python3 dev.py reset    # stop what `run` left behind and delete .queen/ (all its data)
    python3 dev.py pg stop  # stop the embedded PostgreSQL under a running broker (an outage
                            # drill); `pg start` starts it again, `pg status` tells
    python3 dev.py schema   # regenerate broker/store/schema_current.sql from the migrations
    python3 dev.py docs     # serve the docs site (mkdocs.yml, docs/) on http://127.0.0.1:8000
    python3 dev.py docs build   # build it, strict (a broken link fails), into site/

Each command first makes sure ./.venv exists and holds this project (and, for
test, bench and docs, its test dependencies). dev.py needs Python 3.11 or newer and says so
before building anything; a .venv made by another Python version, or one no install ever
finished in, is deleted and built again. Extra arguments are passed on (to queen-broker,
queenctl, pytest, mkdocs or the benchmark script). `test` runs `ruff check` over the
project and `mypy` (on the files listed in pyproject.toml's [tool.mypy]) first, and stops
with their exit code if either fails, so CI enforces them.

`reset` refuses while a broker runs on .queen/ (it holds a spool lock there); it stops the
embedded PostgreSQL that a killed broker (`kill -9`) left running, then deletes .queen/:
every queue and message, and any push still waiting in a spool.
"""
# No `from __future__ import annotations` and no walrus: dev.py must parse on old Pythons
# (3.6 on) to say which one it needs; annotations the old ones cannot evaluate are quoted.
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
NEEDS = (3, 11)  # pyproject.toml's requires-python (a unit test keeps them equal)
STATE = ROOT / ".queen"  # what `run` keeps: pgdata (the embedded PostgreSQL), buffers (the spool)


class Failed(Exception):
    """A step of dev.py failed; the message is the one line that says why."""


def venv_python() -> "tuple[int, int] | None":
    """(major, minor) of the Python in .venv; None when there is none that runs (a half-built
    venv, or one whose interpreter was uninstalled)."""
    try:
        said = subprocess.run([str(BIN / "python"), "-c",
                               "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60)
        major, minor = map(int, said.stdout.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return (major, minor) if said.returncode == 0 else None


def check_venv() -> None:
    """Delete a .venv that cannot be reused: made by another Python than this one (its
    packages and binary wheels are that version's), or never finished (no install into it
    completed: the .installed-* stamps are written only after pip succeeds)."""
    if VENV.is_symlink() or not VENV.exists():
        return  # a linked venv (a scratch copy of the checkout) is rebuilt where it lives
    here = sys.version_info[:2]
    made_by = venv_python()
    if made_by == here and any(VENV.glob(".installed-*")):
        return
    if made_by is None:
        why = "it has no Python that runs (half-built, or its interpreter is gone)"
    elif made_by != here:
        why = f"it was made by Python {made_by[0]}.{made_by[1]}, this is {here[0]}.{here[1]}"
    else:
        why = "no install into it ever finished"
    print(f"dev.py: rebuilding {VENV}: {why}", flush=True)
    shutil.rmtree(VENV)


def pip(*args: str, what: str) -> None:
    """Run pip in .venv, its output passed through as it comes; a failure is one line naming
    pip's own reason (its ERROR lines, else its last line)."""
    tail: deque[str] = deque(maxlen=40)  # a local annotation is never evaluated
    with subprocess.Popen([str(BIN / "python"), "-m", "pip", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            if line.strip():
                tail.append(line.strip())
    if proc.returncode != 0:
        errors = [line for line in tail if line.startswith("ERROR:")]
        cause = " ".join(errors) if errors else (tail[-1] if tail else "no output")
        raise Failed(f"pip could not install {what} into {VENV} (exit {proc.returncode}): "
                     f"{cause}")


def ensure_venv(extras: str) -> None:
    check_venv()
    if not (BIN / "python").exists():
        print(f"dev.py: creating {VENV}", flush=True)
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise Failed(f"could not create {VENV} with {sys.executable} ({exc}); is this "
                         f"Python's venv/ensurepip installed (Debian: python3-venv)?") from None
    # Reinstall only when pyproject.toml (or the extras asked for) changed. An install with
    # the test extras holds the base install too.
    stamp = VENV / f".installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    covering = [stamp] if extras else [stamp, VENV / ".installed-test"]
    if any(s.exists() and s.read_text() == digest for s in covering):
        return
    target = f".[{extras}]" if extras else "."
    print(f"dev.py: installing {target} into {VENV}", flush=True)
    pip("install", "--quiet", "--upgrade", "pip", what="pip")
    pip("install", "--quiet", "-e", target, what=target)
    stamp.write_text(digest)


def check_python() -> None:
    """Before anything is built: this Python is one the project runs on."""
    if sys.version_info[:2] >= NEEDS:
        return
    have = ".".join(map(str, sys.version_info[:3]))
    need = ".".join(map(str, NEEDS))
    again = " ".join(["dev.py", *sys.argv[1:]])
    raise Failed(f"needs Python {need} or newer, and this is Python {have} ({sys.executable}); "
                 f"nothing was built: run it with a newer one, e.g. `python{need} {again}`")


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


# Run by the venv's python: `dev.py pg ACTION` on the embedded PostgreSQL of the data directory
# argv[2]. pg_ctl refuses to run as root, and EmbeddedPostgres runs it as the server's own
# system user then. The broker that owns the server (it stops it at exit, its watchdog
# restarts it when it dies) stays its owner across a stop and start made here.
_PG = """
import json, sys
from pathlib import Path
import psutil
from broker.store.embedded_pg import EmbeddedPostgres, EmbeddedPostgresError
action, pgdata = sys.argv[1], Path(sys.argv[2])
owner_file = Path(str(pgdata) + ".owner")

def live_owner():
    try:
        owner = json.loads(owner_file.read_text())
        if abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) < 0.5:
            return owner
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None

if not (pgdata / "PG_VERSION").exists():
    print(f"dev.py: there is no embedded PostgreSQL in {pgdata} (`python3 dev.py run` makes it)",
          file=sys.stderr)
    sys.exit(1)
host, port = EmbeddedPostgres(pgdata).last_address() or ("127.0.0.1", 54329)
pg = EmbeddedPostgres(pgdata, port=port, host=host)
owner = live_owner()
by = f"; its broker is pid {owner['pid']}" if owner else ""
try:
    if action == "status":
        if pg.is_running():
            print(f"dev.py: the embedded PostgreSQL of {pgdata} runs on {host}:{port}{by}")
        else:
            print(f"dev.py: the embedded PostgreSQL of {pgdata} is stopped (it listens on "
                  f"{host}:{port} when started)")
            sys.exit(3)
    elif action == "stop":
        if not pg.is_running():
            print(f"dev.py: the embedded PostgreSQL of {pgdata} is not running")
        else:
            pg.stop()
            if owner:  # still the broker's, which leaves a server stopped on purpose stopped
                owner_file.write_text(json.dumps(owner))
            print(f"dev.py: stopped the embedded PostgreSQL of {pgdata} ({host}:{port}){by}, "
                  f"which spools pushes (answered buffered) until `python3 dev.py pg start`"
                  if owner else f"dev.py: stopped the embedded PostgreSQL of {pgdata} "
                  f"({host}:{port})")
    elif pg.is_running():
        print(f"dev.py: the embedded PostgreSQL of {pgdata} already runs on {host}:{port}")
    else:
        pg.start()
        if owner:
            owner_file.write_text(json.dumps(owner))
        print(f"dev.py: started the embedded PostgreSQL of {pgdata} on {host}:{port}{by}, "
              f"which reconnects and replays its spool by itself" if owner else
              f"dev.py: started the embedded PostgreSQL of {pgdata} on {host}:{port}; "
              f"`python3 dev.py pg stop` stops it (a broker started on it leaves it running)")
except EmbeddedPostgresError as exc:
    print(f"dev.py: {exc.summary}", file=sys.stderr)
    sys.exit(1)
"""


def pg(rest: "list[str]") -> int:
    """`dev.py pg start|stop|status`: the embedded PostgreSQL of EMBEDDED_PG_DIR (.queen/pgdata
    by default, relative to the checkout as under `dev.py run`), for an outage drill."""
    if len(rest) != 1 or rest[0] not in ("start", "stop", "status"):
        print("usage: python3 dev.py pg start|stop|status   (the embedded PostgreSQL of "
              "EMBEDDED_PG_DIR, default .queen/pgdata)", file=sys.stderr)
        return 2
    if not (BIN / "python").exists():
        raise Failed(f"there is no {VENV} yet: `python3 dev.py run` makes it, and the embedded "
                     "PostgreSQL")
    pgdata = ROOT / os.environ.get("EMBEDDED_PG_DIR", str(STATE / "pgdata"))
    return subprocess.run([str(BIN / "python"), "-c", _PG, rest[0], str(pgdata)],
                          cwd=ROOT).returncode


def spool_holder(lock: Path) -> "str | None":
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
        pid = spool_holder(lock)
        if pid is not None:
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
    commands = ("run", "test", "bench", "micro", "ha", "ctl", "reset", "schema", "pg", "docs")
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        check_python()
        return command(sys.argv[1], sys.argv[2:])
    except Failed as exc:
        print(f"dev.py: {exc}", file=sys.stderr)
        return 1


def command(command: str, rest: "list[str]") -> int:
    if command == "reset":
        return reset()
    if command == "pg":
        return pg(rest)
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
