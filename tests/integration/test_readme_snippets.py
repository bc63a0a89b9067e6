"""Every code block of README.md runs as written, against a real broker.

The rule, block by block. A block is a fenced block of README.md (from a line starting with
three backticks to the next such line); its kind is the first word of the fence's info string.

- Every block is ``python`` or ``sh``. Any other kind, or none, fails
  test_every_block_is_run_or_listed: the README shows no code that is not run.
- A block right after ``<!-- readme-test: no-run: REASON -->`` is not run here. NO_RUN lists
  each such block by its first line with the reason (it runs a broker until stopped, needs
  other machines, or deletes the checkout's data), and test_every_block_is_run_or_listed
  fails when the README's no-run blocks and NO_RUN differ: nothing is skipped silently.
  ``python3 dev.py reset`` is run as written by test_dev_reset_stops_what_a_killed_broker_left,
  in a scratch copy of the checkout.
- A block right after ``<!-- readme-test: setup NAME: WHAT -->`` runs once SETUPS[NAME] has made
  WHAT true of the broker (the quarantine block needs quarantined entries).
- Every other block runs, in README order, against one broker of this module (a real
  ``python -m broker`` on a database of its own), and must exit 0 within BLOCK_TIMEOUT:
  - ``python``: saved to a file and run by the venv's python (the one running the tests) in an
    empty temporary directory;
  - ``sh``: run by ``bash -e -o pipefail`` in the repository root, as in the reader's terminal:
    until the README's block that runs ``. .venv/bin/activate``, with no ``.venv/bin`` on the
    PATH (``python3`` is the system's); that block and every later one with the venv activated
    (a later block runs after that same line). A ``curl`` put first on the PATH adds
    ``--fail-with-body``, so an HTTP error answer fails the block.
- How a block learns the broker: the README's address of the reader's broker is the test
  broker's. ``127.0.0.1:6632`` and ``localhost:6632`` in a block are replaced by the test
  broker's ``127.0.0.1:PORT``, and ``QUEEN_URL`` (queenctl's default is
  http://127.0.0.1:6632) is set to its URL. The embedded PostgreSQL's psql arguments
  (``PGPASSWORD=postgres``, ``-h 127.0.0.1 -p 54329 -U postgres postgres``) become the test
  database's. Nothing else in a block is changed.

test_a_broken_block_fails shows the rule failing: the README's old Streams snippet (a
top-level ``await``), the old queenctl synopsis line and a curl of a route that does not exist
each fail, and an unmarked block of another kind and an unlisted no-run block are reported.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from actors.spool.records import encode_legacy_records
from broker.store.embedded_pg import EmbeddedPostgres
from tests.conftest import ROOT, BrokerProcess, Database, db_fetch, free_port, start_broker
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(600)

README = ROOT / "README.md"
BLOCK_TIMEOUT = 120
ACTIVATE = ". .venv/bin/activate"
KINDS = ("python", "sh")
MARKER = re.compile(r"^<!-- readme-test: (.*?) -->$")

# The README's blocks that are not run here, by first line, and why.
NO_RUN = {
    "python3 dev.py run     # the broker: embedded PostgreSQL, http://127.0.0.1:6632":
        "runs the broker until it is stopped, and `dev.py test` runs the suite this test is in",
    "python3 dev.py reset    # stops what a killed broker left running, then deletes .queen/":
        "deletes the checkout's .queen/; test_dev_reset_stops_what_a_killed_broker_left runs it "
        "as written in a scratch copy of the checkout",
    "python3 dev.py ha":
        "starts brokers on the fixed ports 6632-6643 and keeps them running; "
        "tests/ha/test_local_ha_script.py runs compose/local_ha.py on free ports",
    "PG_HOST=db HOST=0.0.0.0 QUEEN_MESH_HOST=10.0.0.1 QUEEN_SERVER_ID=queen-a "
    "QUEEN_MESH_PEERS=10.0.0.2:6633 QUEEN_SYNC_SECRET=$S queen-broker":
        "two brokers on two other hosts",
}


@dataclass(frozen=True)
class Block:
    source: str          # the Markdown file's name
    line: int            # the opening fence's line number in it
    kind: str            # the first word of the info string ("" when there is none)
    text: str
    marker: str | None   # what the readme-test comment right before the fence says

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    @property
    def no_run(self) -> bool:
        return self.marker is not None and self.marker.startswith("no-run:")

    @property
    def setup(self) -> str | None:
        if self.marker is not None and (m := re.match(r"setup (\w+):", self.marker)):
            return m.group(1)
        return None

    @property
    def activates(self) -> bool:
        return self.kind == "sh" and ACTIVATE in self.text.splitlines()

    def __str__(self) -> str:
        return f"{self.source}:{self.line} ({self.kind or 'no kind'})"


def parse(markdown: str, source: str = "README.md") -> list[Block]:
    """The fenced blocks of ``markdown`` with their kind and readme-test marker."""
    lines = markdown.splitlines()
    out, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        info = lines[i][3:].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = m.group(1) if (m := MARKER.match(before.strip())) else None
        out.append(Block(source, i + 1, info.split()[0] if info else "", "\n".join(lines[i + 1:end]),
                         marker))
        i = end + 1
    return out


def problems(blocks: list[Block], no_run: dict[str, str], setups: dict) -> list[str]:
    """What makes a block neither run nor listed: an unknown kind or marker, a no-run block
    NO_RUN does not list (or a NO_RUN entry no block has)."""
    found = []
    for b in blocks:
        if b.kind not in KINDS:
            found.append(f"{b}: a block must be one of {KINDS}, or it is not run")
        if b.marker is not None and not b.no_run and b.setup is None:
            found.append(f"{b}: unknown marker {b.marker!r}")
        if b.setup is not None and b.setup not in setups:
            found.append(f"{b}: no set-up named {b.setup!r}")
        if b.no_run and b.first_line not in no_run:
            found.append(f"{b}: marked no-run but not listed in NO_RUN: {b.first_line!r}")
    marked = {b.first_line for b in blocks if b.no_run}
    found += [f"NO_RUN lists a block the README does not mark no-run: {line!r}"
              for line in no_run if line not in marked]
    return found


# -- running a block ----------------------------------------------------------------------------

@dataclass
class Target:
    """What the blocks run against: the test broker and its database."""
    broker: BrokerProcess
    database: Database


def as_run(text: str, target: Target) -> str:
    """The block with the reader's broker and embedded PostgreSQL replaced by the test's."""
    address = f"127.0.0.1:{target.broker.port}"
    db = target.database
    text = text.replace("127.0.0.1:6632", address).replace("localhost:6632", address)
    text = text.replace("PGPASSWORD=postgres", f"PGPASSWORD={db.password}")
    return text.replace("-h 127.0.0.1 -p 54329 -U postgres postgres",
                        f"-h {db.host} -p {db.port} -U {db.user} {db.db}")


def reader_env(target: Target, shims: Path) -> dict[str, str]:
    """The environment of a reader's terminal: no venv activated, the curl shim first."""
    venv = str(ROOT / ".venv")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not os.path.realpath(p).startswith(os.path.realpath(venv))]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=os.pathsep.join([str(shims), *path]), QUEEN_URL=target.broker.url)
    return env


def curl_shim(directory: Path) -> Path:
    """A directory whose ``curl`` is the real one with --fail-with-body."""
    real = shutil.which("curl")
    assert real, "curl is not installed; the README's examples use it"
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "curl"
    shim.write_text(f'#!/bin/sh\nexec {real} --fail-with-body "$@"\n')
    shim.chmod(0o755)
    return directory


def run_block(block: Block, target: Target, *, activated: bool, scratch: Path,
              shims: Path) -> subprocess.CompletedProcess:
    text = as_run(block.text, target)
    env = reader_env(target, shims)
    if block.kind == "python":
        work = Path(tempfile.mkdtemp(dir=scratch))
        (work / "snippet.py").write_text(text + "\n")
        argv, cwd = [sys.executable, "snippet.py"], work
    elif block.kind == "sh":
        if activated and not block.activates:
            text = ACTIVATE + "\n" + text
        argv, cwd = ["bash", "-e", "-o", "pipefail", "-c", text], ROOT
    else:
        raise ValueError(f"{block}: not a kind that runs")
    try:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, -1, exc.stdout or "",
                                           f"{exc.stderr or ''}\n(timed out after "
                                           f"{BLOCK_TIMEOUT} s)")


def report(block: Block, result: subprocess.CompletedProcess, target: Target) -> str:
    return (f"{block} exited {result.returncode}\n--- block as run ---\n"
            f"{as_run(block.text, target)}\n--- stdout ---\n{str(result.stdout)[-3000:]}\n"
            f"--- stderr ---\n{str(result.stderr)[-3000:]}")


# -- the set-ups a marker can ask for -------------------------------------------------------------

QUARANTINED = 3


def seed_quarantine(spool: Path, queue: str) -> None:
    """A spool file an older broker set aside whole (``failed/``): the broker turns each of its
    events into a quarantine entry at start (README, "The quarantine")."""
    events = [{"queue": queue, "partition": "p1", "transactionId": f"legacy-{n}",
               "payload": {"n": n}, "encrypted": False, "traceId": None, "producerSub": None}
              for n in range(QUARANTINED)]
    (spool / "failed").mkdir(parents=True)
    (spool / "failed" / "queen-1600000000000-00000000.buf").write_bytes(encode_legacy_records(events))


def quarantine_entries(target: Target) -> None:
    listing = httpx.get(target.broker.url + "/api/v1/system/spool/quarantine", timeout=30).json()
    assert listing["count"] == QUARANTINED, listing


SETUPS: dict[str, Callable[[Target], None]] = {"quarantine": quarantine_entries}


# -- fixtures -----------------------------------------------------------------------------------

ALL = parse(README.read_text())
RUN = [b for b in ALL if b.kind in KINDS and not b.no_run]


def _admin(database: Database, sql: str) -> None:
    db_fetch(database, sql)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.fixture(scope="module")
def target(database, scratch):
    """A broker on a database of its own (the README's queue names are plain: orders, clicks),
    with three legacy events in its spool's quarantine."""
    name = f"readme_{uuid.uuid4().hex[:10]}"
    _admin(database, f'CREATE DATABASE "{name}"')
    db = Database(database.host, database.port, database.user, database.password, name)
    spool = scratch / "spool"
    seed_quarantine(spool, "orders")
    broker = start_broker(db, scratch, FILE_BUFFER_DIR=str(spool))
    try:
        yield Target(broker, db)
    finally:
        broker.stop()
        _admin(database, f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def shims(scratch) -> Path:
    return curl_shim(scratch / "shims")


# -- the tests ----------------------------------------------------------------------------------

def test_every_block_is_run_or_listed():
    assert len(ALL) >= 10 and len(RUN) >= 8  # the parse found the README's blocks
    assert problems(ALL, NO_RUN, SETUPS) == []


@pytest.mark.parametrize("block", RUN, ids=[f"L{b.line}-{b.kind}" for b in RUN])
def test_readme_block_runs_as_written(block, target, scratch, shims):
    if block.setup is not None:
        SETUPS[block.setup](target)
    activated = any(b.activates for b in ALL if b.line < block.line)
    result = run_block(block, target, activated=activated, scratch=scratch, shims=shims)
    assert result.returncode == 0, report(block, result, target)


OLD_STREAMS = '''```python
from queen import Queen
from queen.streams import Stream

q = Queen("http://127.0.0.1:6632")
runner = await (Stream.from_(q.queue("clicks"))
                .window_tumbling(seconds=60, event_time=lambda m: m["data"]["ts"])
                .reduce(lambda acc, v: acc + v["n"], 0)
                .to(q.queue("clicks-per-minute"))
                .run(query_id="clicks-per-minute", url="http://127.0.0.1:6632"))
```
'''

BROKEN = OLD_STREAMS + '''
```sh
queenctl status
queenctl queues list | show Q | configure Q -o leaseTime=60
```

```sh
curl -s localhost:6632/api/v1/no-such-route
```

```text
an illustration nobody runs
```

<!-- readme-test: no-run: nobody listed this one -->
```sh
python3 dev.py run
```
'''


def test_a_broken_block_fails(target, scratch, shims):
    """The rule can fail: the README's old Streams snippet (top-level await), the old
    queenctl synopsis line and a route that does not exist each fail when run; a block of
    another kind and an unlisted no-run block are reported."""
    blocks = parse(BROKEN, "BROKEN")
    assert problems(blocks, {}, SETUPS) == [
        "BROKEN:22 (text): a block must be one of ('python', 'sh'), or it is not run",
        "BROKEN:27 (sh): marked no-run but not listed in NO_RUN: 'python3 dev.py run'",
    ]
    streams, synopsis, missing_route = blocks[:3]
    result = run_block(streams, target, activated=True, scratch=scratch, shims=shims)
    assert result.returncode == 1 and "SyntaxError" in result.stderr, result
    assert "'await' outside function" in result.stderr
    result = run_block(synopsis, target, activated=True, scratch=scratch, shims=shims)
    assert result.returncode != 0 and "show: command not found" in result.stderr, result
    result = run_block(missing_route, target, activated=True, scratch=scratch, shims=shims)
    assert result.returncode != 0 and "no_such_route" in result.stdout, result


# -- stopping and resetting (README, "Stopping it and starting over") ------------------------------

_FOREIGN = ("PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB", "EMBEDDED_PG_DIR",
            "EMBEDDED_PG_PORT", "FILE_BUFFER_DIR", "PORT", "HOST", "VIRTUAL_ENV")


def _dev_run(checkout: Path) -> BrokerProcess:
    """What ``python3 dev.py run`` starts in ``checkout``: a broker on the embedded PostgreSQL
    with its data in ``checkout/.queen`` (the defaults, relative to the working directory)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(PORT=str(port), EMBEDDED_PG_PORT="0", QUEEN_MESH_PEERS="", DB_POOL_SIZE="4")
    log_path = checkout / f"broker-{port}.log"
    proc = subprocess.Popen([sys.executable, "-m", "broker"], cwd=checkout, env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    broker = BrokerProcess(f"http://127.0.0.1:{port}", port, env, proc, log_path)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"broker exited:\n{broker.log()}"
        try:
            if httpx.get(broker.url + "/health", timeout=1).status_code == 200:
                return broker
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    broker.stop()
    raise AssertionError(f"broker did not become healthy:\n{broker.log()}")


def test_dev_reset_stops_what_a_killed_broker_left():
    """In a scratch copy of the checkout (dev.py, and .venv linked): Ctrl-C stops a broker and
    its embedded PostgreSQL and keeps the data; the README's reset command refuses while a
    broker runs, and after a ``kill -9`` stops the PostgreSQL left running and deletes .queen/."""
    [reset] = [b for b in ALL if b.first_line.startswith("python3 dev.py reset")]
    command = reset.text.split("#")[0].strip()
    checkout = Path(tempfile.mkdtemp(prefix="qrs", dir="/tmp"))  # short: the PG socket is in it
    shutil.copy(ROOT / "dev.py", checkout / "dev.py")
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    pgdata = EmbeddedPostgres(checkout / ".queen" / "pgdata")
    brokers: list[BrokerProcess] = []

    def run_reset() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=checkout, capture_output=True,
                              text=True, timeout=120)
    try:
        brokers.append(first := _dev_run(checkout))
        assert pgdata.is_running()
        first.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert first.proc.wait(60) == 0, first.log()
        assert not pgdata.is_running(), first.log()
        assert (checkout / ".queen" / "pgdata" / "PG_VERSION").exists()  # the data stays

        brokers.append(second := _dev_run(checkout))
        refused = run_reset()
        assert refused.returncode == 1, refused
        assert f"(pid {second.proc.pid}) is running" in refused.stderr, refused.stderr
        assert (checkout / ".queen").exists() and pgdata.is_running()

        second.proc.kill()  # kill -9: the embedded PostgreSQL keeps running
        second.proc.wait(10)
        assert pgdata.is_running()
        done = run_reset()
        assert done.returncode == 0, done
        assert "stopped the embedded PostgreSQL" in done.stdout, done.stdout
        assert not (checkout / ".queen").exists()
        wait_until(lambda: not pgdata.is_running(), 10, "the PostgreSQL to be gone")
        again = run_reset()
        assert again.returncode == 0 and "nothing to reset" in again.stdout, again
    finally:
        for b in brokers:
            if b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)
        if (checkout / ".queen" / "pgdata").exists():
            pgdata.stop(mode="immediate")
        shutil.rmtree(checkout, ignore_errors=True)
