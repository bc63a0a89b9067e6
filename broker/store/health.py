"""The database's reachability as the broker's calls see it, told in a few lines: when
PostgreSQL becomes unreachable (once, not once per failed request), and when it is back,
with how long it was gone and what happened meanwhile. The spool tells the rest (what it
holds, and when it has drained).

An outage (PostgreSQL cannot be reached, docs/behaviour.md §5.4) reads as those lines only:
every other part that meets it (the timer sweeper, the staging merger, the leader jobs, the
reconcile loop, the spool's registration and uploads, parked pops) logs its failure at DEBUG
(``is_outage``, ``outage_level``), since this class has told it already; asyncpg's pool
retries are DEBUG too (broker/__main__.py)."""
from __future__ import annotations

import time
from collections.abc import Callable

from loguru import logger

_TOLD = "_told_by_database_health"


def is_outage(exc: BaseException) -> bool:
    """Is ``exc`` (or the error it was raised from) one a DatabaseHealth was told of: the
    database unreachable (every store call reports its StoreUnavailable before raising it),
    which that DatabaseHealth has logged already?"""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        if getattr(error, _TOLD, False):
            return True
        seen.add(id(error))
        error = error.__cause__
    return False


def outage_level(exc: BaseException, level: str = "WARNING") -> str:
    """The level of a background part's line about failure ``exc``: DEBUG when it is the
    database outage (DatabaseHealth says it once, and when it is over), else ``level``."""
    return "DEBUG" if is_outage(exc) else level


class DatabaseHealth:
    def __init__(self) -> None:
        self.down_since: float | None = None
        self.failed_calls = 0
        self.spooled_items = 0
        # Called, with the time.monotonic() of the first call that succeeded, when the
        # database is back: state that an outage leaves stale is set right at once (the
        # hot-list's rings: HotList.reconcile), not when its own timers come round.
        self.on_back: list[Callable[[float], object]] = []

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: BaseException) -> None:
        """A call found the database unreachable (``exc``, marked: see ``is_outage``)."""
        try:
            setattr(exc, _TOLD, True)
        except AttributeError:  # an exception type with __slots__: told, but not marked
            pass
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.failed_calls = self.spooled_items = 0
            logger.warning("database: unreachable ({}); pushes are answered buffered "
                           "(spooled to disk), other requests 503; the broker reconnects by "
                           "itself once PostgreSQL is back and replays the spool", exc)
        self.failed_calls += 1

    def spooled(self, items: int) -> None:
        """Push items went to the spool because the database was unreachable."""
        self.spooled_items += items

    def succeeded(self) -> None:
        """A call completed against the database."""
        if self.down_since is None:
            return
        back = time.monotonic()
        gone = back - self.down_since
        self.down_since = None
        logger.info("database: reachable again after {:.1f} s ({} call(s) failed, {} push "
                    "item(s) spooled meanwhile{})", gone, self.failed_calls, self.spooled_items,
                    "; the spool replays them now" if self.spooled_items else "")
        for listener in self.on_back:
            try:
                listener(back)
            except Exception:  # one listener's bug must not fail the call that succeeded
                logger.exception("database: a listener of its return failed")
