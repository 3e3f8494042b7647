"""The time window of an operator's usage report, as people write its ends: an ISO 8601 time (naive means
UTC, ``Z`` allowed), unix seconds, or a duration before now (``90m``, ``24h``, ``7d``). The control plane's
``GET /admin/v1/usage`` and ``sluice usage`` read them with these same functions, so the command refuses
(exit 2) exactly what the service would answer 400 to.

Pure: the text and ``now`` in, aware UTC datetimes out; a ``ValueError`` that says what was expected.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

DEFAULT_WINDOW = timedelta(hours=24)  # a report without ``since``: the day before ``until``
_AGO = re.compile(r"(\d{1,6})([mhd])")
_UNIT = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}


class WindowError(ValueError):
    """An end of the window refused; ``param`` names which (``since`` or ``until``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


_EXPECTED = "an ISO 8601 time (e.g. 2026-12-01T00:00:00Z), unix seconds, or a duration ago (90m, 24h, 7d)"


def parse_instant(text: str, *, now: datetime, name: str = "time") -> datetime:
    """``text`` as an aware UTC time; ``now`` (aware) anchors a duration. Raises ``WindowError`` naming
    ``name`` for anything else, and for a time no timestamp holds (NaN, before year 1, after 9999)."""
    shown = text if len(text) <= 40 else text[:40] + "..."
    refused = WindowError(f"{name} must be {_EXPECTED}, got {shown!r}", name)
    ago = _AGO.fullmatch(text.strip())
    try:
        if ago is not None:
            return now.astimezone(UTC) - int(ago.group(1)) * _UNIT[ago.group(2)]
        try:
            seconds = float(text)
        except ValueError:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
            return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        if not math.isfinite(seconds):
            raise refused
        return datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError):  # not a time at all, or outside years 1 to 9999
        raise refused from None


def report_window(since: str | None, until: str | None, *, now: datetime) -> tuple[datetime, datetime]:
    """The window ``since <= finished_at < until`` from its ends as written (None or empty: ``until`` is
    ``now``, ``since`` is ``DEFAULT_WINDOW`` before ``until``). Raises ``WindowError`` for an end that
    does not parse, or a ``since`` not before ``until``."""
    end = parse_instant(until, now=now, name="until") if until else now.astimezone(UTC)
    if since:
        start = parse_instant(since, now=now, name="since")
    elif end - datetime.min.replace(tzinfo=UTC) < DEFAULT_WINDOW:
        raise WindowError(f"until is too early for the default window, got {end.isoformat()}", "until")
    else:
        start = end - DEFAULT_WINDOW
    if start >= end:
        message = f"since must be before until, got {start.isoformat()} .. {end.isoformat()}"
        raise WindowError(message, "since")
    return start, end
