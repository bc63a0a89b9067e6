"""What this broker's spool holds, per partition, as the push service reads it.

Sticky failover (docs/behaviour.md §5.4): while this spool holds events of a
(queue, partition) that are not uploaded yet, the push service
(broker/service/push.py) sends that partition's new pushes to the spool as well,
so they are staged after the older ones and the partition keeps the order its
pushes were acknowledged in. The counts only drop once a file's upload committed
(or when events are quarantined: they leave the order chain).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from actors.spool.records import Pair, event_pair

__all__ = ["SpoolBacklog"]


class SpoolBacklog:
    """Spooled-but-not-uploaded events per (queue, partition).

    A plain object read synchronously by the push service (one event loop, so
    no locks): ``holds(pairs)`` says whether a push to any of those partitions
    must queue behind the spool. Only the spool changes the counts.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[Pair, int] = {}

    def holds(self, pairs: Iterable[tuple[str, str]]) -> bool:
        """True if any (queue, partition) of ``pairs`` has events waiting."""
        counts = self._counts
        if not counts:
            return False
        return any((queue, partition or "Default") in counts for queue, partition in pairs)

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        self.add_counts(Counter(event_pair(e) for e in events))

    def remove(self, events: Iterable[Mapping[str, Any]]) -> None:
        self.remove_counts(Counter(event_pair(e) for e in events))

    def add_counts(self, counts: Mapping[Pair, int]) -> None:
        for pair, n in counts.items():
            if n > 0:
                self._counts[pair] = self._counts.get(pair, 0) + n

    def remove_counts(self, counts: Mapping[Pair, int]) -> None:
        """Never below zero; a pair reaching zero is dropped."""
        for pair, n in counts.items():
            have = self._counts.get(pair)
            if have is None or n <= 0:
                continue
            if have > n:
                self._counts[pair] = have - n
            else:
                del self._counts[pair]

    def count(self, queue: str, partition: str | None = "Default") -> int:
        return self._counts.get((queue, partition or "Default"), 0)

    def total(self) -> int:
        return sum(self._counts.values())

    def partitions(self) -> int:
        """How many (queue, partition) pairs are held."""
        return len(self._counts)

    def clear(self) -> None:
        self._counts.clear()

    def __repr__(self) -> str:
        return f"<SpoolBacklog partitions={len(self._counts)} events={self.total()}>"
