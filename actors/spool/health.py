"""Whether PostgreSQL takes this spool's uploads, as the drain sees it.

Shared by the upload (:mod:`actors.spool.upload`) and the registration
(:mod:`actors.spool.order`): a transient failure (PostgreSQL unreachable, busy,
a serialization failure or deadlock) keeps the file where it is and stops the
cycle; after ``cooldown_after`` of them in a row the drain rests ``cooldown_s``
(docs/behaviour.md §5.5). While the database looks unhealthy a cycle uploads one
file, not ``files_per_cycle``.
"""
from __future__ import annotations

import asyncio

from loguru import logger

from broker.core.logs import Throttle, dropped_note
from broker.store.health import outage_level

__all__ = ["DrainHealth"]

_COOLDOWN_LINES = Throttle(60.0)  # a long outage cools down again and again: once a minute


class DrainHealth:
    def __init__(self, cooldown_after: int, cooldown_s: float) -> None:
        self.cooldown_after = max(1, cooldown_after)
        self.cooldown_s = cooldown_s
        self.db_healthy = True
        self.transient_streak = 0
        self.cooldown_until = 0.0  # loop time

    def cooling_down(self) -> bool:
        return asyncio.get_running_loop().time() < self.cooldown_until

    def reachable_again(self) -> None:
        """The registration reached PostgreSQL after failing (or for the first time)."""
        self.cooldown_until, self.transient_streak = 0.0, 0

    def uploaded(self) -> None:
        self.db_healthy = True
        self.transient_streak = 0

    def upload_failed(self, name: str, exc: BaseException) -> None:
        """A transient failure of an upload."""
        if self.db_healthy:  # one line per outage, not one per 100 ms cycle
            logger.log(outage_level(exc), "spool: upload of {} failed, database unreachable "
                       "({}); keeping it", name, exc)
        self.db_healthy = False
        self.transient_streak += 1
        if self.transient_streak >= self.cooldown_after:
            self.cooldown_until = asyncio.get_running_loop().time() + self.cooldown_s
            self.transient_streak = 0
            dropped = _COOLDOWN_LINES.allow("cooldown")
            if dropped is not None:
                logger.log(outage_level(exc, "INFO"),
                           "spool: {} transient failures in a row; cooling down {} s{}",
                           self.cooldown_after, self.cooldown_s, dropped_note(dropped))
