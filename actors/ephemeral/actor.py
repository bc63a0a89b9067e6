"""EphemeralKeeper: the actor that owns this broker's ephemeral queues (queues.py).

Its task runs what time drives: when the earliest deadline (a lease's end, a queue's next
aged message) comes, a timer tells the actor, which runs what is due (leases redelivered or
dropped, aged messages dropped, parked pops of the groups concerned woken) and arms the next
one. ``EphemeralQueues.on_deadline`` brings an earlier deadline forward at once.

The data path (push, pop, ack) calls the keeper's ``EphemeralQueues`` directly from the HTTP
handlers: each of its methods is synchronous, so a call is atomic on the loop and the
actor's own work never interleaves with it. The same operations are the actor's messages too
(``proxy().push(...)``), which is how the unit tests drive it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from actors.ephemeral.options import QueueOptions
from actors.ephemeral.queues import EphemeralQueues, PushVerdict, QueueFigures
from actors.ephemeral.rings import Delivery
from actors.runtime import AsyncioActor

_SWEEP = "sweep"


class EphemeralKeeper(AsyncioActor):
    def __init__(self, queues: EphemeralQueues) -> None:
        super().__init__()
        self.queues = queues
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def on_start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.queues.on_deadline = self._arm
        self._arm_next()

    def on_stop(self) -> None:
        self.queues.on_deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def on_receive(self, message: Any) -> None:
        if message == _SWEEP:
            self.sweep()

    def _arm(self, when: float) -> None:
        if self._loop is None or (self._armed_at is not None and self._armed_at <= when):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self._loop.call_later(max(0.0, when - self.queues.clock()), self._fire)

    def _fire(self) -> None:
        self._timer = self._armed_at = None
        self.actor_ref.tell(_SWEEP)

    def _arm_next(self) -> None:
        when = self.queues.next_deadline()
        if when is not None:
            self._arm(when)

    # -- messages -----------------------------------------------------------------------
    def sweep(self) -> int:
        """Run what is due now; answers how many deadlines ran."""
        ran = self.queues.sweep()
        self._arm_next()
        return ran

    def configure(self, queue: str, options: QueueOptions) -> QueueOptions:
        return self.queues.configure(queue, options)

    def load(self, declared: Iterable[tuple[str, QueueOptions]]) -> int:
        return self.queues.load(declared)

    def push(self, queue: str, partition: str, items: Sequence[tuple[str, int]]) -> PushVerdict:
        return self.queues.push(queue, partition, items)

    def take(self, queue: str, group: str, partition: str | None, batch: int,
             auto_ack: bool = False) -> list[Delivery]:
        return self.queues.take(queue, group, partition, batch, auto_ack)

    def available(self, queue: str, group: str, partition: str | None = None) -> int:
        return self.queues.available(queue, group, partition)

    def ack(self, queue: str, group: str,
            acks: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
        return self.queues.ack(queue, group, acks)

    def reset(self, queue: str) -> int:
        return self.queues.reset(queue)

    def delete(self, queue: str) -> bool:
        return self.queues.delete(queue)

    def depth(self, queue: str) -> QueueFigures | None:
        return self.queues.depth(queue)

    def figures(self) -> dict[str, Any]:
        return self.queues.figures()
