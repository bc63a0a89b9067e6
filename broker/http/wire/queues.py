"""Queues on the wire: configure (docs/wire-contract.md §9) and the queue resources' answers
(§10.1, §10.2), whose per-partition message figures the status routes show too (§14.3)."""
from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.core.errors import BadRequest
from broker.core.times import iso_milli
from broker.http.wire.common import body_object, required_name
from broker.service.queues import QUEUE_OPTIONS

# -- configure ------------------------------------------------------------------------------

_DLQ_ALWAYS = ("a message that failed retryLimit times goes to the dead-letter queue; "
               "false is not stored")
# Options whose behaviour is always on: false would store a falsehood, so it is not stored
# (answered ignored) and the queue keeps true.
_ALWAYS_ON = ("deadLetterQueue", "dlqAfterMaxRetries")

OPTION_EFFECTS: dict[str, tuple[str, str]] = {
    "priority": ("stored", "shown in listings; pops do not order queues by priority"),
    "leaseTime": ("applied", "seconds a popped batch stays leased (0: 60)"),
    "retryLimit": ("applied", "failed acks before a message is dead-lettered"),
    "retryDelay": ("applied", "milliseconds before a failed batch is delivered again to "
                              "that consumer group (0: at once)"),
    "maxSize": ("applied", "a push that would take the queue's depth (messages some consumer "
                           "has not finished, and staged ones) past it is refused (0: none)"),
    "ttl": ("stored", "messages do not expire by ttl (retentionSeconds with "
                      "retentionEnabled, or maxWaitTimeSeconds, delete old messages)"),
    "deadLetterQueue": ("fixed", _DLQ_ALWAYS),
    "dlqAfterMaxRetries": ("fixed", _DLQ_ALWAYS),
    "delayedProcessing": ("applied", "seconds a message stays invisible after its push"),
    "windowBuffer": ("applied", "a partition is handed out once its newest message is this "
                                "many seconds old"),
    "retentionSeconds": ("applied", "messages older than this are deleted, consumed or not; "
                                    "needs retentionEnabled"),
    "completedRetentionSeconds": ("applied", "messages older than this are deleted once every "
                                             "consumer passed them; needs retentionEnabled"),
    "retentionEnabled": ("applied", "switches the two retention ages on"),
    "encryptionEnabled": ("applied", "payloads stored encrypted; needs QUEEN_ENCRYPTION_KEY "
                                     "on the broker"),
    "maxWaitTimeSeconds": ("applied", "messages older than this that some consumer has not "
                                      "taken are deleted (never dead-lettered)"),
}
"""What this broker does with each queue option: ``applied``, ``stored`` (kept and shown,
nothing acts on it) or ``fixed`` (the behaviour is always on), with a line saying how."""


@dataclass(frozen=True)
class ConfigureRequest:
    queue: str
    namespace: str | None
    task: str | None
    options: dict[str, Any]   # the known options sent (not null), checked, by wire name
    sent: dict[str, Any]      # every option as sent, unknown names included


def parse_configure(body: Any) -> ConfigureRequest:
    body = body_object(body)
    queue = required_name(body.get("queue"), "queue is required")
    namespace = body.get("namespace") if isinstance(body.get("namespace"), str) else None
    task = body.get("task") if isinstance(body.get("task"), str) else None
    raw = body.get("options") or {}
    if not isinstance(raw, dict):
        raise BadRequest("options must be an object")
    options: dict[str, Any] = {}
    for name, _col, typ, _default in QUEUE_OPTIONS:
        if name not in raw or raw[name] is None:
            continue
        value = raw[name]
        if typ == "boolean":
            if not isinstance(value, bool):
                raise BadRequest(f"options.{name} must be a boolean")
            if name in _ALWAYS_ON and value is False:
                continue
        else:
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value != int(value)):
                raise BadRequest(f"options.{name} must be an integer")
            value = int(value)
            # priority is an ordering (the reference takes any integer, a "low" one may be
            # negative); every other integer option is a count or a duration.
            lowest = -(2**31) if name == "priority" else 0
            if value < lowest or value > 2**31 - 1:
                raise BadRequest(f"options.{name} must be between {lowest} and {2**31 - 1}")
        options[name] = value
    return ConfigureRequest(queue, namespace, task, options, raw)


def ignored_options(req: ConfigureRequest, row: Mapping[str, Any], encryption_key: bool
                    ) -> dict[str, str]:
    """The options of a configure this broker accepted but does not act on, each with a
    warning, in the order sent: unknown names, and known ones whose value asks for what
    this broker does not do (a value saying what it does anyway, e.g. priority 0, is not
    listed). ``row``: the queue as stored after the configure."""
    out: dict[str, str] = {}
    for name in req.sent:
        if name not in OPTION_EFFECTS:
            near = difflib.get_close_matches(name, OPTION_EFFECTS, n=1)
            out[name] = (f"{name}: unknown option, ignored"
                         + (f" (did you mean {near[0]}?)" if near else ""))
            continue
        if name in _ALWAYS_ON and req.sent[name] is False:
            out[name] = f"{name}: dead-lettering is always on: {_DLQ_ALWAYS}"
            continue
        value = req.options.get(name)
        if value is None:
            continue
        if name in ("priority", "ttl") and value != 0:
            out[name] = f"{name}: stored only; {OPTION_EFFECTS[name][1]}"
        elif (name in ("retentionSeconds", "completedRetentionSeconds") and value > 0
              and not row["retention_enabled"]):
            out[name] = f"{name}: no effect while retentionEnabled is false"
        elif name == "encryptionEnabled" and value is True and not encryption_key:
            out[name] = ("encryptionEnabled: QUEEN_ENCRYPTION_KEY is not set on this broker, "
                         "so payloads are stored in clear")
    return out


def configure_answer(row: Mapping[str, Any], req: ConfigureRequest | None = None,
                     ignored: Mapping[str, str] | None = None) -> dict:
    """§9's answer, plus what became of the options sent: ``applied`` (names), ``ignored``
    (names accepted but not acted on) and ``warnings`` (one line per ignored name)."""
    ignored = ignored or {}
    return {
        "configured": True,
        "queueId": str(row["id"]),
        "partitionId": str(row["default_partition_id"]),
        "queue": row["name"],
        "namespace": row["namespace"],
        "task": row["task"],
        "options": queue_options(row),
        "applied": [n for n in (req.options if req else ()) if n not in ignored],
        "ignored": list(ignored),
        "warnings": list(ignored.values()),
    }


def supported_options() -> list[dict]:
    """Every queue option with its type, default and what this broker does with it (the
    dashboard's configuration form)."""
    return [{"name": name, "type": typ, "default": default,
             "effect": OPTION_EFFECTS[name][0], "note": OPTION_EFFECTS[name][1]}
            for name, _col, typ, default in QUEUE_OPTIONS]


# -- queue resources ------------------------------------------------------------------------

def queue_summary(row: Mapping[str, Any]) -> dict:
    """One queue of a listing (``GET /api/v1/resources/queues``, ``/api/v1/status/queues``)."""
    return {
        "id": str(row["id"]), "name": row["name"], "namespace": row["namespace"],
        "task": row["task"], "priority": row["priority"], "createdAt": iso_milli(row["created_at"]),
        "partitions": row["partitions"],
        "messages": {"total": row["total"], "pending": row["pending"],
                     "processing": row["processing"], "completed": row["completed"],
                     "deadLetter": row["dead_letter"]},
    }


FIGURES = ("total", "pending", "processing", "completed", "failed", "deadLetter")


def partition_figures(row: Mapping[str, Any]) -> dict:
    """A partition's message figures (store/figures_sql.py), as the queue detail and the
    queue status show them: ``failed`` and ``deadLetter`` are both its dead-lettered count."""
    return {"total": row["total"], "pending": row["pending"], "processing": row["processing"],
            "completed": row["completed"], "failed": row["dead_letter"],
            "deadLetter": row["dead_letter"]}


def figure_totals(figures: Iterable[Mapping[str, int]]) -> dict:
    """The queue's figures: its partitions' added up."""
    totals = dict.fromkeys(FIGURES, 0)
    for one in figures:
        for k in FIGURES:
            totals[k] += one[k]
    return totals


def queue_detail(queue: Mapping[str, Any], partitions: list[Mapping[str, Any]]) -> dict:
    """``GET /api/v1/resources/queues/{queue}`` (§10.2)."""
    figures = [partition_figures(p) for p in partitions]
    return {"id": str(queue["id"]), "name": queue["name"], "namespace": queue["namespace"],
            "task": queue["task"], "createdAt": iso_milli(queue["created_at"]),
            "options": queue_options(queue),
            "partitions": [{"id": str(p["id"]), "name": p["name"],
                            "createdAt": iso_milli(p["created_at"]), "stats": stats,
                            "oldestMessage": iso_milli(p["oldest"]),
                            "newestMessage": iso_milli(p["newest"])}
                           for p, stats in zip(partitions, figures)],
            "totals": figure_totals(figures)}


def queue_options(row: Mapping[str, Any]) -> dict:
    """A queue's options by their wire names (configure, queue detail, browse)."""
    return {name: row[col] for name, col, _typ, _default in QUEUE_OPTIONS}
