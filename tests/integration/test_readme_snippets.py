"""Every code block of README.md and of the docs pages runs as written, against a real broker.

The rule, block by block. A block is a fenced block of a page (from a line starting with three
backticks to the next such line); its kind is the first word of the fence's info string. The
pages are README.md and every Markdown file under docs/ (the docs site, mkdocs.yml), each
checked in the order of PAGES.

- A ``python`` or ``sh`` block runs. README.md shows no other kind
  (test_every_block_is_run_or_listed fails on one): the README shows no code that is not run.
  A docs page may also show what is not a command: ``json``, ``text`` or ``sql`` blocks
  (answers, wire formats, statements) are shown, not run; a block of any other kind, or none,
  fails the same test.
- A block right after ``<!-- readme-test: no-run: REASON -->`` is not run here. NO_RUN lists
  each such block by its first line with the reason (it runs a broker until stopped, needs
  other machines, or deletes the checkout's data), and test_every_block_is_run_or_listed
  fails when the pages' no-run blocks and NO_RUN differ: nothing is skipped silently.
  ``python3 dev.py reset`` is run as written by test_dev_reset_stops_what_a_killed_broker_left,
  in a scratch copy of the checkout.
- An ``sh`` block whose every line is ``python3 dev.py test`` of test files is the suite
  naming its own tests (the failover drill of docs/operations.md): it is not run here, since
  the suite runs those files itself, and each file it names must exist.
- A block right after ``<!-- readme-test: setup NAME: WHAT -->`` runs once SETUPS[NAME] has made
  WHAT true of the broker (the quarantine block needs quarantined entries).
- Every other block runs, in page order, against one broker per page (a real
  ``python -m broker`` on a database of its own, so a page's queues start empty), and must
  exit 0 within BLOCK_TIMEOUT:
  - ``python``: saved to a file and run by the venv's python (the one running the tests) in an
    empty temporary directory;
  - ``sh``: run by ``bash -e -o pipefail`` in the repository root, as in the reader's terminal:
    until the page's block that runs ``. .venv/bin/activate``, with no ``.venv/bin`` on the
    PATH (``python3`` is the system's); that block and every later one of the page with the
    venv activated (a later block runs after that same line). A ``curl`` put first on the
    PATH adds ``--fail-with-body``, so an HTTP error answer fails the block.
- How a block learns the broker: the pages' address of the reader's broker is the test
  broker's. ``127.0.0.1:6632`` and ``localhost:6632`` in a block are replaced by the test
  broker's ``127.0.0.1:PORT``, and ``QUEEN_URL`` (queenctl's default is
  http://127.0.0.1:6632) is set to its URL. The embedded PostgreSQL's psql arguments
  (``PGPASSWORD=postgres``, ``-h 127.0.0.1 -p 54329 -U postgres postgres``) become the test
  database's. Nothing else in a block is changed.

test_a_broken_block_fails shows the rule failing: the README's old Streams snippet (a
top-level ``await``), the old queenctl synopsis line and a curl of a route that does not exist
each fail, and an unmarked block of another kind, an unlisted no-run block and a suite block
naming a test file that is gone are reported.
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
DOCS = ROOT / "docs"
# README.md first, then the docs pages in a stable order.
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
BLOCK_TIMEOUT = 120
ACTIVATE = ". .venv/bin/activate"
KINDS = ("python", "sh")
SHOWN = ("json", "text", "sql")  # what a docs page may show without running it
SUITE_LINE = re.compile(r"^python3 dev\.py test((?: \S+)+)$")
MARKER = re.compile(r"^<!-- readme-test: (.*?) -->$")

# The blocks of the pages that are not run here, by first line, and why.
NO_RUN = {
    "python3 dev.py run     # the broker: embedded PostgreSQL, http://127.0.0.1:6632":
        "runs the broker until it is stopped, and `dev.py test` runs the suite this test is in",
    "python3 dev.py reset    # stops what a killed broker left running, then deletes .queen/":
        "deletes the checkout's .queen/; test_dev_reset_stops_what_a_killed_broker_left runs it "
        "as written in a scratch copy of the checkout",
    "python3 dev.py ha":
        "starts brokers on the fixed ports 6632-6643 and keeps them running; "
        "tests/ha/test_local_ha_script.py runs compose/local_ha.py on free ports",
    "PG_HOST=db HOST=0.0.0.0 QUEEN_SERVER_ID=queen-a \\": "two brokers on two other hosts",
    # docs/tutorial.md, docs/guides/outage-drill.md
    "python3 dev.py run":
        "runs the broker until it is stopped; the page's other blocks run against a test broker",
    # docs/guides/outage-drill.md
    ".venv/bin/python -c '": "a consumer that runs until stopped with Ctrl-C",
    "python3 dev.py pg status":
        "reads the checkout's own embedded PostgreSQL, which the test broker does not use; "
        "tests/faults/test_dev_pg_drill.py runs dev.py pg in a scratch copy of the checkout",
    "python3 dev.py pg stop":
        "stops the checkout's own embedded PostgreSQL; tests/faults/test_dev_pg_drill.py runs "
        "dev.py pg in a scratch copy of the checkout",
    "python3 dev.py pg start":
        "starts the checkout's own embedded PostgreSQL; tests/faults/test_dev_pg_drill.py runs "
        "dev.py pg in a scratch copy of the checkout",
    # docs/load-balancer.md
    "mkdir -p .queen && python3 -c 'import secrets; print(secrets.token_hex(32))' > "
    ".queen/mesh-secret": "writes into the checkout's .queen/",
    "QUEEN_SYNC_SECRET=$(cat .queen/mesh-secret) QUEEN_SERVER_ID=queen-a \\":
        "runs a broker on the fixed ports 6632 and 6633 until stopped; "
        "tests/ha/test_load_balancer.py runs compose/haproxy.cfg in front of two brokers",
    "QUEEN_SYNC_SECRET=$(cat .queen/mesh-secret) QUEEN_SERVER_ID=queen-b \\":
        "runs a broker on the fixed ports 6642 and 6643 until stopped",
    "python3 compose/check_mesh.py http://127.0.0.1:6632 http://127.0.0.1:6642":
        "needs the two brokers of the page on their fixed ports",
    "sed -e 's/server queen-a queen-a:6632/server queen-a 127.0.0.1:6632/' \\":
        "runs haproxy on the fixed port 6630 until stopped; tests/ha/test_load_balancer.py "
        "runs compose/haproxy.cfg with loopback addresses on free ports",
    "curl -s -XPOST localhost:6630/api/v1/push \\": "needs haproxy and the page's two brokers",
    # docs/guides/tls-jwt.md
    "JWT_ENABLED=true JWT_SECRET=change-me python3 dev.py run":
        "starts a broker with JWT on the fixed port 6632; tests/integration/test_auth.py runs "
        "brokers with each algorithm",
    "PG_HOST=db.internal PG_USE_SSL=true PGSSLROOTCERT=/etc/queen/pg-ca.pem python3 dev.py run":
        "needs a PostgreSQL server with TLS; tests/faults/test_pg_tls.py runs one",
    # docs/operations.md
    ".venv/bin/python benchmarks/outage_recovery.py --scenarios failover":
        "about a minute of load on three brokers and both cores; the suite runs the failover "
        "itself as tests/ha/test_pg_failover.py",
    "patronictl -c /etc/patroni/config.yml switchover --leader pg-0 --candidate pg-1 --force":
        "needs a Patroni cluster",
    "kubectl delete pod queen-broker-1": "needs a cluster running deploy/kubernetes",
    # docs/supervision.md
    "await (client.queue(\"orders\").group(\"billing\")":
        "a fragment: the consume call of a supervised consumer",
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
    def suite_files(self) -> list[str] | None:
        """The test files an ``sh`` block of ``python3 dev.py test`` lines names, or None when
        the block is not one."""
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        if self.kind != "sh" or not lines or not all(SUITE_LINE.match(x) for x in lines):
            return None
        return [arg for x in lines for arg in SUITE_LINE.match(x).group(1).split()
                if not arg.startswith("-")]

    @property
    def runs(self) -> bool:
        return self.kind in KINDS and not self.no_run and self.suite_files is None

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
    NO_RUN does not list (or a NO_RUN entry no block has), a suite block naming a file that
    is not there."""
    found = []
    for b in blocks:
        kinds = KINDS if b.source == "README.md" else KINDS + SHOWN
        if b.kind not in kinds:
            found.append(f"{b}: a block must be one of {kinds}, or it is not run")
        if b.marker is not None and not b.no_run and b.setup is None:
            found.append(f"{b}: unknown marker {b.marker!r}")
        if b.setup is not None and b.setup not in setups:
            found.append(f"{b}: no set-up named {b.setup!r}")
        if b.no_run and b.first_line not in no_run:
            found.append(f"{b}: marked no-run but not listed in NO_RUN: {b.first_line!r}")
        for name in b.suite_files or ():
            if not (ROOT / name).is_file():
                found.append(f"{b}: names {name}, which is not a test file of the suite")
    marked = {b.first_line for b in blocks if b.no_run}
    found += [f"NO_RUN lists a block no page marks no-run: {line!r}"
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
    assert real, "curl is not installed; the pages' examples use it"
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
    events into a quarantine entry at start (docs/operations/outages.md, "The quarantine")."""
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

def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


ALL = [b for page in PAGES for b in parse(page.read_text(), page_name(page))]
RUN = [b for b in ALL if b.runs]


def _admin(database: Database, sql: str) -> None:
    db_fetch(database, sql)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


class Targets:
    """One broker per page, each on a database of its own (the pages' queue names are plain:
    orders, clicks), with three legacy events in its spool's quarantine. The pages run one
    after the other, so the broker of the page before is stopped when the next page starts."""

    def __init__(self, database: Database, scratch: Path):
        self.database, self.scratch = database, scratch
        self.page: str | None = None
        self.current: Target | None = None

    def __call__(self, page: str) -> Target:
        if page != self.page:
            self.close()
            name = f"readme_{uuid.uuid4().hex[:10]}"
            _admin(self.database, f'CREATE DATABASE "{name}"')
            db = Database(self.database.host, self.database.port, self.database.user,
                          self.database.password, name)
            work = Path(tempfile.mkdtemp(dir=self.scratch))
            seed_quarantine(work / "spool", "orders")
            self.page = page
            self.current = Target(start_broker(db, work, FILE_BUFFER_DIR=str(work / "spool")), db)
        assert self.current is not None
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.broker.stop()
            _admin(self.database, f'DROP DATABASE "{self.current.database.db}" WITH (FORCE)')
            self.current, self.page = None, None


@pytest.fixture(scope="module")
def targets(database, scratch):
    made = Targets(database, scratch)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def shims(scratch) -> Path:
    return curl_shim(scratch / "shims")


# -- the tests ----------------------------------------------------------------------------------

def test_every_block_is_run_or_listed():
    # the parse found the pages' blocks: the README's, the tutorial's and the guides'
    assert {b.source for b in RUN} >= {"README.md", "docs/tutorial.md",
                                       "docs/guides/consumer-groups.md"}
    assert len(ALL) >= 60 and len(RUN) >= 20
    assert problems(ALL, NO_RUN, SETUPS) == []


@pytest.mark.parametrize("block", RUN, ids=[f"{b.source}:L{b.line}-{b.kind}" for b in RUN])
def test_block_runs_as_written(block, targets, scratch, shims):
    target = targets(block.source)
    if block.setup is not None:
        SETUPS[block.setup](target)
    activated = any(b.activates for b in ALL if b.source == block.source and b.line < block.line)
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


BROKEN_PAGE = '''```json
{"shown": "not run"}
```

```
a block of no kind
```

```sh
python3 dev.py test tests/ha/test_gone.py -q
```
'''


def test_a_broken_block_fails(targets, scratch, shims):
    """The rule can fail: the README's old Streams snippet (top-level await), the old
    queenctl synopsis line and a route that does not exist each fail when run; a block of
    another kind in the README and an unlisted no-run block are reported, and so are a docs
    page's block of no kind and a suite block naming a test file that is gone."""
    blocks = parse(BROKEN, "README.md")
    assert problems(blocks, {}, SETUPS) == [
        "README.md:22 (text): a block must be one of ('python', 'sh'), or it is not run",
        "README.md:27 (sh): marked no-run but not listed in NO_RUN: 'python3 dev.py run'",
    ]
    assert problems(parse(BROKEN_PAGE, "docs/probe"), {}, SETUPS) == [
        "docs/probe:5 (no kind): a block must be one of "
        "('python', 'sh', 'json', 'text', 'sql'), or it is not run",
        "docs/probe:9 (sh): names tests/ha/test_gone.py, which is not a test file of the suite",
    ]
    target = targets("BROKEN")
    streams, synopsis, missing_route = blocks[:3]
    result = run_block(streams, target, activated=True, scratch=scratch, shims=shims)
    assert result.returncode == 1 and "SyntaxError" in result.stderr, result
    assert "'await' outside function" in result.stderr
    result = run_block(synopsis, target, activated=True, scratch=scratch, shims=shims)
    assert result.returncode != 0 and "show: command not found" in result.stderr, result
    result = run_block(missing_route, target, activated=True, scratch=scratch, shims=shims)
    assert result.returncode != 0 and "no_such_route" in result.stdout, result


# -- stopping and resetting (docs/operations/running.md, "Stopping it and starting over") ---------

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
    its embedded PostgreSQL and keeps the data; the docs' reset command refuses while a
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
