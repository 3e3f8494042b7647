"""Audit: a tenant's prompt and output text is kept only in the tenant's own files (its upload, its
batch's input copy and result files). An upload and a batch (a line answered, a line refused at
admission, malformed lines) leave no trace of the text in the logs at any level, the telemetry records,
the metrics, the usage ledger and the batch store (the state directory's databases); and a line's error
in the error file names the line by its custom_id, as OpenAI's does, never echoing its body back."""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from harness import MODEL, RunningGateway, start_gateway

CANARY = "Zq7canaryXv9"  # in every prompt: found anywhere but the tenant's files, it leaked
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def batch_line(custom_id: str, body: dict[str, Any], url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def state_bytes_outside_the_files(state_dir: Path) -> dict[str, bytes]:
    """Every file the gateway wrote under its state directory but the tenants' files (the object store)."""
    files_root = state_dir / "files"
    return {
        str(path): path.read_bytes()
        for path in state_dir.rglob("*")
        if path.is_file() and files_root not in path.parents
    }


def run_batch(client: openai.OpenAI, lines: list[str]) -> Any:
    data = ("\n".join(lines) + "\n").encode()
    input_file = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=input_file.id, endpoint="/v1/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while batch.status not in TERMINAL:
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    return batch


def file_lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    lines = [json.loads(raw) for raw in client.files.content(file_id).text.splitlines()]
    return {str(line["custom_id"]): line for line in lines}


def test_prompt_and_output_text_stay_in_the_tenants_files(
    dev_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    running: RunningGateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        max_prompt_tokens=64,
        max_prompt_chars=400,
        batch_lease_s=3.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
    )
    try:
        client = running.client()
        lines = [
            batch_line("ok", {"model": MODEL, "prompt": f"Say {CANARY} back", "max_tokens": 24}),
            batch_line("too-long", {"model": MODEL, "prompt": CANARY * 60, "max_tokens": 4}),
            batch_line("bad-type", {"model": MODEL, "prompt": "x", "max_tokens": CANARY}),
            batch_line("bad-field", {"model": MODEL, "prompt": "x", "top_a": CANARY}),
            batch_line("bad-url", {"model": MODEL, "prompt": CANARY}, url="/v1/embeddings"),
            '{"custom_id": "not-json", "body": "' + CANARY,
        ]
        batch = run_batch(client, lines)
        assert batch.status == "completed", batch
        output = file_lines(client, batch.output_file_id)
        errors = file_lines(client, batch.error_file_id)
        assert set(output) == {"ok"}
        assert set(errors) == {"too-long", "bad-type", "bad-field", "bad-url", "None"}
        # The error file names each line by its custom_id and says why, without the line's text.
        for custom_id, line in errors.items():
            assert CANARY not in json.dumps(line), (custom_id, line)
        assert errors["too-long"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
        output_text = output["ok"]["response"]["body"]["choices"][0]["text"]
        running.gw.telemetry.flush()
        with running.http() as http:
            metrics_text = http.get("/metrics").text
        leaked = {CANARY}
        if len(output_text.strip()) >= 16:  # long enough to be found only where it was copied
            leaked.add(output_text)
    finally:
        running.stop()
    for text in leaked:
        assert text not in caplog.text
        assert text not in metrics_text
        for path, data in state_bytes_outside_the_files(tmp_path).items():
            assert text.encode() not in data, f"{text!r} in {path}"
    assert any(path.endswith("telemetry.jsonl") for path in state_bytes_outside_the_files(tmp_path))
    assert any(r.name.startswith("gateway.batches") for r in caplog.records)  # the logs were captured
