"""TLS to PostgreSQL (PG_USE_SSL): with PG_SSL_REJECT_UNAUTHORIZED=true (the default) the
server's certificate is verified against the CA in PGSSLROOTCERT, host name included, and a
broker that cannot verify it refuses to start, in one line, instead of talking to whoever
answers. With PG_SSL_REJECT_UNAUTHORIZED=false the connection is encrypted, unverified.

The embedded PostgreSQL is built without SSL, so a real TLS front (tests/pg_tls_proxy.py: it
answers PostgreSQL's SSLRequest and upgrades the socket with a certificate for 127.0.0.1 from
a throw-away CA) stands before it; the broker's verification is what is tested.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import Database, start_broker
from tests.faults.test_startup import assert_one_error_line, run_to_exit
from tests.mesh_pki import make_pki
from tests.pg_tls_proxy import TLSProxy


@pytest.fixture(scope="module")
def tls_pg(database):
    root = Path(tempfile.mkdtemp(prefix="qtls", dir="/tmp"))
    pki = make_pki(root / "pki")
    proxy = TLSProxy(database.port, pki["a"]["cert"], pki["a"]["key"]).start()
    yield proxy, pki, root
    proxy.stop()
    shutil.rmtree(root, ignore_errors=True)


def tls_env(proxy: TLSProxy, root: Path, **extra: str) -> dict[str, str]:
    # HOME elsewhere: no ~/.postgresql/root.crt of the machine's user can stand in for the CA.
    return {"PG_HOST": "127.0.0.1", "PG_PORT": str(proxy.port), "PG_USE_SSL": "true",
            "HOME": str(root / "home"), **extra}


def via(proxy: TLSProxy, database: Database) -> Database:
    return Database("127.0.0.1", proxy.port, database.user, database.password, database.db)


def rogue_ca(pki: dict) -> str:
    return str(Path(pki["ca"]).with_name("rogue-ca.crt"))


def test_a_verified_certificate_connects_encrypted(tls_pg, database, tmp_path):
    proxy, pki, root = tls_pg
    before = proxy.tls_sessions, proxy.plain_connections
    broker = start_broker(via(proxy, database), tmp_path,
                          **tls_env(proxy, root, PGSSLROOTCERT=pki["ca"]))
    broker.stop()
    assert proxy.tls_sessions > before[0] and proxy.plain_connections == before[1]


def test_a_certificate_from_another_ca_is_refused_in_one_line(tls_pg, tmp_path):
    proxy, pki, root = tls_pg
    result = run_to_exit(tmp_path, **tls_env(proxy, root, PGSSLROOTCERT=rogue_ca(pki)))
    assert result.returncode != 0
    assert_one_error_line(result.stderr, f"127.0.0.1:{proxy.port}", "refused", "certificate",
                          "PGSSLROOTCERT")


def test_no_ca_to_verify_against_is_refused_in_one_line(tls_pg, tmp_path):
    proxy, _, root = tls_pg
    result = run_to_exit(tmp_path, **tls_env(proxy, root))
    assert result.returncode != 0
    assert_one_error_line(result.stderr, "root certificate", "PGSSLROOTCERT")


def test_unverified_tls_is_an_explicit_choice(tls_pg, database, tmp_path):
    proxy, pki, root = tls_pg
    before = proxy.tls_sessions, proxy.plain_connections
    broker = start_broker(via(proxy, database), tmp_path, **tls_env(
        proxy, root, PGSSLROOTCERT=rogue_ca(pki), PG_SSL_REJECT_UNAUTHORIZED="false"))
    broker.stop()
    assert proxy.tls_sessions > before[0] and proxy.plain_connections == before[1]
