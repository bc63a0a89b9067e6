"""The loopback HA runner of docs/guides/high-availability.md (compose/local_ha.py) brings a full mesh up
and its check (compose/check_mesh.py, the same one used beside docker compose)
says so."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.ports import free_port_range

# local_ha.py lays its ports out from --base-port: HTTP base + 10 i, mesh base + 10 i + 1.
PORTS_OF_THREE = 22


def test_local_ha_runner_reports_a_full_mesh_of_three(database):
    base = free_port_range(PORTS_OF_THREE)  # never in use, never an outgoing connection's
    env = {"PG_HOST": database.host, "PG_PORT": str(database.port), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "compose/local_ha.py", "--check", "--brokers", "3",
                           "--base-port", str(base)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("peers connected 2/2") == 3
    shutil.rmtree(re.search(r"logs are in (\S+)", proc.stdout).group(1), ignore_errors=True)


def test_a_taken_port_fails_at_once_naming_it(database):
    """Before anything starts: a port in use is named, nothing is started, exit 1."""
    import socket

    base = free_port_range(PORTS_OF_THREE)  # never in use, never an outgoing connection's
    env = {"PG_HOST": database.host, "PG_PORT": str(database.port), "PATH": "/usr/bin:/bin"}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 11))  # broker b's mesh port
        holder.listen()
        proc = subprocess.run([sys.executable, "compose/local_ha.py", "--check", "--base-port",
                               str(base)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 1
    assert f"port {base + 11} (mesh port of broker b) is already in use" in proc.stderr
    assert "logs:" not in proc.stdout  # nothing was started, no mesh was waited for


def test_the_logs_are_kept_and_their_folder_printed(database):
    base = free_port_range(PORTS_OF_THREE)  # never in use, never an outgoing connection's
    env = {"PG_HOST": database.host, "PG_PORT": str(database.port), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "compose/local_ha.py", "--check", "--base-port",
                           str(base)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = Path(re.search(r"logs are in (\S+)", proc.stdout).group(1))
    try:
        logs = sorted(p.name for p in folder.glob("broker-*.log"))
        assert logs == ["broker-a.log", "broker-b.log"]
        assert "serving on" in (folder / "broker-a.log").read_text()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_help_explains_the_port_layout_and_the_temporary_database():
    proc = subprocess.run([sys.executable, "compose/local_ha.py", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "usage: python3 dev.py ha" in said
    assert "broker a serves HTTP on B and the mesh on B+1, broker b on B+10 and B+11, " \
        "broker c on B+20 and B+21" in said, said
    assert "a temporary embedded one, deleted when this stops" in said, said


def test_without_pg_host_the_database_is_said_to_be_temporary_and_deleted():
    base = free_port_range(PORTS_OF_THREE)  # never in use, never an outgoing connection's
    env = {"PATH": "/usr/bin:/bin"}  # no PG_HOST: the embedded PostgreSQL
    proc = subprocess.run([sys.executable, "compose/local_ha.py", "--check", "--brokers", "1",
                           "--base-port", str(base)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    folder = Path(re.search(r"logs are in (\S+)", proc.stdout).group(1))
    try:
        told = [n for n, line in enumerate(lines) if line.startswith(
            f"database: a temporary embedded PostgreSQL in {folder / 'pgdata'} on 127.0.0.1:")]
        started = [n for n, line in enumerate(lines) if line.startswith("brokers:")]
        assert told and started and told[0] < started[0], proc.stdout
        assert "deleted when this stops" in lines[told[0]]
        assert f"local_ha: deleted the temporary database {folder / 'pgdata'}" in lines
        assert not (folder / "pgdata").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
