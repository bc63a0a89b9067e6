"""The README's loopback HA runner (compose/local_ha.py) brings a full mesh up
and its check (compose/check_mesh.py, the same one used beside docker compose)
says so."""
from __future__ import annotations

import random
import subprocess
import sys

from tests.conftest import ROOT


def test_local_ha_runner_reports_a_full_mesh_of_three(database):
    base = random.randrange(20000, 40000, 100)
    env = {"PG_HOST": database.host, "PG_PORT": str(database.port), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "compose/local_ha.py", "--check", "--brokers", "3",
                           "--base-port", str(base)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("peers connected 2/2") == 3
