"""A sliding-window rate meter: events per second over the last ``window_s``, on the caller's clock."""

from __future__ import annotations

from collections import deque


class RateMeter:
    def __init__(self, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()  # (time, count)
        self._total = 0.0
        self._first_s: float | None = None

    def observe(self, now_s: float, count: float = 1.0) -> None:
        if self._first_s is None:
            self._first_s = now_s
        self._events.append((now_s, count))
        self._total += count
        self._trim(now_s)

    def rate_per_s(self, now_s: float) -> float | None:
        """Events per second over the window (or since the first event, if that is shorter, but at least
        one second, so a single early event does not read as a huge rate). None before any event."""
        if self._first_s is None:
            return None
        self._trim(now_s)
        span_s = min(self.window_s, max(1.0, now_s - self._first_s))
        return self._total / span_s

    def _trim(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        while self._events and self._events[0][0] < horizon:
            self._total -= self._events.popleft()[1]
