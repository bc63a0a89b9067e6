"""Which broker owns an ephemeral queue: rendezvous (highest random weight) hashing over the
brokers alive now, so every broker that sees the same members picks the same owner without
a vote, and a change of members moves only the queues of the broker that came or went
(docs/ephemeral.md, "Ownership")."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable


def owner_of(members: Iterable[str], queue: str) -> str:
    """The server id, among ``members`` (never empty: this broker is one), that owns
    ``queue``: the highest score of (queue, server id); ties, which need a 64-bit hash
    collision, go to the greater id."""
    return max(members, key=lambda server_id: (_score(queue, server_id), server_id))


def _score(queue: str, server_id: str) -> int:
    digest = hashlib.blake2b(f"{queue}\x00{server_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
