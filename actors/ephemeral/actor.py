"""EphemeralKeeper: the actor that owns this broker's ephemeral queues (queues.py).

Its task runs what time drives: when the earliest deadline (a lease's end, a queue's next
aged message) comes, a timer tells the actor, which runs what is due (leases redelivered or
dropped, aged messages dropped, parked pops of the groups concerned woken) and arms the next
one. ``EphemeralQueues.on_deadline`` brings an earlier deadline forward at once.

The data path (push, pop, ack, configure...) calls the keeper's ``EphemeralQueues``
directly from the HTTP handlers: each of its methods is synchronous, so a call is atomic on
the loop and the actor's own work never interleaves with it. The actor's one message is
``sweep``, what its timer sends; the unit tests call the queues as the data path does and
send ``sweep`` after moving their fake clock.
"""
from __future__ import annotations

import asyncio
from typing import Any

from actors.ephemeral.queues import EphemeralQueues
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
