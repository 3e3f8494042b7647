"""The stdout sink: records as JSON lines on the process's standard output (a container's log stream,
collected by the platform). The gateway's own logs go to stderr, so stdout carries records only."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from gateway.telemetry.sink import QueuedSink


class StdoutSink(QueuedSink):
    """Writes records to ``stream`` (default: ``sys.stdout`` when created) from the sink's thread, one
    line each, flushed per batch. Closing it flushes the stream and leaves it open."""

    name = "stdout"

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        max_queued: int = 10_000,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(max_queued=max_queued, on_drop=on_drop)
        self._stream = stream if stream is not None else sys.stdout
        self._start()

    def _send(self, lines: list[str]) -> int:
        self._stream.write("".join(line + "\n" for line in lines))
        self._stream.flush()
        return 0
