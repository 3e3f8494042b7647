"""What a service's log shows while a test runs: every record at INFO or above, from every logger, that got
past the filters of the logger that made it (``sluice.logs`` quiets some libraries). Its own handler on
the root logger, with the root at INFO as ``sluice.logs.configure_logging`` sets it: pytest's capture (and
an in-process server's set-up) may replace others."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class ShownLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, *, min_level: int = logging.INFO, logger_prefix: str = "") -> list[tuple[str, str, str]]:
        """``(level, logger, message)`` of each record shown, optionally only from loggers under a prefix."""
        return [
            (r.levelname, r.name, r.getMessage())
            for r in self.records
            if r.levelno >= min_level and r.name.startswith(logger_prefix)
        ]


@contextmanager
def shown_log_lines() -> Iterator[ShownLines]:
    root = logging.getLogger()
    handler, level = ShownLines(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def outage_levels(lines: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The levels of the outage lines (``sluice.outages``: ``<what> unavailable (...)`` when one starts,
    ``<what> available again after N s`` when it ends) among ``(level, message)`` pairs, by ``<what>``."""
    by_what: dict[str, list[str]] = {}
    for level, message in lines:
        for marker in (" unavailable (", " available again after "):
            if marker in message:
                by_what.setdefault(message.split(marker)[0], []).append(level)
    return by_what
