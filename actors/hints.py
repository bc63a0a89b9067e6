"""What each hint does: the one place hints are made and read, on every
broker: it wakes this broker's parked pops itself, and with a mesh it also
tells the peers.

Hints are best-effort. Losing one costs latency, never correctness: a parked
pop re-checks on its backoff timer, the reconcile loop re-reads flags and
clears the config cache, the hot-list reseeds from PostgreSQL.

Sending: a committed push wakes local pops, marks the local hot-list and offers
its (queue, partition) pairs to the outgoing wake gate, which sends a
MESSAGE_AVAILABLE_BATCH at once for a queue's first wake and folds further ones
within the window into one at its end; an ack that released a lease
does the same for its partition (it may be claimable again); partitions that went from empty
to pending in the hot-list go out, coalesced, as HOTLIST_DIRTY_BATCH;
configure/delete send QUEUE_CONFIG_SET/DELETE with the name only;
maintenance flips send MAINTENANCE_MODE_SET / POP_MAINTENANCE_MODE_SET.

Receiving: the same effects locally, and never a re-broadcast. Received
wakes pass a per-queue gate (wake_gate.py), so a storm of wake frames cannot
become a storm of pop queries; received dirty marks are capped per hot-list
ring (hotlist.py), so naming partitions that do not exist costs nothing
lasting.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from loguru import logger

from actors.mesh import frames
from actors.mesh.wake_gate import WakeGate
from actors.reconciler import MaintenanceFlags, QueueConfigCache

# The dirty flusher sends at once after a quiet spell, then at most once per interval: under
# a steady load each peer gets up to 20 frames a second, not one per commit (every frame is a
# socket write here, a read, MAC check and decode there).
DIRTY_FLUSH_INTERVAL_S = 0.05
DIRTY_BATCH_MAX = 1000
# Most (queue, partition) items per wake frame: a push of many partitions
# goes out as several frames, each well under QUEEN_MESH_MAX_FRAME_BYTES.
WAKE_BATCH_MAX = 1000


class Hints:
    def __init__(self, *, waiters: Any, cache: QueueConfigCache, flags: MaintenanceFlags,
                 hotlist: Any | None = None, mesh: Any | None = None):
        self._waiters = waiters      # PopWaiterRegistry proxy
        self._cache = cache
        self._flags = flags
        self._hotlist = hotlist      # HotList proxy, or None
        self.mesh = mesh             # Mesh, or None when no peers / sync disabled
        self._flusher: asyncio.Task | None = None
        self._marked = asyncio.Event()  # a local push marked the hot-list: dirty hints to send
        self.remote_wakes = WakeGate(self._waiters.wake_many)
        # The same gate on the way out: each peer passes the wakes it receives through its
        # own gate (above), which lets one through per queue per window and folds the rest
        # into one at the window's end; so a frame per commit (hundreds a second, each a
        # socket write here and a read, MAC and decode there) wakes no pop sooner than one
        # frame at the start of the window and one at its end. Local pops are woken at once.
        self.sent_wakes = WakeGate(self._send_wakes)

    # -- sending ------------------------------------------------------------
    def pushed(self, pairs: list[tuple[str, str]]) -> None:
        """After a committed push (never a spooled one)."""
        if self._hotlist is not None:
            self._hotlist.mark_many(pairs)
            # after the mark: the flusher's drain comes behind it in the hot-list's inbox
            self._marked.set()
        self._broadcast_wake(pairs)

    def released(self, leases: list[tuple[str, str, str]]) -> None:
        """After an ack (or nack) released a group's lease on (queue, group,
        partition): the partition is claimable again if it holds more messages,
        so the hot-list gets it back and pops parked on it here and on the
        peers try it now, not at their next backoff re-check."""
        if self._hotlist is not None:
            for queue, group, partition in leases:
                self._hotlist.ack_released(queue, group, partition)
        # Locally only the releasing group's pops: another group's lease and cursor on the
        # partition did not move, so a pop of it woken here would claim nothing new. (The
        # peers get the pairs alone; their gate lets few of them through.)
        by_group: dict[str, list[tuple[str, str]]] = {}
        for queue, group, partition in leases:
            by_group.setdefault(group, []).append((queue, partition))
        for group, pairs in by_group.items():
            self._waiters.wake_many(pairs, group)
        if self.mesh is not None:
            self.sent_wakes.offer([(queue, partition) for queue, _group, partition in leases])

    def _broadcast_wake(self, pairs: list[tuple[str, str]]) -> None:
        self._waiters.wake_many(pairs)
        if self.mesh is not None:
            self.sent_wakes.offer(pairs)

    def _send_wakes(self, pairs: list[tuple[str, str | None]]) -> None:
        if self.mesh is None:
            return
        unique = list(dict.fromkeys(pairs))
        for i in range(0, len(unique), WAKE_BATCH_MAX):
            self.mesh.broadcast(frames.MESSAGE_AVAILABLE_BATCH, {"items": [
                {"queue": q, "partition": p} if p is not None else {"queue": q}
                for q, p in unique[i:i + WAKE_BATCH_MAX]]})

    def queue_config_changed(self, queue: str, *, deleted: bool) -> None:
        self._cache.forget(queue)
        if deleted and self._hotlist is not None:
            self._hotlist.forget_queue(queue)
        if self.mesh is not None:
            kind = frames.QUEUE_CONFIG_DELETE if deleted else frames.QUEUE_CONFIG_SET
            self.mesh.broadcast(kind, {"queue": queue})

    def maintenance_changed(self, which: str, enabled: bool) -> None:
        if self.mesh is not None:
            kind = frames.MAINTENANCE_MODE_SET if which == "push" else frames.POP_MAINTENANCE_MODE_SET
            self.mesh.broadcast(kind, {"enabled": enabled})

    def start_dirty_flusher(self) -> None:
        if self.mesh is not None and self._hotlist is not None and self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_dirty(),
                                                                    name="hotlist-dirty")

    async def stop(self) -> None:
        self.remote_wakes.stop()
        self.sent_wakes.stop()
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def _flush_dirty(self) -> None:
        # Coalesced: a partition pushed a thousand times within one window costs one hint.
        hotlist, mesh = self._hotlist, self.mesh
        assert hotlist is not None and mesh is not None  # see start_dirty_flusher
        # Only local pushes make dirty hints (pushed() marks): the flusher sleeps until one
        # comes, instead of asking the hot-list for nothing a hundred times a second.
        while True:
            await self._marked.wait()
            self._marked.clear()
            try:
                dirty = await hotlist.drain_dirty(DIRTY_BATCH_MAX)
            except Exception:  # the hot-list stopped (shutdown)
                return
            if len(dirty) >= DIRTY_BATCH_MAX:
                self._marked.set()  # more than a frame's worth: the rest after the pause
            if dirty:
                mesh.broadcast(frames.HOTLIST_DIRTY_BATCH,
                                    {"items": [{"queue": q, "partition": p} for q, p in dirty]})
                await asyncio.sleep(DIRTY_FLUSH_INTERVAL_S)  # what comes meanwhile: one frame

    # -- receiving ----------------------------------------------------------
    def on_frame(self, kind: int, payload: dict, sender: str) -> None:
        if kind == frames.MESSAGE_AVAILABLE:
            self._wake(_pairs([payload]))
        elif kind == frames.MESSAGE_AVAILABLE_BATCH:
            self._wake(_pairs(payload.get("items")))
        elif kind == frames.HOTLIST_DIRTY_BATCH:
            pairs = _pairs(payload.get("items"))
            if pairs and self._hotlist is not None:
                self._hotlist.mark_many(pairs, remote=True)
            self._wake(pairs)
        elif kind in (frames.QUEUE_CONFIG_SET, frames.QUEUE_CONFIG_DELETE):
            queue = payload.get("queue")
            if isinstance(queue, str) and queue:
                self._cache.forget(queue)
                if kind == frames.QUEUE_CONFIG_DELETE and self._hotlist is not None:
                    self._hotlist.forget_queue(queue)
        elif kind in (frames.MAINTENANCE_MODE_SET, frames.POP_MAINTENANCE_MODE_SET):
            # The sender already persisted the flag; we only mirror it.
            which = "push" if kind == frames.MAINTENANCE_MODE_SET else "pop"
            self._flags.set(which, payload.get("enabled") is True, f"mesh hint from {sender}")
        else:
            logger.debug("mesh: ignoring frame type {} from {}", kind, sender)

    def _wake(self, pairs: list[tuple[str, str | None]]) -> None:
        if pairs:
            self.remote_wakes.offer(pairs)


def _pairs(items: Iterable[Any] | None) -> list[tuple[str, str | None]]:
    """(queue, partition) pairs of a hint (partition None: any partition of the
    queue); items without a queue name are skipped."""
    out = []
    for item in items or ():
        if not isinstance(item, dict):
            continue
        queue, partition = item.get("queue"), item.get("partition")
        if isinstance(queue, str) and queue:
            out.append((queue, partition if isinstance(partition, str) and partition else None))
    return out
