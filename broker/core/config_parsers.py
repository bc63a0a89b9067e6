"""The parsers of broker/core/config.py's variables, and the error they raise. Each parser
takes (variable name, raw string) and returns the typed value or raises ``ConfigError``; the
variable name is passed in (not captured) because aliases are reported under the name the
operator actually set."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting has a value the broker cannot run with; the message says which and why."""


Parser = Callable[[str, str], Any]


def _int(lo: int | None = None, hi: int | None = None) -> Parser:
    if lo is not None and hi is not None:
        expected = f"an integer between {lo} and {hi}"
    elif lo is not None:
        expected = f"an integer >= {lo}"
    else:
        expected = "an integer"

    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be {expected}, got {raw!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ConfigError(f"{name} must be {expected}, got {raw!r}")
        return value

    return parse


def _float(lo: float) -> Parser:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        # nan/inf parse as floats but make no sense as a multiplier
        if not math.isfinite(value) or value < lo:
            raise ConfigError(f"{name} must be a number >= {lo:g}, got {raw!r}")
        return value

    return parse


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _bool(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name} must be a boolean (true/false, 1/0, yes/no, on/off), got {raw!r}")


def _choice(*options: str, upper: bool = False) -> Parser:
    """Case-insensitive choice; returns the canonical spelling (upper-cased if ``upper``)."""
    by_lower = {option.lower(): option for option in options}
    shown = ", ".join(repr(o) if o == "" else o for o in options)

    def parse(name: str, raw: str) -> str:
        option = by_lower.get(raw.lower())
        if option is None:
            raise ConfigError(f"{name} must be one of {shown}, got {raw!r}")
        return option.upper() if upper else option

    return parse


def _fsync_policy(name: str, raw: str) -> int | None:
    """``always`` (None: sync before every answer) or ``interval:MS`` (the window)."""
    value = raw.strip().lower()
    if value == "always":
        return None
    kind, _, ms = value.partition(":")
    if kind == "interval" and ms.isdigit() and 1 <= int(ms) <= 3_600_000:
        return int(ms)
    raise ConfigError(f"{name} must be always or interval:MS (MS from 1 to 3600000), "
                      f"got {raw!r}")


def _str(name: str, raw: str) -> str:
    return raw


def _http_url(name: str, raw: str) -> str:
    url = raw.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url) > 2048 or url in (
            "http://", "https://"):
        raise ConfigError(f"{name} must be an http:// or https:// URL, got {raw!r}")
    return url


def _path(name: str, raw: str) -> Path:
    # Resolved once, at load time, against the working directory the broker was started in,
    # so a later chdir cannot move the data.
    return Path(os.path.abspath(os.path.expanduser(raw)))


def _csv(name: str, raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _peers(name: str, raw: str) -> tuple[tuple[str, int | None], ...]:
    """``host[:port]`` list; port None means "the default port" (filled in by load_settings,
    or by the property that reads the list).

    ``[v6addr]:port`` is accepted for IPv6; a bare address with several colons is a host.
    """
    port_of = _int(1, 65535)
    peers = []
    for item in _csv(name, raw):
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else (rest or None)
        elif item.count(":") == 1:
            host, port = item.split(":")
        else:
            host, port = item, None
        if not host:
            raise ConfigError(f"{name} entries must be host[:port], got {item!r}")
        if port is not None:
            try:
                port = port_of(name, port)
            except ConfigError:
                raise ConfigError(
                    f"{name} entry {item!r} has a bad port: must be an integer between 1 and 65535"
                ) from None
        peers.append((host, port))
    return tuple(peers)


def _pg_hosts(name: str, raw: str) -> str:
    """PG_HOST: one host or a comma-separated list, each with an optional ``:port`` (as libpq
    takes them); kept as written, checked here, split by ``Settings.pg_servers``."""
    _peers(name, raw)
    return raw


def _hex_key(name: str, raw: str) -> bytes:
    # Queen silently disables encryption on a malformed key; we refuse to start instead,
    # because "encryption quietly off" is the worst outcome.  The value itself is a secret,
    # so the error describes it without echoing it.
    raw = raw.strip()
    is_hex = all(c in "0123456789abcdefABCDEF" for c in raw)
    if len(raw) != 64 or not is_hex:
        raise ConfigError(
            f"{name} must be exactly 64 hex characters (a 32-byte AES-256 key), "
            f"got a value of {len(raw)} characters" + ("" if is_hex else " that is not hex")
        )
    key = bytes.fromhex(raw)
    return key
