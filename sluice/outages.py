"""How an outage of a dependency reads in the log: one WARNING when it starts (what failed, and what is
done meanwhile), one INFO when it ends (how long it lasted), and every failure between them at DEBUG.

Each dependency has one owner of this report, so an outage is said once however many callers meet it:
a store's own pool (``sluice.stores.db``) for the stores a service calls per request, or the component
that keeps a richer state of the outage (the tenant cache serving stale keys, the usage meter holding
records in its outbox), which then opens its store with ``report_outages=False``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class OutageLog:
    """``down`` / ``up`` as failures and successes come; only the transitions are logged at WARNING and
    INFO (``enabled=False``: at DEBUG, where another component reports this dependency)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what
        self._start_level = logging.WARNING if enabled else logging.DEBUG
        self._end_level = logging.INFO if enabled else logging.DEBUG
        self._clock = clock
        self._since_s: float | None = None

    @property
    def is_down(self) -> bool:
        return self._since_s is not None

    @property
    def down_for_s(self) -> float:
        """How long the current outage has lasted (0 when there is none)."""
        return 0.0 if self._since_s is None else self._clock() - self._since_s

    def down(self, reason: object, meanwhile: str = "") -> bool:
        """A failure: the outage starts (logged; True) unless it has already."""
        if self._since_s is not None:
            self._log.debug("%s still unavailable: %s", self._what, reason, stacklevel=2)
            return False
        self._since_s = self._clock()
        self._log.log(
            self._start_level,
            "%s unavailable (%s)%s",
            self._what,
            reason,
            f": {meanwhile}" if meanwhile else "",
            stacklevel=2,  # the caller's file and line, not this module's
        )
        return True

    def up(self, detail: str = "") -> float | None:
        """A success: the outage (if any) ends, logged with its length, which is returned."""
        if self._since_s is None:
            return None
        down_s = self._clock() - self._since_s
        self._since_s = None
        self._log.log(
            self._end_level,
            "%s available again after %.1f s%s",
            self._what,
            down_s,
            f": {detail}" if detail else "",
            stacklevel=2,
        )
        return down_s
