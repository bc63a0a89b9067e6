"""A transaction's riders on the wire (docs/wire-contract.md §7): the ``kv`` and ``timers``
arrays of ``POST /api/v1/transaction`` (coded 400s: kv_*, timers_*), and their elements of
the answer, which follow the operations' (the append-only layout)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.http.wire.common import array_field
from broker.http.wire.kv import KV_MAX_OPS, parse_kv_op
from broker.http.wire.timers import TIMER_MAX_OPS, parse_timer_op
from broker.service.kv import KvOp
from broker.service.riders import Riders
from broker.service.timers import TimerOp


def parse_riders(body: Mapping[str, Any]) -> tuple[list[KvOp], list[TimerOp]]:
    """The ``kv`` and ``timers`` arrays of POST /api/v1/transaction (absent: none)."""
    kv_raw = body.get("kv")
    timers_raw = body.get("timers")
    kv_ops = [] if kv_raw is None else [
        parse_kv_op(raw, f"kv[{n}]", in_transaction=True)
        for n, raw in enumerate(array_field(body, "kv", KV_MAX_OPS, code="kv_bad_request",
                                            allow_empty=True))]
    timer_ops = [] if timers_raw is None else [
        parse_timer_op(raw, f"timers[{n}]")
        for n, raw in enumerate(array_field(body, "timers", TIMER_MAX_OPS,
                                            code="timers_bad_request", allow_empty=True))]
    return kv_ops, timer_ops


def rider_results(start: int, kv_results: list[dict], timer_results: list[dict]) -> list[dict]:
    """The riders' elements after the operations' (the append-only layout): ``start`` is
    the index of the first."""
    return ([{"index": start + n, "type": "kv", **r} for n, r in enumerate(kv_results)]
            + [{"index": start + len(kv_results) + n, "type": "timer", **r}
               for n, r in enumerate(timer_results)])


def riders_rolled_back(start: int, riders: Riders) -> list[dict]:
    """The riders' elements of a transaction that was rolled back: none applied."""
    return rider_results(
        start, [{"op": op.op, "ns": op.ns, "key": op.key, "applied": False,
                 "reason": "rolled_back"} for op in riders.kv_ops],
        timers_not_applied(riders, "rolled_back"))


def timers_not_applied(riders: Riders, status: str) -> list[dict]:
    """The timer riders' results when they did not run or were rolled back."""
    return [{"op": op.op, "queue": op.queue, "timerKey": op.timer_key, "ok": False,
             "status": status} for op in riders.timer_ops]
