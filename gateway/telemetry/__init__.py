"""Telemetry: one record per request that reached generation (refusals at admission included), sent to
every configured sink (``SLUICE_TELEMETRY_SINKS``): a rotating JSON-lines file, stdout, a bounded Redis
stream. Each sink has its own bounded queue and thread; what a sink cannot take is dropped and counted
(``sluice_gateway_telemetry_dropped_total{sink}``), and the request goes on.

- ``record``: the record and its JSON form; ``sink``: the interface and the queue/thread every sink uses;
- ``file``, ``stdout``, ``redis_stream``: the sinks; ``writer``: the fan-out and the sinks from settings.
"""

from gateway.telemetry.file import FileSink
from gateway.telemetry.record import TELEMETRY_SCHEMA, TelemetryRecord, record_json
from gateway.telemetry.redis_stream import RedisStreamSink
from gateway.telemetry.sink import QueuedSink, TelemetrySink
from gateway.telemetry.stdout import StdoutSink
from gateway.telemetry.writer import TelemetryWriter, open_telemetry

__all__ = [
    "TELEMETRY_SCHEMA",
    "FileSink",
    "QueuedSink",
    "RedisStreamSink",
    "StdoutSink",
    "TelemetryRecord",
    "TelemetrySink",
    "TelemetryWriter",
    "open_telemetry",
    "record_json",
]
