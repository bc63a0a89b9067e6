"""The database's reachability as the broker's calls see it, told in a few lines: when
PostgreSQL becomes unreachable (once, not once per failed request), and when it is back,
with how long it was gone and what happened meanwhile. The spool tells the rest (what it
holds, and when it has drained)."""
from __future__ import annotations

import time

from loguru import logger


class DatabaseHealth:
    def __init__(self) -> None:
        self.down_since: float | None = None
        self.failed_calls = 0
        self.spooled_items = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: BaseException) -> None:
        """A call found the database unreachable."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.failed_calls = self.spooled_items = 0
            logger.warning("database: unreachable ({}); pushes are spooled to disk, other "
                           "requests answer 503 until it is back", exc)
        self.failed_calls += 1

    def spooled(self, items: int) -> None:
        """Push items went to the spool because the database was unreachable."""
        self.spooled_items += items

    def succeeded(self) -> None:
        """A call completed against the database."""
        if self.down_since is None:
            return
        gone = time.monotonic() - self.down_since
        self.down_since = None
        logger.info("database: reachable again after {:.1f} s ({} call(s) failed, {} push "
                    "item(s) spooled meanwhile{})", gone, self.failed_calls, self.spooled_items,
                    "; the spool replays them now" if self.spooled_items else "")
