#!/usr/bin/env python3
"""The HA topology of docker-compose.ha.yml / .ha3.yml with real processes on
loopback, for machines without Docker:

    python3 dev.py ha            # PostgreSQL + 2 meshed brokers, until Ctrl-C
    python3 dev.py ha --brokers 3
    python3 dev.py ha --check    # start, assert the mesh is up, stop (exit code says)

One embedded PostgreSQL (or the one named by PG_HOST/PG_PORT/...), brokers on
HTTP ports 6632, 6642, 6652 (--base-port), mesh ports 6633, 6643, 6653, the
same QUEEN_SYNC_SECRET, each other as peers, and a separate FILE_BUFFER_DIR
each (never share a spool).

Every port is checked before anything starts: a taken one fails at once, named. The brokers'
logs are kept (the folder is printed first and last); the embedded PostgreSQL's data is not.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "compose"))

from check_mesh import wait_for_mesh  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python3 dev.py ha",
        description="HA brokers on loopback, meshed, on one PostgreSQL: a temporary embedded "
                    "one, deleted when this stops (Ctrl-C), or the one PG_HOST/PG_PORT/PG_USER/"
                    "PG_PASSWORD/PG_DB name, which is kept.",
        epilog="Ports from --base-port B: broker a serves HTTP on B and the mesh on B+1, broker "
               "b on B+10 and B+11, broker c on B+20 and B+21 (default: 6632/6633, 6642/6643, "
               "6652/6653). Each broker's log and spool are in a new /tmp/queen-ha-* folder, "
               "printed first and kept.")
    parser.add_argument("--brokers", type=int, default=2, choices=(1, 2, 3),
                        help="how many brokers (default 2)")
    parser.add_argument("--base-port", type=int, default=6632, metavar="B",
                        help="broker a's HTTP port; the others are 10 apart, each mesh port is "
                             "its HTTP port + 1 (default 6632)")
    parser.add_argument("--check", action="store_true", help="assert the mesh is up, then stop")
    args = parser.parse_args()
    http_ports = [args.base_port + 10 * i for i in range(args.brokers)]
    mesh_ports = [p + 1 for p in http_ports]
    for i, (http_port, mesh_port) in enumerate(zip(http_ports, mesh_ports)):
        for port, what in ((http_port, "HTTP"), (mesh_port, "mesh")):
            if not port_free(port):
                print(f"local_ha: port {port} ({what} port of broker {'abc'[i]}) is already in "
                      f"use; stop what holds it or pick other ports with --base-port",
                      file=sys.stderr)
                return 1

    work = Path(tempfile.mkdtemp(prefix="queen-ha-", dir="/tmp"))
    print(f"logs: {work}", flush=True)
    pg = None
    if os.environ.get("PG_HOST"):
        db_env = {k: os.environ[k] for k in ("PG_HOST", "PG_PORT", "PG_USER", "PG_PASSWORD", "PG_DB")
                  if k in os.environ}
        print(f"database: PG_HOST={db_env['PG_HOST']} (kept when this stops)", flush=True)
    else:
        from broker.store.embedded_pg import EmbeddedPostgres
        pg = EmbeddedPostgres(work / "pgdata", port=0)
        pg.start()
        db_env = {"PG_HOST": pg.host, "PG_PORT": str(pg.port)}
        print(f"database: a temporary embedded PostgreSQL in {work / 'pgdata'} on "
              f"{pg.host}:{pg.port}, deleted when this stops (set PG_HOST ... to keep the data "
              f"in a PostgreSQL of your own)", flush=True)
    secret = os.environ.get("QUEEN_SYNC_SECRET") or secrets.token_hex(32)
    procs = []
    try:
        for i, (http_port, mesh_port) in enumerate(zip(http_ports, mesh_ports)):
            peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(mesh_ports) if j != i)
            env = {**os.environ, **db_env, "HOST": "127.0.0.1", "PORT": str(http_port),
                   "QUEEN_SERVER_ID": f"queen-{'abc'[i]}", "QUEEN_MESH_PORT": str(mesh_port),
                   "QUEEN_MESH_PEERS": peers, "QUEEN_SYNC_SECRET": secret,
                   "FILE_BUFFER_DIR": str(work / f"buffers-{'abc'[i]}")}
            log = open(work / f"broker-{'abc'[i]}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", "broker"], cwd=ROOT, env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
        urls = [f"http://127.0.0.1:{p}" for p in http_ports]
        ok = wait_for_mesh(urls, 60) if args.brokers > 1 else True
        for i, proc in enumerate(procs):
            if proc.poll() is not None:  # whatever answered on its port, it was not this one
                log = work / f"broker-{'abc'[i]}.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                print(f"local_ha: broker {'abc'[i]} exited with {proc.returncode}: {tail[0]} "
                      f"(log: {log})", file=sys.stderr)
                ok = False
        print(f"brokers: {' '.join(urls)}   logs: {work}")
        if args.check:
            return 0 if ok else 1
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        if pg is not None:
            pg.stop()
            shutil.rmtree(work / "pgdata", ignore_errors=True)
            print(f"local_ha: deleted the temporary database {work / 'pgdata'}", flush=True)
        print(f"local_ha: brokers stopped; their logs are in {work}", flush=True)


def port_free(port: int) -> bool:
    """Whether 127.0.0.1:port can be listened on now (SO_REUSEADDR, as the brokers bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _interrupt(*_args) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough; let cleanup finish
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # stop the brokers on SIGTERM as on Ctrl-C
    sys.exit(main())
