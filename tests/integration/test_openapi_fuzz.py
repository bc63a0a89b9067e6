"""The API reference is tested against the broker it describes: schemathesis generates
requests from the served /openapi.json (its coverage phase: boundary and invalid values for
every parameter and body; then a bounded number of random examples per operation) and sends
them to a real broker process on its own database, every route included (the migration
routes' targets are mapped to hosts that fail here: schemathesis_hooks.py). The run fails on
any 5xx, on any status code, content type, header or body the document does not allow for that
answer, and the broker's log must hold no traceback afterwards.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, start_broker

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_headers_conformance,response_schema_conformance")
EXAMPLES_PER_OPERATION = 10


def test_generated_requests_find_no_5xx_and_no_answer_outside_the_document(
        fresh_database, tmp_path: Path):
    # Its own database: the run flips the cluster-wide maintenance flags and deletes queues.
    # DEFAULT_TIMEOUT: a generated long poll without a timeout waits half a second, not 30.
    # MIGRATION_ROUTES: every route is fuzzed; their targets are mapped by the hooks to hosts
    # that fail on this machine, on a port held here, bound and never listened on.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    broker = start_broker(fresh_database, tmp_path, DEFAULT_TIMEOUT="500",
                          MIGRATION_ROUTES="true")
    seed = os.environ.get("SCHEMATHESIS_SEED", "20261201")
    try:
        run = subprocess.run(
            [str(Path(sys.executable).parent / "schemathesis"), "run",
             f"{broker.url}/openapi.json", "--checks", CHECKS,
             "--max-examples", str(EXAMPLES_PER_OPERATION), "--seed", seed,
             # One worker: with two, hypothesis parses lambda sources (ast.parse) in two
             # threads at once, which CPython 3.11.7 does not survive ("SystemError: AST
             # constructor recursion depth mismatch", 1 run in 3-4, on the old main too);
             # one worker takes as long here (about 50 s).
             "--phases", "coverage,fuzzing", "--workers", "1", "--request-timeout", "10",
             "--no-color"],
            # run in tmp_path: schemathesis keeps a cache folder where it runs
            cwd=tmp_path, capture_output=True, text=True, timeout=240,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks",
                 "PYTHONPATH": str(ROOT), "FUZZ_CLOSED_PORT": str(closed.getsockname()[1])})
    finally:
        broker.stop()
        closed.close()
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"schemathesis (seed {seed}) found problems:\n{output[-12000:]}"
    generated = re.search(r"(\d+) generated", output)
    assert generated and int(generated.group(1)) > 1000, output[-3000:]
    print(f"schemathesis: {generated.group(0)} requests, seed {seed}")
    log = broker.log()
    # The migration routes were served, not switched off: copies to the mapped targets ran.
    assert "migration to '" in log, log[-3000:]
    assert "Traceback" not in log and " ERROR " not in log, log[-6000:]
