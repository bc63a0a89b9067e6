#!/usr/bin/env python3
"""Assert that every broker of an HA deployment sees all its peers on the mesh.

    python3 compose/check_mesh.py http://localhost:6632 http://localhost:6642 [--timeout 30]

Reads each broker's stats surface (GET /health -> shared_state.transport) and
exits 0 once every broker reports every configured peer connected and alive,
1 when the timeout passes first. Uses only the standard library, so it runs
beside docker compose as well as against brokers on loopback.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request


def mesh_state(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as resp:
            body = json.load(resp)
    except Exception as exc:  # not up yet
        return False, f"{url}: unreachable ({exc.__class__.__name__})"
    transport = (body.get("shared_state") or {}).get("transport")
    if not transport:
        return False, f"{url}: mesh not running (no peers configured, or sync disabled)"
    peers = transport["peers"]
    connected = sum(1 for p in peers if p["connected"])
    alive = transport["servers_alive"]
    ok = connected == len(peers) and alive == len(peers)
    return ok, (f"{url}: server_id={transport['server_id']} peers connected {connected}/"
                f"{len(peers)}, alive {alive}, handshake_failures {transport['handshake_failures']}")


def wait_for_mesh(urls: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        states = [mesh_state(u) for u in urls]
        if all(ok for ok, _ in states) or time.monotonic() > deadline:
            for _, line in states:
                print(line)
            return all(ok for ok, _ in states)
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    ok = wait_for_mesh(args.urls, args.timeout)
    print("mesh is up" if ok else "mesh is NOT up")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
