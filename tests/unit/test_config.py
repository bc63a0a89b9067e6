import sys
from dataclasses import fields
from pathlib import Path

import pytest

# The project is not installed into the venv; make `broker` importable from the repo root.
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from broker.core.config import (  # noqa: E402
    VARIABLES,
    ConfigError,
    Settings,
    load_settings,
    markdown_table,
)

KEY = "00112233445566778899aabbccddeeff" * 2


def test_defaults():
    s = load_settings({})
    assert (s.host, s.port, s.log_level, s.max_body_bytes) == ("127.0.0.1", 6632, "INFO", 16777216)
    assert s.worker_id.startswith("broker-")
    assert s.pg_host is None and s.embedded_pg
    assert (s.pg_port, s.pg_user, s.pg_password, s.pg_db) == (5432, "postgres", "postgres", "postgres")
    assert s.pg_use_ssl is False and s.pg_ssl_reject_unauthorized is True
    assert s.db_pool_size == 20
    assert s.embedded_pg_dir == Path.cwd() / ".queen" / "pgdata"
    assert s.embedded_pg_port == 54329
    assert s.default_subscription_mode == "all"
    assert s.pop_wait_backoff_multiplier == 2.0
    assert s.encryption_key is None
    assert s.queen_sync_enabled and s.queen_mesh_port == 6633 and s.queen_mesh_peers == ()
    assert not s.mesh_active
    assert s.queen_server_id.startswith("queen-") and len(s.queen_server_id) == 14
    assert s.file_buffer_dir == Path.cwd() / ".queen" / "buffers"
    assert s.jwt_enabled is False and s.jwt_algorithm == "HS256"
    assert s.jwt_skip_paths == ("/health", "/metrics/prometheus", "/metrics", "/")


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("PORT", "7000")
    assert load_settings().port == 7000


def test_empty_string_means_default():
    s = load_settings({"PORT": "", "PG_HOST": "  ", "LOG_LEVEL": "", "PG_USE_SSL": ""})
    assert (s.port, s.pg_host, s.log_level, s.pg_use_ssl) == (6632, None, "INFO", False)


def test_values_are_parsed():
    s = load_settings({
        "PORT": " 8080 ", "LOG_LEVEL": "Debug", "PG_HOST": "db", "PG_USE_SSL": "YES",
        "PG_SSL_REJECT_UNAUTHORIZED": "off", "EMBEDDED_PG_PORT": "0",
        "DEFAULT_SUBSCRIPTION_MODE": "NEW-ONLY", "POP_WAIT_BACKOFF_MULTIPLIER": "1.5",
        "EMBEDDED_PG_DIR": "/var/lib/q", "QUEEN_ENCRYPTION_KEY": KEY.upper(),
        "JWT_ALGORITHM": "eddsa", "JWT_SKIP_PATHS": "/a, /b,,",
        "HOSTNAME": "node-7",
    })
    assert (s.port, s.log_level, s.pg_host) == (8080, "DEBUG", "db")
    assert s.pg_use_ssl is True and s.pg_ssl_reject_unauthorized is False
    assert s.embedded_pg_port == 0 and not s.embedded_pg
    assert s.default_subscription_mode == "new-only"
    assert s.pop_wait_backoff_multiplier == 1.5
    assert s.embedded_pg_dir == Path("/var/lib/q")
    assert s.encryption_key == bytes.fromhex(KEY)
    assert s.jwt_algorithm == "EdDSA"
    assert s.jwt_skip_paths == ("/a", "/b")
    assert s.queen_server_id == "node-7"


@pytest.mark.parametrize("name, value, expected", [
    ("PORT", "abc", "PORT must be an integer between 1 and 65535, got 'abc'"),
    ("PORT", "0", "between 1 and 65535"),
    ("PORT", "65536", "between 1 and 65535"),
    ("PG_PORT", "1.5", "PG_PORT must be an integer"),
    ("EMBEDDED_PG_PORT", "-1", "between 0 and 65535"),
    ("QUEEN_MESH_PORT", "x", "QUEEN_MESH_PORT must be an integer"),
    ("DB_POOL_SIZE", "1", "DB_POOL_SIZE must be an integer >= 2, got '1'"),
    ("DB_STATEMENT_TIMEOUT", "0", "DB_STATEMENT_TIMEOUT must be an integer >= 1"),
    ("DEFAULT_TIMEOUT", "-5", "DEFAULT_TIMEOUT must be an integer >= 1"),
    ("MAX_BODY_BYTES", "lots", "MAX_BODY_BYTES must be an integer"),
    ("STATS_INTERVAL_MS", "999", "STATS_INTERVAL_MS must be an integer >= 1000, got '999'"),
    ("METRICS_FLUSH_MS", "10", "METRICS_FLUSH_MS must be an integer >= 1000"),
    ("JWT_CLOCK_SKEW", "-1", "JWT_CLOCK_SKEW must be an integer >= 0"),
    ("PG_USE_SSL", "maybe", "PG_USE_SSL must be a boolean (true/false, 1/0, yes/no, on/off), got 'maybe'"),
    ("QUEEN_SYNC_ENABLED", "2", "QUEEN_SYNC_ENABLED must be a boolean"),
    ("LOG_LEVEL", "loud", "LOG_LEVEL must be one of trace, debug, info, success, warning, error, critical, got 'loud'"),
    ("JWT_ALGORITHM", "none", "JWT_ALGORITHM must be one of HS256, RS256, EdDSA, auto, got 'none'"),
    ("POP_WAIT_BACKOFF_MULTIPLIER", "0.5", "POP_WAIT_BACKOFF_MULTIPLIER must be a number >= 1, got '0.5'"),
    ("POP_WAIT_BACKOFF_MULTIPLIER", "inf", "POP_WAIT_BACKOFF_MULTIPLIER must be a number"),
    ("QUEEN_MESH_PEERS", "a:99999", "QUEEN_MESH_PEERS entry 'a:99999' has a bad port"),
    ("QUEEN_MESH_PEERS", ":7000", "QUEEN_MESH_PEERS entries must be host[:port], got ':7000'"),
])
def test_bad_values_name_the_variable_and_value(name, value, expected):
    with pytest.raises(ConfigError) as err:
        load_settings({name: value})
    assert expected in str(err.value)


@pytest.mark.parametrize("value, detail", [
    ("abcd", "got a value of 4 characters"),
    ("zz" * 32, "got a value of 64 characters that is not hex"),
    (KEY + "00", "got a value of 66 characters"),
])
def test_bad_encryption_key_is_an_error_that_does_not_echo_it(value, detail):
    with pytest.raises(ConfigError) as err:
        load_settings({"QUEEN_ENCRYPTION_KEY": value})
    message = str(err.value)
    assert message.startswith("QUEEN_ENCRYPTION_KEY must be exactly 64 hex characters")
    assert detail in message
    assert value not in message


def test_relations_between_variables():
    with pytest.raises(ConfigError, match="POP_WAIT_MAX_INTERVAL_MS must be >= POP_WAIT_INITIAL"):
        load_settings({"POP_WAIT_INITIAL_INTERVAL_MS": "500", "POP_WAIT_MAX_INTERVAL_MS": "200"})
    with pytest.raises(ConfigError, match="QUEEN_SYNC_DEAD_THRESHOLD_MS must be greater"):
        load_settings({"QUEEN_SYNC_HEARTBEAT_MS": "5000"})


def test_jwt_validation():
    with pytest.raises(ConfigError, match="HS256 requires JWT_SECRET"):
        load_settings({"JWT_ENABLED": "true"})
    with pytest.raises(ConfigError, match="RS256 requires JWT_PUBLIC_KEY or JWT_JWKS_URL"):
        load_settings({"JWT_ENABLED": "1", "JWT_ALGORITHM": "RS256", "JWT_SECRET": "s"})
    # Disabled auth is not validated; configured auth loads.
    assert load_settings({"JWT_ALGORITHM": "RS256"}).jwt_enabled is False
    assert load_settings({"JWT_ENABLED": "on", "JWT_SECRET": "s"}).jwt_secret == "s"
    s = load_settings({"JWT_ENABLED": "on", "JWT_ALGORITHM": "RS256", "JWT_JWKS_URL": "https://x"})
    assert s.jwt_jwks_url == "https://x"


def test_mesh_aliases():
    s = load_settings({"QUEEN_UDP_NOTIFY_PORT": "7001", "QUEEN_UDP_PEERS": "b,c:7002"})
    assert s.queen_mesh_port == 7001
    assert s.queen_mesh_peers == (("b", 7001), ("c", 7002))
    # The new names win over the aliases.
    s = load_settings({"QUEEN_MESH_PORT": "7100", "QUEEN_UDP_NOTIFY_PORT": "7001",
                       "QUEEN_MESH_PEERS": "a", "QUEEN_UDP_PEERS": "b"})
    assert s.queen_mesh_port == 7100 and s.queen_mesh_peers == (("a", 7100),)
    # An empty main name falls through to the alias; errors name the alias actually set.
    assert load_settings({"QUEEN_MESH_PORT": "", "QUEEN_UDP_NOTIFY_PORT": "7001"}).queen_mesh_port == 7001
    with pytest.raises(ConfigError, match="^QUEEN_UDP_NOTIFY_PORT must be"):
        load_settings({"QUEEN_UDP_NOTIFY_PORT": "x"})


def test_peers_parsing():
    s = load_settings({"QUEEN_MESH_PEERS": " a , b:7000,,10.0.0.3:6640, [::1]:7003, [fe80::1], ::2 "})
    assert s.queen_mesh_peers == (
        ("a", 6633), ("b", 7000), ("10.0.0.3", 6640), ("::1", 7003), ("fe80::1", 6633), ("::2", 6633),
    )
    assert s.mesh_active
    assert not load_settings({"QUEEN_MESH_PEERS": "a", "QUEEN_SYNC_ENABLED": "false"}).mesh_active


def test_secrets_never_shown():
    secrets = {
        "PG_PASSWORD": "pg-pass-xyzzy",
        "QUEEN_ENCRYPTION_KEY": KEY,
        "QUEEN_SYNC_SECRET": "sync-secret-plugh",
        "JWT_SECRET": "jwt-secret-quux",
    }
    s = load_settings({**secrets, "JWT_ENABLED": "true", "QUEEN_MESH_PEERS": "a"})
    shown = repr(s) + str(s) + repr(s.log_blocks())
    for value in [*secrets.values(), repr(bytes.fromhex(KEY)), bytes.fromhex(KEY).hex()]:
        assert value not in shown
    assert s.pg_password == "pg-pass-xyzzy"  # still available to the code that needs it

    blocks = s.log_blocks()
    assert set(blocks) >= {"config: http", "config: database", "config: pop", "config: sync"}
    assert blocks["config: database"]["password"] == "<set:13 chars>"
    assert blocks["config: sync"]["secret"] == "<set:17 chars>"
    assert blocks["config: sync"]["auth"] == "hmac"


def test_sync_log_block():
    s = load_settings({"QUEEN_SERVER_ID": "q1", "QUEEN_MESH_PEERS": "a,b:7000"})
    assert s.log_blocks()["config: sync"] == {
        "enabled": True, "mesh_active": True, "server_id": "q1", "mesh_port": 6633,
        "peers": ["a:6633", "b:7000"], "secret": "<unset>", "heartbeat_ms": 1000,
        "dead_threshold_ms": 5000, "cache_refresh_ms": 60000, "auth": "off",
        "mesh_host": "127.0.0.1", "advertise_url": "http://127.0.0.1:6632", "tls": "off",
    }


def test_the_advertised_url_defaults_to_the_http_api_and_must_be_http():
    assert load_settings({"HOST": "10.0.0.5", "PORT": "7000"}).queen_advertise_url == \
        "http://10.0.0.5:7000"
    given = load_settings({"QUEEN_ADVERTISE_URL": "https://queen-1.internal:443/"})
    assert given.queen_advertise_url == "https://queen-1.internal:443"
    for bad in ("queen-1:6632", "ftp://x", "http://"):
        with pytest.raises(ConfigError, match="QUEEN_ADVERTISE_URL"):
            load_settings({"QUEEN_ADVERTISE_URL": bad})


def test_registry_matches_settings():
    assert [f.name for f in fields(Settings)] == [v.attr for v in VARIABLES]
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    for var in VARIABLES:
        assert var.doc and var.kind
        assert var.attr == var.name.lower() or var.name == "QUEEN_ENCRYPTION_KEY"


def test_markdown_table_lists_every_variable():
    table = markdown_table()
    lines = table.strip().splitlines()
    assert lines[0] == "| Variable | Default | Meaning |"
    assert len(lines) == 2 + len(VARIABLES)
    for var in VARIABLES:
        assert f"| `{var.name}` |" in table
    assert "| `PORT` | `6632` |" in table
    assert "| `PG_HOST` | *(unset)* |" in table


def test_configuration_page_table_matches_the_code():
    """The docs' variable table (docs/operations/configuration.md) is exactly what
    broker/core/config.py declares."""
    page = ROOT / "docs/operations/configuration.md"
    text = page.read_text()
    start, end = "<!-- config:start -->\n", "\n<!-- config:end -->"
    assert start in text and end in text, f"{page.name} lost its config table markers"
    embedded = text[text.index(start) + len(start):text.index(end)]
    assert embedded.strip() == markdown_table().strip(), (
        f"{page.relative_to(ROOT)}'s configuration table is stale: paste "
        "broker.core.config.markdown_table() between the config markers")


def test_mesh_host_defaults_to_host_and_connection_cap_to_peers():
    s = load_settings({"HOST": "10.1.2.3", "QUEEN_MESH_PEERS": "a,b"})
    assert s.queen_mesh_host == "10.1.2.3" and s.queen_mesh_max_connections == 12
    s = load_settings({"HOST": "10.1.2.3", "QUEEN_MESH_HOST": "10.9.9.9",
                       "QUEEN_MESH_MAX_CONNECTIONS": "3"})
    assert s.queen_mesh_host == "10.9.9.9" and s.queen_mesh_max_connections == 3
    assert s.queen_mesh_max_skew_ms == 30000 and s.queen_mesh_max_frame_bytes == 1024 * 1024


def test_require_secret_makes_an_empty_secret_a_config_error():
    with pytest.raises(ConfigError, match="QUEEN_MESH_REQUIRE_SECRET"):
        load_settings({"QUEEN_MESH_REQUIRE_SECRET": "true", "QUEEN_MESH_PEERS": "a"})
    assert load_settings({"QUEEN_MESH_REQUIRE_SECRET": "true",
                          "QUEEN_SYNC_SECRET": "s"}).queen_mesh_require_secret


def test_mesh_tls_needs_all_three_readable_files(tmp_path):
    files = {}
    for name in ("QUEEN_MESH_TLS_CERT", "QUEEN_MESH_TLS_KEY", "QUEEN_MESH_TLS_CA"):
        path = tmp_path / name
        path.write_text("pem")
        files[name] = str(path)
    assert load_settings(files).mesh_tls
    with pytest.raises(ConfigError, match="QUEEN_MESH_TLS_KEY"):
        load_settings({k: v for k, v in files.items() if k != "QUEEN_MESH_TLS_KEY"})
    with pytest.raises(ConfigError, match="QUEEN_MESH_TLS_CA"):
        load_settings({**files, "QUEEN_MESH_TLS_CA": str(tmp_path / "missing.pem")})
    assert not load_settings({}).mesh_tls


def test_variables_that_look_like_ours_are_warned_about():
    from broker.core.config import suspicious_variables
    warnings = suspicious_variables({
        "QUEEN_MESH_PEER": "b:6633", "PG_HOTS": "db", "PG_SOMETHING": "1", "PORT": "1",
        "QUEEN_URL": "http://x", "PATH": "/bin", "HOME": "/root", "PIP_DEFAULT_TIMEOUT": "60",
        "QUEEN_SERVICE_HOST": "10.0.0.1", "QUEEN_PORT": "tcp://10.0.0.1:6632",
        "QUEEN_PORT_6632_TCP_ADDR": "10.0.0.1", "EMBEDED_PG_PORT": "5"})
    assert len(warnings) == 4, warnings
    text = "\n".join(warnings)
    assert "QUEEN_MESH_PEER is not a queen-broker variable (did you mean QUEEN_MESH_PEERS?)" in text
    assert "did you mean PG_HOST?" in text and "did you mean EMBEDDED_PG_PORT?" in text
    assert "PG_SOMETHING is not a queen-broker variable" in text
