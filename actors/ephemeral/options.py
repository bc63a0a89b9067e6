"""An ephemeral queue's options (docs/ephemeral.md §3): the seven knobs of ``configure``, their
defaults, their bounds, and the one parser both the wire (a caller's body) and the start-up
load (rows of ``queen.ephemeral_queues``) use.

Only the knobs a caller gave are stored; the defaults here fill the rest, so a changed default
reaches every queue that never set that knob.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.core.errors import BadRequest

REJECT = "reject"
DROP_OLDEST = "drop_oldest"
POLICIES = (REJECT, DROP_OLDEST)
_POLICY_SPELLINGS = {"reject": REJECT, "drop_oldest": DROP_OLDEST, "drop-oldest": DROP_OLDEST,
                     "dropoldest": DROP_OLDEST}

MAX_WINDOW_COUNT = 10_000  # a pop's largest batch (MAX_POP_BATCH of the durable pop)

# wire name -> (least, most) of the integer knobs
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "maxLength": (1, 10_000_000),
    "maxBytes": (1, 1 << 40),
    "ttlSeconds": (0, 30 * 24 * 3600),
    "leaseSeconds": (1, 3600),
    "retryLimit": (0, 1000),
}
KNOBS = ("maxBytes", "maxLength", "policy", "ttlSeconds", "leaseSeconds", "retryLimit",
         "windowBuffer")
"""The closed list, in the order the client sends and the answers show them."""


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Effective options of one queue. ``ttl_seconds`` 0: no age limit; ``window_ms`` 0: no
    window buffer; ``window_count`` 0: the window fills up to the pop's own batch."""

    max_length: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    policy: str = REJECT
    ttl_seconds: int = 0
    lease_seconds: int = 30
    retry_limit: int = 3
    window_ms: int = 0
    window_count: int = 0

    def wire(self) -> dict[str, Any]:
        """The options as the answers show them (wire names, every knob)."""
        return {"maxBytes": self.max_bytes, "maxLength": self.max_length,
                "policy": self.policy, "ttlSeconds": self.ttl_seconds,
                "leaseSeconds": self.lease_seconds, "retryLimit": self.retry_limit,
                "windowBuffer": {"ms": self.window_ms, "count": self.window_count}}


DEFAULTS = QueueOptions()


def _int(value: Any, name: str, least: int, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"options.{name} must be an integer, got {value!r}"[:300])
    if not least <= value <= most:
        raise BadRequest(f"options.{name} must be between {least} and {most}, got {value}")
    return value


def _window(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise BadRequest("options.windowBuffer must be an object {ms, count}")
    unknown = sorted(set(value) - {"ms", "count"})
    if unknown:
        raise BadRequest(f"options.windowBuffer: unknown key(s) {', '.join(map(str, unknown))}"
                         f"; known: ms, count"[:300])
    out = {}
    for key, most in (("ms", 60_000), ("count", MAX_WINDOW_COUNT)):
        if value.get(key) is not None:
            out[key] = _int(value[key], f"windowBuffer.{key}", 0, most)
    return out


def parse_patch(options: Any) -> dict[str, Any]:
    """A caller's options (wire names) checked and normalised: only the knobs given, a knob
    given as null means "back to its default" (kept as None). Unknown knobs are refused
    (``BadRequest``), never dropped: each one bounds something."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise BadRequest("options must be an object")
    unknown = sorted(str(k) for k in options if k not in KNOBS)
    if unknown:
        raise BadRequest(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}"[:400])
    patch: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            patch[name] = None
        elif name == "policy":
            spelt = _POLICY_SPELLINGS.get(value.lower()) if isinstance(value, str) else None
            if spelt is None:
                raise BadRequest(f"options.policy must be reject or drop_oldest, got {value!r}"[:300])
            patch[name] = spelt
        elif name == "windowBuffer":
            patch[name] = _window(value)
        else:
            patch[name] = _int(value, name, *_INT_BOUNDS[name])
    return patch


def effective(stored: Mapping[str, Any]) -> QueueOptions:
    """The defaults with the stored knobs (wire names) applied; ``stored`` must have passed
    :func:`parse_patch` (a stored row is re-checked by the caller)."""
    window = stored.get("windowBuffer") or {}
    return QueueOptions(
        max_length=stored.get("maxLength") or DEFAULTS.max_length,
        max_bytes=stored.get("maxBytes") or DEFAULTS.max_bytes,
        policy=stored.get("policy") or DEFAULTS.policy,
        ttl_seconds=_or(stored.get("ttlSeconds"), DEFAULTS.ttl_seconds),
        lease_seconds=stored.get("leaseSeconds") or DEFAULTS.lease_seconds,
        retry_limit=_or(stored.get("retryLimit"), DEFAULTS.retry_limit),
        window_ms=_or(window.get("ms"), DEFAULTS.window_ms),
        window_count=_or(window.get("count"), DEFAULTS.window_count))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
