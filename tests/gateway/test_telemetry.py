"""The telemetry file sink: records written by its own thread in order, the file rotated at its bound with
a fixed number of older files kept, and ``write`` never blocking: when the sink is stuck, records beyond
the queue are dropped and counted. (The other sinks and the fan-out: test_telemetry_sinks.py.)"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from gateway.telemetry import FileSink, TelemetryRecord, TelemetryWriter, record_json


def _record(i: int) -> TelemetryRecord:
    return TelemetryRecord(
        request_id=f"req-{i:05d}",
        tenant_id="acme",
        model="sluice-tiny",
        model_version="1",
        replica="r0",
        engine_client="inprocess",
        request_class="interactive",
        queue_ms=0.1,
        ttft_ms=1.0,
        replica_ttft_ms=0.9,
        prompt_tokens=10,
        output_tokens=20,
        inter_token_p50_ms=1.0,
        inter_token_p95_ms=1.5,
        inter_token_max_ms=2.0,
        duration_ms=30.0,
        outcome="finished",
        finish_reason="length",
        billed_tokens=30,
        wasted_tokens=0,
    )


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["request_id"] for line in path.read_text().splitlines()]


def test_records_are_written_in_order_and_the_file_rotates_keeping_the_backups(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    line_bytes = len(record_json(_record(0))) + 1
    max_bytes = 10 * line_bytes  # ten records a file
    writer = FileSink(path, max_bytes=max_bytes, num_backups=2)
    for i in range(45):
        writer.write(_record(i))
    assert writer.flush()
    assert _ids(path) == [f"req-{i:05d}" for i in range(40, 45)]
    writer.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["telemetry.jsonl", "telemetry.jsonl.1", "telemetry.jsonl.2"]
    kept = _ids(tmp_path / "telemetry.jsonl.2") + _ids(tmp_path / "telemetry.jsonl.1") + _ids(path)
    assert kept == [f"req-{i:05d}" for i in range(20, 45)]  # the oldest files went, in order
    assert all(p.stat().st_size <= max_bytes for p in tmp_path.iterdir())
    assert writer.num_dropped == 0
    writer.write(_record(99))  # after close: dropped, counted, never raised
    assert writer.num_dropped == 1


def test_write_never_blocks_and_counts_what_a_stuck_writer_cannot_take(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    os.mkfifo(path)  # opening it for writing blocks until a reader comes: the writer thread is stuck
    drops: list[int] = []
    writer = FileSink(path, max_queued=10, on_drop=drops.append)
    started = time.monotonic()
    for i in range(25):
        writer.write(_record(i))
    assert time.monotonic() - started < 0.5
    assert writer.num_dropped == sum(drops) == 15  # the queue holds 10; the thread took none yet
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(path.read_text().splitlines()))
    reader.start()  # unsticks the writer
    writer.close()
    reader.join(10)
    assert [json.loads(line)["request_id"] for line in lines] == [f"req-{i:05d}" for i in range(10)]


def test_a_writer_without_sinks_drops_records_and_runs_no_thread() -> None:
    before = threading.active_count()
    writer = TelemetryWriter([])
    writer.write(_record(0))
    assert writer.flush() and threading.active_count() == before
    writer.close()
