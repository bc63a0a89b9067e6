"""Queues on the wire: configure (docs/wire-contract.md §9) and the queue resources' answers
(§10.1, §10.2), whose per-partition message figures the status routes show too (§14.3)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from broker.core.errors import BadRequest
from broker.core.times import iso_milli
from broker.http.wire.common import body_object, required_name
from broker.store.sql import QUEUE_OPTIONS

# -- configure ------------------------------------------------------------------------------


def parse_configure(body: Any) -> tuple[str, str | None, str | None, dict[str, Any]]:
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
    return queue, namespace, task, options


def configure_answer(row: Mapping[str, Any]) -> dict:
    return {
        "configured": True,
        "queueId": str(row["id"]),
        "partitionId": str(row["default_partition_id"]),
        "queue": row["name"],
        "namespace": row["namespace"],
        "task": row["task"],
        "options": queue_options(row),
    }


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
