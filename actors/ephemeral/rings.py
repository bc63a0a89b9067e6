"""One ring per (queue, partition): the messages in push order, and one cursor per consumer
group over them (docs/ephemeral.md §4).

A ring holds ``(text, size, at)`` entries: the payload as JSON text (the pop answer splices it
in as it is), its size in bytes, and the keeper's clock at the push. Positions (``seq``) are
dense: entries leave only from the head (freed once every cursor passed them, or dropped by a
bound), so the entry at ``seq`` is ``entries[off + seq - head]``. The list keeps its freed
slots (set to None) until they are half of it, then is compacted: O(1) per message either
way.

A cursor is one group's view of one ring:

* ``next``: the first position never delivered to the group;
* ``attempts``: position -> deliveries so far, for every position delivered and not done
  (under a lease, or waiting for redelivery). Positions enter in ascending order (``next``
  only grows) and only ever leave, so the dict's first key is the group's lowest open
  position: ``floor()`` is O(1);
* ``leased``: position -> the lease that holds it now (a subset of ``attempts``);
* ``retry``: a min-heap of positions waiting for redelivery (lease expired, failed or retry
  ack); it may hold positions since done or dropped, skipped when popped.

Nothing here knows about queues, budgets or time: the keeper (queues.py) does.
"""
from __future__ import annotations

import heapq
from typing import Any

Entry = tuple[str, int, float]  # payload JSON text, its bytes, push time (keeper's clock)
Delivery = tuple[str, str, str, int]  # id, partition as JSON, payload JSON text, attempts

_COMPACT_AT = 1024


class Lease:
    """One delivered batch of one group: its deadline and what it holds. An item stays in
    ``items`` after its ack; a cursor's ``leased`` says whether this lease still holds it."""

    __slots__ = ("deadline", "items")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.items: list[tuple[Ring, Cursor, int]] = []


class Cursor:
    __slots__ = ("attempts", "group", "leased", "next", "retry")

    def __init__(self, group: str, start: int) -> None:
        self.group = group
        self.next = start
        self.attempts: dict[int, int] = {}
        self.leased: dict[int, Lease] = {}
        self.retry: list[int] = []

    def floor(self) -> int:
        """The group's lowest position not done yet."""
        return next(iter(self.attempts)) if self.attempts else self.next

    def waiting(self) -> int:
        """Positions delivered, not leased now, not done: due for redelivery."""
        return len(self.attempts) - len(self.leased)


class Ring:
    __slots__ = ("bytes", "cursors", "entries", "head", "id_prefix", "no", "off", "partition",
                 "partition_json", "queue")

    def __init__(self, queue: str, partition: str, partition_json: str, no: int,
                 incarnation: str) -> None:
        self.queue = queue
        self.partition = partition
        self.partition_json = partition_json
        self.no = no
        self.id_prefix = f"{incarnation}-{no}-"
        self.entries: list[Any] = []
        self.off = 0
        self.head = 0
        self.bytes = 0
        self.cursors: dict[str, Cursor] = {}

    @property
    def size(self) -> int:
        return len(self.entries) - self.off

    @property
    def tail(self) -> int:
        """The position the next push gets."""
        return self.head + len(self.entries) - self.off

    def oldest_at(self) -> float | None:
        return self.entries[self.off][2] if self.off < len(self.entries) else None

    def cursor(self, group: str) -> Cursor:
        """The group's cursor, created at the oldest message the ring holds now."""
        cursor = self.cursors.get(group)
        if cursor is None:
            cursor = self.cursors[group] = Cursor(group, self.head)
        return cursor

    def available(self, group: str) -> int:
        cursor = self.cursors.get(group)
        if cursor is None:
            return self.size
        return self.tail - cursor.next + cursor.waiting()

    def take(self, cursor: Cursor, k: int, out: list[Delivery], lease: Lease | None) -> int:
        """Deliver up to ``k`` positions to ``cursor``'s group, redeliveries first (lowest
        position first), then new ones in order; under ``lease``, or done at once without one
        (commit on delivery). Appends to ``out``; answers how many."""
        entries, off, head, prefix = self.entries, self.off, self.head, self.id_prefix
        attempts, leased, retry = cursor.attempts, cursor.leased, cursor.retry
        taken = 0
        while taken < k and retry:
            seq = heapq.heappop(retry)
            if seq < head or seq in leased or seq not in attempts:
                continue  # done or dropped since it was queued for redelivery
            n = attempts[seq] + 1
            if lease is None:
                del attempts[seq]
            else:
                attempts[seq] = n
                leased[seq] = lease
                lease.items.append((self, cursor, seq))
            out.append((f"{prefix}{seq}", self.partition_json, entries[off + seq - head][0], n))
            taken += 1
        seq, tail = cursor.next, head + len(entries) - off
        while taken < k and seq < tail:
            if lease is not None:
                attempts[seq] = 1
                leased[seq] = lease
                lease.items.append((self, cursor, seq))
            out.append((f"{prefix}{seq}", self.partition_json, entries[off + seq - head][0], 1))
            seq += 1
            taken += 1
        cursor.next = seq
        return taken

    def append(self, items: list[Entry], nbytes: int) -> None:
        self.entries.extend(items)
        self.bytes += nbytes

    def drop_head(self, n: int) -> tuple[int, int]:
        """Remove the ``n`` oldest entries, whoever has not finished them: cursors behind
        move to the new head, and their open positions below it are forgotten. Answers
        (messages, bytes) removed."""
        n = min(n, self.size)
        if n <= 0:
            return 0, 0
        entries, off = self.entries, self.off
        freed = 0
        for i in range(off, off + n):
            freed += entries[i][1]
            entries[i] = None
        self.off = off + n
        self.head += n
        self.bytes -= freed
        if self.off >= _COMPACT_AT and self.off * 2 >= len(entries):
            del entries[:self.off]
            self.off = 0
        head = self.head
        for cursor in self.cursors.values():
            if cursor.next < head:
                cursor.next = head
            attempts, leased = cursor.attempts, cursor.leased
            while attempts:
                seq = next(iter(attempts))
                if seq >= head:
                    break
                del attempts[seq]
                leased.pop(seq, None)
            retry = cursor.retry
            while retry and retry[0] < head:
                heapq.heappop(retry)
        return n, freed

    def free_done(self) -> tuple[int, int]:
        """Free the entries every cursor of the ring has done (acknowledged, committed on
        delivery, or dropped for the group). A ring without cursors frees nothing: its
        messages wait for a first consumer (or a bound)."""
        if not self.cursors:
            return 0, 0
        floor = min(cursor.floor() for cursor in self.cursors.values())
        return self.drop_head(floor - self.head) if floor > self.head else (0, 0)

    def expired(self, cutoff: float) -> int:
        """How many head entries were pushed at or before ``cutoff``."""
        entries, i, end = self.entries, self.off, len(self.entries)
        while i < end and entries[i][2] <= cutoff:
            i += 1
        return i - self.off
