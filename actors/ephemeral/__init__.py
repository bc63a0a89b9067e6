"""Ephemeral (RAM-class) queues of this broker (docs/ephemeral.md): contents in RAM only,
surviving nothing; their configuration is durable (``queen.ephemeral_queues``, read at start
and written on configure by broker/service/ephemeral.py). One module per job:

  options.py   the seven knobs of configure: defaults, bounds, the parser (wire and rows)
  rings.py     Ring: one (queue, partition) in push order; Cursor: one group's view of it;
               Lease: one delivered batch
  gate.py      Gate: parked long polls per queue and group, woken by pushes and redeliveries
  queues.py    EphemeralQueues: every queue, bounds and the global budget, ids, leases and
               their expiry, ages, counters, figures; synchronous, never awaits
  actor.py     EphemeralKeeper: the actor owning an EphemeralQueues; its timer runs what is due

Why the HTTP handlers call EphemeralQueues directly rather than through the actor's proxy: a
proxy round trip measured ~25 µs on an idle loop (more on a busy one, being a task switch),
against ~0.2 µs for the call itself, and a whole ephemeral push is a few hundred µs of
handler; the target is five times the durable push. Every method is synchronous, so a call
is atomic on the event loop, exactly as a message would be.
"""
from actors.ephemeral.actor import EphemeralKeeper
from actors.ephemeral.options import DEFAULTS, QueueOptions
from actors.ephemeral.queues import EphemeralQueues, PushVerdict, QueueFigures

__all__ = ["DEFAULTS", "EphemeralKeeper", "EphemeralQueues", "PushVerdict", "QueueFigures",
           "QueueOptions"]
