"""The domain's value types, shared by the wire, the services and the store."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

# The consumer group of a pop or ack that names none: queue mode, one shared cursor.
QUEUE_MODE = "__QUEUE_MODE__"


# slots, not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, ~5x the cost, paid per pushed item or ack; never mutated.
@dataclass(slots=True)
class AckRow:
    transaction_id: str
    partition_id: str
    status: str
    error: str | None
    consumer_group: str
    lease_id: str | None


@dataclass(slots=True)  # not frozen: see AckRow
class PushItem:
    queue: str
    partition: str
    payload: Any
    transaction_id: str
    trace_id: str | None
    payload_json: str | None = None  # the payload serialized once, checked storable


@dataclass(slots=True)  # not frozen: see AckRow
class PushRow:
    """One item of a push, validated and ready to insert."""
    queue: str
    partition: str
    message_id: str
    transaction_id: str
    trace_id: str | None
    payload: Any
    encrypted: bool = False
    producer_sub: str | None = None
    payload_json: str | None = None  # ``payload`` already serialized (and checked)
    # The client push request this item came in: its items of a queue with maxSize are
    # admitted or refused together. None: not checked (an acknowledged push replayed, a
    # timer delivered, a dead letter retried: they must not be lost).
    request: int | None = None



@dataclass(frozen=True)
class PopRequest:
    queue: str | None
    partition: str | None
    namespace: str | None
    task: str | None
    group: str
    batch: int
    max_partitions: int
    wait: bool
    timeout_ms: int
    auto_ack: bool
    subscription_mode: str | None   # 'new' | 'timestamp' | None (all)
    subscription_from: dt.datetime | None
    # autopilot=true (docs/wire-contract.md §5.8): the answer echoes the sizing; the
    # knobs the client left to the broker (``batch`` / ``max_partitions`` then hold the
    # defaults until the service sizes the pop)
    autopilot: bool = False
    autopilot_batch: bool = False
    autopilot_partitions: bool = False
    # frames=true (docs/wire-contract.md §5.9): messages found are answered as QPF1 frames,
    # each payload copied as its stored JSON text
    frames: bool = False
    # conflation=true (docs/wire-contract.md §5.8): this consumer declares last-value delivery
    conflation: bool = False
