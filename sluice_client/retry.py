"""Which failed attempts the client retries, and how long it waits first: pure functions of the attempt,
the response's status, error code and headers, and ``now`` (no I/O), shared by the sync and async clients.

Retried, always with the same Idempotency-Key: a connection error before any response, 429, 500, 502, 503,
504, and 409 ``idempotency_key_in_progress`` (an earlier attempt with the key still runs; once it ends the
retry gets its result, replayed for free). Never another 4xx: sending the same request again cannot change
the answer. The wait is the server's ``retry-after-ms``, else its ``Retry-After`` (seconds or an HTTP date),
else exponential backoff with jitter; every wait is capped at ``max_wait_s``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
IN_PROGRESS_CODE = "idempotency_key_in_progress"  # the 409 the gateway sends while the key's attempt runs


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries after the first attempt (so at most ``max_retries + 1`` attempts); backoff
    ``backoff_initial_s * 2**retry``, at most ``backoff_max_s``, minus up to ``jitter`` of itself (so
    clients refused together do not come back together); a server-advised wait is honoured up to
    ``max_wait_s``."""

    max_retries: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    jitter: float = 0.25
    max_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if not (0 < self.backoff_initial_s <= self.backoff_max_s <= self.max_wait_s):
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s <= max_wait_s")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    def backoff_s(self, retry: int, unit_random: float) -> float:
        """The wait before retry number ``retry`` (0-based) with no advice from the server;
        ``unit_random`` in [0, 1) picks the jitter."""
        full_s = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(retry, 62))
        return full_s * (1.0 - self.jitter * unit_random)

    def wait_s(
        self,
        retry: int,
        headers: Mapping[str, str] | None,
        now_s: float,
        unit_random: float,
    ) -> float:
        """The wait before retry number ``retry``: the server's advice when it gave one, else backoff;
        capped at ``max_wait_s``. ``headers`` must look names up case-insensitively (httpx's do)."""
        advised_s = retry_after_s(headers, now_s) if headers is not None else None
        wait_s = self.backoff_s(retry, unit_random) if advised_s is None else advised_s
        return min(self.max_wait_s, wait_s)

    def gives_up(self, retry: int) -> bool:
        """True when retry number ``retry`` (0-based) would exceed ``max_retries``."""
        return retry >= self.max_retries


def is_retryable(status: int, code: str | None) -> bool:
    """Whether a response with this HTTP status and error code is worth sending again, unchanged."""
    return status in RETRY_STATUSES or (status == 409 and code == IN_PROGRESS_CODE)


def retry_after_s(headers: Mapping[str, str], now_s: float) -> float | None:
    """The server's advised wait in seconds, or None: ``retry-after-ms`` (milliseconds, the finer one)
    first, else ``Retry-After`` as seconds or as an HTTP date (relative to ``now_s``, unix seconds).
    Negative, non-finite or unparsable values count as no advice; a date in the past means retry now."""
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": no zone given; HTTP dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now_s)


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None
