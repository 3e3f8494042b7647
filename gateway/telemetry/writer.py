"""The fan-out writer the gateway holds: each record goes to every configured sink, each with its own
queue and thread, so a stuck sink drops its own records and delays no other (nor any request)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gateway.telemetry.file import FileSink
from gateway.telemetry.record import TelemetryRecord
from gateway.telemetry.redis_stream import RedisStreamSink
from gateway.telemetry.sink import TelemetrySink
from gateway.telemetry.stdout import StdoutSink
from sluice.settings import Settings


class TelemetryWriter:
    """``write`` queues the record in every sink (never blocks); ``flush`` and ``close`` do it for all."""

    def __init__(self, sinks: Sequence[TelemetrySink]) -> None:
        self.sinks = tuple(sinks)

    def write(self, record: TelemetryRecord) -> None:
        for sink in self.sinks:
            sink.write(record)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every sink delivered what was queued (``timeout_s`` for all of them together)."""
        deadline_s = time.monotonic() + timeout_s
        flushed = [sink.flush(max(0.0, deadline_s - time.monotonic())) for sink in self.sinks]
        return all(flushed)

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued and stop every sink. Blocks (``asyncio.to_thread``)."""
        for sink in self.sinks:
            sink.close(timeout_s)


def open_telemetry(settings: Settings, on_drop: Callable[[str, int], None]) -> TelemetryWriter:
    """The sinks ``settings.telemetry_sink_names`` names, started; ``on_drop(sink name, records)``
    counts what each drops."""
    sinks: list[TelemetrySink] = []
    max_queued = settings.telemetry_queue_max_records
    for name in settings.telemetry_sink_names:

        def dropped(num_records: int, name: str = name) -> None:
            on_drop(name, num_records)

        if name == "file":
            sinks.append(
                FileSink(
                    settings.telemetry_path,
                    max_bytes=settings.telemetry_max_bytes,
                    num_backups=settings.telemetry_num_backups,
                    max_queued=max_queued,
                    on_drop=dropped,
                )
            )
        elif name == "stdout":
            sinks.append(StdoutSink(max_queued=max_queued, on_drop=dropped))
        else:
            assert name == "redis" and settings.redis_url is not None  # Settings refuses it otherwise
            sinks.append(
                RedisStreamSink(
                    settings.redis_url,
                    settings.telemetry_redis_stream,
                    maxlen=settings.telemetry_redis_maxlen,
                    max_queued=max_queued,
                    on_drop=dropped,
                )
            )
    return TelemetryWriter(sinks)
