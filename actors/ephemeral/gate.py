"""The RAM gate long polls park on (docs/ephemeral.md §5): parked pops per queue and group, in
arrival order. A push wakes, per group, the longest-waiting pop whose partition filter takes
the pushed partition; a redelivery (lease expired, failed ack) wakes one of its group. No
timer re-checks anything: a parked pop wakes on a push, on its window or on its deadline.

A woken pop that took messages and sees more left for its group wakes the next one (the
service passes the wake on), and so does one that leaves with a wake it did not use, so a
wake is never lost and never wakes the whole herd."""
from __future__ import annotations

import asyncio
from collections import deque


class Waiter:
    __slots__ = ("future", "group", "partition")

    def __init__(self, future: asyncio.Future[None], group: str, partition: str | None) -> None:
        self.future = future
        self.group = group
        self.partition = partition


class Gate:
    def __init__(self) -> None:
        self.parked: dict[str, dict[str, deque[Waiter]]] = {}
        self.woken = 0
        self.closed = False  # the broker is stopping: nothing waits any more

    def park(self, queue: str, group: str, partition: str | None) -> Waiter:
        waiter = Waiter(asyncio.get_running_loop().create_future(), group, partition)
        if self.closed:
            waiter.future.set_result(None)
        self.parked.setdefault(queue, {}).setdefault(group, deque()).append(waiter)
        return waiter

    def close(self) -> int:
        """The broker is stopping: wake every parked pop (and any that parks from now on),
        so each answers what there is at once (service/ephemeral.py) instead of holding
        the HTTP server's graceful stop. Answers how many were parked."""
        self.closed = True
        parked = 0
        for groups in self.parked.values():
            for line in groups.values():
                for waiter in line:
                    parked += 1
                    if not waiter.future.done():
                        waiter.future.set_result(None)
        return parked

    def unpark(self, queue: str, waiter: Waiter) -> None:
        groups = self.parked.get(queue)
        line = groups.get(waiter.group) if groups else None
        if line is None:
            return
        try:
            line.remove(waiter)
        except ValueError:
            return
        if not line:
            del groups[waiter.group]  # type: ignore[union-attr]
            if not groups:
                del self.parked[queue]

    def wake(self, queue: str, partition: str | None, group: str | None = None) -> int:
        """Wake, in each group (or only ``group``), the longest-parked pop that is not woken
        yet and takes ``partition`` (None: any). Answers how many were woken."""
        groups = self.parked.get(queue)
        if not groups:
            return 0
        lines = groups.values() if group is None else [groups[group]] if group in groups else []
        woken = 0
        for line in lines:
            for waiter in line:
                if waiter.future.done():
                    continue
                if partition is None or waiter.partition is None or waiter.partition == partition:
                    waiter.future.set_result(None)
                    woken += 1
                    break
        self.woken += woken
        return woken

    def count(self) -> int:
        return sum(len(line) for groups in self.parked.values() for line in groups.values())
