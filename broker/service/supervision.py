"""The supervised consumers (docs/supervision.md): what the official clients'
``consume().supervision({"group": ...})`` publish in the key/value namespace
``queen-supervisor``, read back, reassembled and checked for the operator's view
(``GET /api/v1/status/supervision``, the dashboard's Consumers screen).

A publication is a slot ``<group>/<instance>`` (``<group>`` alone for a supervisor that
publishes one status per group): a head ``<slot>/head`` = ``{format, write, chunks,
bytes}`` and ``chunks`` rows ``<slot>/chunk/NNNN`` = ``{write, index, data}``, ``data``
being base64 of a slice of the status document's UTF-8 JSON. Nothing of it is kept in
memory: every call reads the live rows (store/supervision.py) in one snapshot.

Any client with write access can put anything in that namespace, so nothing read is
trusted: a head or chunk that does not decode makes its instance ``invalid`` or
``incomplete`` (with the ``problem``), never an error of the route; every field of a
decoded document is checked for its type and range and answered null otherwise; reads
are bounded (instances, head size, chunk size, a byte budget per answer: past it an
instance is ``unread`` and the answer ``truncated``)."""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from broker.service.context import BrokerContext
from broker.store import supervision as store
from broker.store.supervision import NAMESPACE

FORMAT = "queen.supervisor.remote-status/v1"
SCHEMAS = ("queen.consumer.status/v1", "queen.supervisor.status/v1")
"""The status documents understood: a consumer's (the clients' ``supervision``) and an
upstream process supervisor's, which share the namespace and the chunking."""
STATES = ("starting", "running", "paused", "terminating", "stopped")

MAX_INSTANCES = 1000
"""Heads listed per answer (in key order); more make the answer ``truncated``."""
HEAD_MAX_BYTES = 4096
"""A head is ~150 bytes of JSON; a larger one is not read."""
MAX_CHUNKS = 24
MAX_DOCUMENT_BYTES = 1024 * 1024
CHUNK_DATA_MAX = 60_000
"""Base64 characters per chunk (45,000 bytes of document; the clients write one chunk)."""
CHUNK_MAX_BYTES = 64 * 1024
"""JSON text of one chunk's value; a larger one is not read."""
BUDGET_BYTES = 16 * 1024 * 1024
"""Chunk values read per answer; the instances past it are ``unread``."""
MAX_DEPTH = 64
MAX_POOLS = 256
DEFAULT_HEARTBEAT_TIMEOUT = 30
"""Seconds, when a document gives none (the clients' value)."""
MAX_HEARTBEAT_TIMEOUT = 86_400
MAX_COUNT = 2**53
LAST_EPOCH = 253_402_300_799  # 9999-12-31T23:59:59Z

_WRITE = re.compile(r"[0-9a-f]{32}")
_INSTANCE = re.compile(r"[0-9a-f]{16,128}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Pool:
    """One worker pool of a status document (the clients publish one, ``consumer``)."""
    name: str | None
    queue: str | None
    namespace: str | None
    task: str | None
    consumer_group: str | None
    desired: int | None
    running: int | None
    busy: int | None
    completed: int | None
    failed: int | None
    last_completed_at: dt.datetime | None
    oldest_inflight_seconds: int | None


@dataclass(frozen=True)
class Instance:
    """One published slot. ``status``: ``ok`` (decoded), ``incomplete`` (a chunk missing
    or of another write), ``invalid`` (anything else that does not decode; ``problem``
    says what), ``unread`` (past the answer's byte budget). The document's fields are
    None unless ``ok`` and well typed. ``published_at`` / ``expires_at``: the head row's
    write time and expiry (the database's clock); ``updated_at``: the document's."""
    group: str
    instance: str | None
    key: str
    status: str
    problem: str | None
    published_at: dt.datetime
    expires_at: dt.datetime | None
    schema: str | None = None
    state: str | None = None
    hostname: str | None = None
    pid: int | None = None
    engine: str | None = None
    execution_model: str | None = None
    started_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    uptime_seconds: int | None = None
    heartbeat_timeout: int | None = None
    age_seconds: int | None = None
    stale: bool | None = None
    pools: tuple[Pool, ...] = ()


@dataclass(frozen=True)
class SupervisionView:
    """Every instance read, in key order; ``truncated``: instances were left out or
    unread; the namespace's live key counts (``keys``, ``heads``, ``chunks``);
    ``as_of``: the database's clock."""
    group: str | None
    instances: list[Instance]
    truncated: bool
    keys: int
    heads: int
    chunks: int
    as_of: dt.datetime


class _Refused(Exception):
    """The slot does not decode: its status and why."""

    def __init__(self, status: str, problem: str):
        super().__init__(problem)
        self.status, self.problem = status, problem


def slot_of(key: str) -> tuple[str, str, str | None]:
    """A head key's slot, group and instance (None for a slot without one)."""
    slot = key[:-len("/head")]
    group, _, tail = slot.rpartition("/")
    if group and _INSTANCE.fullmatch(tail):
        return slot, group, tail
    return slot, slot, None


def chunk_key(slot: str, index: int) -> str:
    return f"{slot}/chunk/{index:04d}"


def _int(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _text(value: Any, most: int = 255) -> str | None:
    """A short, printable, storable string, or None."""
    if not isinstance(value, str) or not 0 < len(value) <= most or _CONTROL.search(value):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def _epoch(value: Any) -> dt.datetime | None:
    seconds = _int(value, 1, LAST_EPOCH)
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC)


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _head(value: Any) -> tuple[str, int, int]:
    """(write, chunks, bytes) of a head, or :class:`_Refused`."""
    if not isinstance(value, dict):
        raise _Refused("invalid", "the head is not a JSON object")
    if value.get("format") != FORMAT:
        raise _Refused("invalid", f"unsupported head format {_brief(value.get('format'))}")
    write, chunks, size = value.get("write"), value.get("chunks"), value.get("bytes")
    if not isinstance(write, str) or not _WRITE.fullmatch(write):
        raise _Refused("invalid", "the head's write is not 32 lower-case hex digits")
    count, length = _int(chunks, 1, MAX_CHUNKS), _int(size, 1, MAX_DOCUMENT_BYTES)
    if count is None:
        raise _Refused("invalid", f"the head's chunks must be 1 to {MAX_CHUNKS}, "
                                  f"not {_brief(chunks)}")
    if length is None:
        raise _Refused("invalid", f"the head's bytes must be 1 to {MAX_DOCUMENT_BYTES}, "
                                  f"not {_brief(size)}")
    return write, count, length


def _wanted(heads: list[Any]) -> list[str]:
    """The chunk keys of every head that reads as one."""
    keys: list[str] = []
    for row in heads:
        try:
            _, chunks, _ = _head(row["value"])
        except _Refused:
            continue
        slot = slot_of(row["key"])[0]
        keys.extend(chunk_key(slot, i) for i in range(chunks))
    return keys


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _too_deep(document: Any) -> bool:
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = value.values() if isinstance(value, dict) else value \
            if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return False


def _assemble(slot: str, head: Any, chunks: dict[str, Any]) -> dict:
    """The status document of a slot, or :class:`_Refused`."""
    if head["value"] is None and head["size"] > HEAD_MAX_BYTES:
        raise _Refused("invalid", f"the head is larger than {HEAD_MAX_BYTES} bytes")
    write, count, size = _head(head["value"])
    raw = bytearray()
    for index in range(count):
        row = chunks.get(chunk_key(slot, index))
        if row is None:
            raise _Refused("incomplete", f"chunk {index} is missing")
        if row["over_budget"]:
            raise _Refused("unread", "not read: the answer's byte budget was spent")
        value = row["value"]
        if value is None and row["size"] > CHUNK_MAX_BYTES:
            raise _Refused("invalid", f"chunk {index} is larger than {CHUNK_MAX_BYTES} bytes")
        if not isinstance(value, dict):
            raise _Refused("invalid", f"chunk {index} is not a JSON object")
        if value.get("write") != write:
            raise _Refused("incomplete", f"chunk {index} belongs to another write")
        if _int(value.get("index"), index, index) is None:
            raise _Refused("invalid", f"chunk {index} says it is chunk "
                                      f"{_brief(value.get('index'))}")
        data = value.get("data")
        if not isinstance(data, str) or len(data) > CHUNK_DATA_MAX:
            raise _Refused("invalid", f"chunk {index}'s data is not a string of at most "
                                      f"{CHUNK_DATA_MAX} characters")
        try:
            raw += base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise _Refused("invalid", f"chunk {index}'s data is not base64") from None
        if len(raw) > size:
            raise _Refused("invalid", f"the chunks hold more than the head's {size} bytes")
    if len(raw) != size:
        raise _Refused("invalid", f"the chunks hold {len(raw)} bytes, the head says {size}")
    try:
        document = json.loads(raw.decode("utf-8"), parse_float=_finite,
                              parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise _Refused("invalid", "the document is not UTF-8") from None
    except (ValueError, RecursionError):
        raise _Refused("invalid", "the document is not JSON") from None
    if not isinstance(document, dict):
        raise _Refused("invalid", "the document is not a JSON object")
    if _too_deep(document):
        raise _Refused("invalid", f"the document is nested deeper than {MAX_DEPTH} levels")
    return document


def _pool(raw: Any) -> Pool:
    return Pool(
        name=_text(raw.get("name", raw.get("supervisor"))), queue=_text(raw.get("queue")),
        namespace=_text(raw.get("namespace")), task=_text(raw.get("task")),
        consumer_group=_text(raw.get("consumer_group")),
        desired=_int(raw.get("desired"), 0, MAX_COUNT),
        running=_int(raw.get("running", raw.get("processes")), 0, MAX_COUNT),
        busy=_int(raw.get("busy"), 0, MAX_COUNT),
        completed=_int(raw.get("completed"), 0, MAX_COUNT),
        failed=_int(raw.get("failed"), 0, MAX_COUNT),
        last_completed_at=_epoch(raw.get("last_completed_at_epoch")),
        oldest_inflight_seconds=_int(raw.get("oldest_inflight_seconds"), 0, MAX_COUNT))


def _instance(head: Any, chunks: dict[str, Any], now: dt.datetime) -> Instance:
    key = head["key"]
    slot, group, instance = slot_of(key)
    base = Instance(group, instance, key, "ok", None, head["updated_at"], head["expires_at"])
    try:
        document = _assemble(slot, head, chunks)
        schema = document.get("schema")
        if schema not in SCHEMAS:
            raise _Refused("invalid", f"unsupported document schema {_brief(schema)}")
        if instance is not None and document.get("instance_id") != instance:
            raise _Refused("invalid", "the document's instance_id is not its key's")
        pools = document.get("pool_status")
        if not isinstance(pools, list) or len(pools) > MAX_POOLS \
                or not all(isinstance(p, dict) for p in pools):
            raise _Refused("invalid", f"pool_status is not a list of at most {MAX_POOLS} "
                                      "objects")
    except _Refused as refused:
        return replace(base, status=refused.status, problem=refused.problem)
    config = document.get("configuration")
    timeout = _int(config.get("heartbeat_timeout"), 1, MAX_HEARTBEAT_TIMEOUT) \
        if isinstance(config, dict) else None
    timeout = timeout or DEFAULT_HEARTBEAT_TIMEOUT
    updated = _epoch(document.get("updated_at_epoch"))
    age = int((now - (updated or base.published_at)).total_seconds())
    state = document.get("state")
    return replace(
        base, schema=schema, state=state if state in STATES else None,
        hostname=_text(document.get("hostname")), pid=_int(document.get("pid"), 1, MAX_COUNT),
        engine=_text(document.get("engine"), 64),
        execution_model=_text(document.get("execution_model"), 64),
        started_at=_epoch(document.get("started_at_epoch")), updated_at=updated,
        uptime_seconds=_int(document.get("uptime_seconds"), 0, MAX_COUNT),
        heartbeat_timeout=timeout, age_seconds=age, stale=age > timeout,
        pools=tuple(_pool(p) for p in pools))


async def supervision(ctx: BrokerContext, group: str | None) -> SupervisionView:
    """The live publications (of ``group`` only, when given), decoded, in key order."""
    snap = await store.read(ctx.store, "" if group is None else group + "/", MAX_INSTANCES,
                            HEAD_MAX_BYTES, _wanted, CHUNK_MAX_BYTES, BUDGET_BYTES)
    chunks = {row["key"]: row for row in snap.chunks}
    instances = [_instance(head, chunks, snap.now) for head in snap.heads[:MAX_INSTANCES]]
    if group is not None:
        instances = [i for i in instances if i.group == group]
    truncated = len(snap.heads) > MAX_INSTANCES or any(i.status == "unread" for i in instances)
    s = snap.summary
    return SupervisionView(group, instances, truncated, s["keys"], s["heads"], s["chunks"],
                           snap.now)


__all__ = ["NAMESPACE", "Instance", "Pool", "SupervisionView", "supervision"]
