"""A one-line transfer progress display on stderr: bytes done/total, MiB/s and ETA, redrawn in place at
most twice a second. Silent when stderr is not a terminal or when asked to be, so logs stay clean."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

_REDRAW_INTERVAL_S = 0.5
_MIB = 1024 * 1024


class Progress:
    """Thread-safe: transfer threads call ``add(num_bytes)``; ``close()`` prints the final line."""

    def __init__(
        self, label: str, total_bytes: int, *, quiet: bool = False, stream: TextIO | None = None
    ) -> None:
        self.label = label
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _is_tty(self._stream)
        self._lock = threading.Lock()
        self._started_s = time.monotonic()
        self._drawn_s = 0.0
        self._skipped_bytes = 0

    def add(self, num_bytes: int) -> None:
        with self._lock:
            self.done_bytes += num_bytes
            now_s = time.monotonic()
            if self.enabled and now_s - self._drawn_s >= _REDRAW_INTERVAL_S:
                self._drawn_s = now_s
                self._draw(now_s, end="")

    def skip(self, num_bytes: int) -> None:
        """Bytes already there (a resumed download): counted as done, not in the rate."""
        with self._lock:
            self.done_bytes += num_bytes
            self._skipped_bytes += num_bytes

    def close(self) -> None:
        with self._lock:
            if self.enabled:
                self._draw(time.monotonic(), end="\n")

    def line(self, now_s: float) -> str:
        """The text shown, e.g. ``fetch s3://b/p  120.0/512.0 MiB  85.3 MiB/s  ETA 5s``."""
        elapsed_s = max(now_s - self._started_s, 1e-6)
        rate_bytes_s = (self.done_bytes - self._skipped_bytes) / elapsed_s
        left_bytes = max(self.total_bytes - self.done_bytes, 0)
        eta = f"ETA {left_bytes / rate_bytes_s:.0f}s" if rate_bytes_s > 0 and left_bytes else "done"
        return (
            f"{self.label}  {self.done_bytes / _MIB:.1f}/{self.total_bytes / _MIB:.1f} MiB  "
            f"{rate_bytes_s / _MIB:.1f} MiB/s  {eta}"
        )

    def _draw(self, now_s: float, *, end: str) -> None:
        self._stream.write("\r" + self.line(now_s) + "\033[K" + end)
        self._stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
