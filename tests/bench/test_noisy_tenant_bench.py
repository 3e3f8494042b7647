"""The noisy-tenant benchmark's pure parts: what the flood client reads off a stream's last bytes, and the
gateway's telemetry matched to the quiet client's requests. No server is started."""

from __future__ import annotations

import json
from pathlib import Path

from bench.noisy_tenant_bench import gateway_view, read_gateway_view, stream_outcome, telemetry_lines


def record(request_id: str, ttft_ms: float | None, queue_ms: float, replica_ttft_ms: float | None) -> str:
    fields = {"ttft_ms": ttft_ms, "queue_ms": queue_ms, "replica_ttft_ms": replica_ttft_ms}
    return json.dumps({"request_id": request_id, "tenant_id": "acme", **fields, "outcome": "finished"})


def test_the_flood_reads_its_tokens_off_the_last_usage_event() -> None:
    tail = (
        b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" x"}]}\n\n'
        b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":400,'
        b'"total_tokens":403}}\n\ndata: [DONE]\n\n'
    )
    assert stream_outcome(tail) == (False, 400)
    # Cut off before the usage event (a read that ended the stream early): no tokens counted.
    assert stream_outcome(b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" x"}]}\n\n') == (False, 0)


def test_a_stream_that_ends_with_an_error_event_failed() -> None:
    tail = b'data: {"id":"c","choices":[{"text":"a"}]}\n\ndata: {"error":{"message":"replica lost"}}\n\n'
    assert stream_outcome(tail) == (True, 0)


def test_gateway_view_takes_only_the_quiet_clients_requests() -> None:
    lines = [
        record("cmpl-a", 40.0, 5.0, 30.0),
        record("cmpl-flood", 900.0, 800.0, 90.0),
        record("cmpl-b", None, 7.0, None),  # no token came: its TTFTs are left out, its queue time kept
        '{"request_id": "cmpl-c", "ttft',  # a record half written
        record("cmpl-a", 1.0, 1.0, 1.0),  # the same id again counts once
    ]
    view = gateway_view(lines, ["cmpl-a", "cmpl-b", "cmpl-c"])
    assert view == {"ttft_ms": [40.0], "queue_ms": [5.0, 7.0], "replica_ttft_ms": [30.0]}


def test_read_gateway_view_reads_the_rotated_file_too(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    (tmp_path / "telemetry.jsonl.1").write_text(record("cmpl-old", 10.0, 1.0, 9.0) + "\n")
    path.write_text(record("cmpl-new", 20.0, 2.0, 18.0) + "\n")
    view = read_gateway_view(path, ["cmpl-old", "cmpl-new"], timeout_s=0)
    assert view is not None and sorted(view["ttft_ms"]) == [10.0, 20.0]
    assert read_gateway_view(tmp_path / "absent.jsonl", ["cmpl-new"], timeout_s=0) is None


def test_telemetry_lines_quote_each_phase() -> None:
    unloaded = {"ttft_ms": [20.0] * 4, "queue_ms": [2.0] * 4, "replica_ttft_ms": [15.0] * 4}
    flooded = {"ttft_ms": [100.0, 300.0], "queue_ms": [50.0, 50.0], "replica_ttft_ms": [40.0, 40.0]}
    lines = telemetry_lines(Path("t.jsonl"), [unloaded, flooded])
    assert lines[2] == "| unloaded | 4 | 20 / 20 | 2 / 2 | 15 / 15 |"
    assert lines[3] == "| during the flood | 2 | 200 / 290 | 50 / 50 | 40 / 40 |"
    assert telemetry_lines(Path("t.jsonl"), [None, None])[0].startswith("Gateway telemetry: no file")
