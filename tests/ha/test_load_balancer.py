"""compose/haproxy.cfg in front of two real brokers on loopback (docs/load-balancer.md):
pushes through it are answered, and a broker whose /health/ready fails is taken out while
the other keeps serving. Skipped where haproxy is not installed."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, start_broker
from tests.waiting import wait_until

HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")


def local_config(tmp: Path, sock: Path, port: int, brokers: list[tuple[str, int]]) -> Path:
    """compose/haproxy.cfg with loopback addresses, this test's port and a stats socket."""
    text = (ROOT / "compose" / "haproxy.cfg").read_text()
    text = text.replace("bind *:6630", f"bind 127.0.0.1:{port}")
    text = re.sub(r"^    server .*\n", "", text, flags=re.M)
    text += "".join(f"    server {name} 127.0.0.1:{p} check\n" for name, p in brokers)
    text = text.replace("global\n", f"global\n    stats socket {sock}\n", 1)
    path = tmp / "haproxy.cfg"
    path.write_text(text)
    return path


def server_states(sock_path: Path) -> dict[str, str]:
    """{server name: UP / DOWN / ...} from haproxy's runtime API."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock_path))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
    return {r["svname"]: r["status"] for r in rows
            if r["pxname"] == "brokers" and r["svname"] not in ("BACKEND", "FRONTEND")}


def test_the_config_is_valid():
    text = (ROOT / "compose" / "haproxy.cfg").read_text()
    assert "option httpchk GET /health/ready" in text
    r = subprocess.run([HAPROXY, "-c", "-f", str(ROOT / "compose" / "haproxy.cfg")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_haproxy_takes_out_a_broker_whose_readiness_fails(database, tmp_path, queue_name):
    a = start_broker(database, tmp_path, QUEEN_SERVER_ID="lb-a", STOP_UNREADY_MS="20000")
    b = start_broker(database, tmp_path, QUEEN_SERVER_ID="lb-b")
    port = free_port()
    sock_dir = Path(tempfile.mkdtemp(prefix="qlb", dir="/tmp"))  # a short path: sun_path
    sock = sock_dir / "haproxy.sock"
    cfg = local_config(tmp_path, sock, port, [("lb-a", a.port), ("lb-b", b.port)])
    proxy = subprocess.Popen([HAPROXY, "-f", str(cfg)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: sock.exists() and server_states(sock) == {"lb-a": "UP",
                                                                     "lb-b": "UP"},
                   15, "both brokers UP in haproxy")
        r = httpx.post(url + "/api/v1/push", timeout=10, json={"items": [
            {"queue": queue_name, "partition": "p", "transactionId": "via-lb", "payload": 1}]})
        assert r.status_code == 200 and r.json()[0]["status"] == "queued", r.text
        # A stops: from its SIGTERM it answers /health/ready 503 while it still serves.
        a.proc.terminate()
        wait_until(lambda: server_states(sock)["lb-a"] == "DOWN", 15, "lb-a taken out")
        assert server_states(sock)["lb-b"] == "UP"
        assert a.proc.poll() is None  # out of the balancer before it stopped listening
        for i in range(4):  # round robin would have sent two of these to A
            r = httpx.post(url + "/api/v1/push", timeout=10, json={"items": [
                {"queue": queue_name, "partition": "p", "transactionId": f"after-{i}",
                 "payload": i}]})
            assert r.status_code == 200, r.text
    finally:
        proxy.terminate()
        proxy.wait(10)
        a.stop()
        b.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)
