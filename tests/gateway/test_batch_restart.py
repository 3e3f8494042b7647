"""Issue 15: a batch survives its gateway being killed (SIGKILL, mid-batch) and resumes where it stopped,
with exact progress counts and one usage row per line. A real gateway process (``python -m gateway``,
the in-process engine, SQLite and files under one state_dir) runs a batch; once some of its lines are
committed it is killed; a gateway started again on the same state_dir claims the batch when the dead
one's lease lapses and finishes it."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import openai
from harness import ACME_KEY, MODEL, gateway_process, start_gateway, wait_until

# Short intervals, so the test waits on events rather than the defaults' seconds.
BATCH_ENV = {
    "batch_lease_s": "2",
    "batch_poll_interval_s": "0.2",
    "batch_flush_interval_s": "0.2",
    "batch_line_concurrency": "3",
}
NUM_LINES = 24
MAX_TOKENS = 160


def client_for(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key=ACME_KEY, max_retries=0)


def usage_rows(base_url: str, batch_id: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{base_url}/v1/usage", params={"limit": "1000"}, headers={"Authorization": f"Bearer {ACME_KEY}"}
    )
    response.raise_for_status()
    return [r for r in response.json()["data"] if r["request_id"].startswith(batch_id)]


def batch_lines() -> list[str]:
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    return [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {**body, "prompt": f"Line {i}"},
            }
        )
        for i in range(NUM_LINES)
    ]


def test_a_batch_resumes_after_its_gateway_is_killed_and_bills_each_line_once(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    lines = batch_lines()
    with gateway_process(tmp_path, dev_checkpoint, "first", **BATCH_ENV) as first:
        proc, base_url = first.proc, first.base_url
        client = client_for(base_url)
        file_id = client.files.create(
            file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch"
        ).id
        batch_id = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        ).id
        wait_until(
            lambda: client.batches.retrieve(batch_id).request_counts.completed >= 3, 60, "3 lines committed"
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    with gateway_process(tmp_path, dev_checkpoint, "second", **BATCH_ENV) as second:
        base_url = second.base_url
        client = client_for(base_url)
        before = client.batches.retrieve(batch_id)
        assert before.status == "in_progress" and 3 <= before.request_counts.completed < NUM_LINES
        wait_until(lambda: client.batches.retrieve(batch_id).status == "completed", 90, "the batch completed")
        done = client.batches.retrieve(batch_id)
        counts = done.request_counts
        assert (counts.total, counts.completed, counts.failed) == (NUM_LINES, NUM_LINES, 0)
        outputs = [
            json.loads(raw) for raw in client.files.content(done.output_file_id or "").text.splitlines()
        ]
        assert sorted(o["custom_id"] for o in outputs) == sorted(f"r{i}" for i in range(NUM_LINES))
        assert all(o["response"]["body"]["usage"]["completion_tokens"] == MAX_TOKENS for o in outputs)
        assert done.error_file_id is None
        # One row per line, never two, whichever gateway ran it: the run the batch reports, whole (a line
        # killed mid-run bills nothing for that run, so its checkpoint cannot stand for the rerun).
        rows = usage_rows(base_url, batch_id)
        assert sorted(r["request_id"] for r in rows) == sorted(f"{batch_id}:r{i}" for i in range(NUM_LINES))
        assert all(r["status"] == "finished" and r["output_tokens"] == MAX_TOKENS for r in rows), rows


def test_a_gateway_stopped_cleanly_lets_its_running_lines_end_and_the_next_one_resumes(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    """A clean stop starts no more lines, lets the running ones end and commits them, and gives the lease
    back: the next gateway resumes at once, and every line is billed whole (no row cut short)."""
    settings = {
        "engine_client": "inprocess",
        "max_output_tokens": 1024,
        "batch_lease_s": 30.0,  # long: only a lease given back lets the next gateway resume soon
        "batch_poll_interval_s": 0.2,
        "batch_flush_interval_s": 0.2,
        "batch_line_concurrency": 3,
    }
    first = start_gateway(tmp_path, dev_checkpoint, **settings)
    try:
        client = first.client()
        data = "\n".join(batch_lines()).encode()
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
        batch_id = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        ).id
        wait_until(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 2, 60, "2 lines")
    finally:
        first.stop()
    second = start_gateway(tmp_path, dev_checkpoint, **settings)
    try:
        client = second.client()
        wait_until(lambda: client.batches.retrieve(batch_id).status == "completed", 20, "the batch completed")
        counts = client.batches.retrieve(batch_id).request_counts
        assert (counts.total, counts.completed, counts.failed) == (NUM_LINES, NUM_LINES, 0)
        rows = usage_rows(second.base_url, batch_id)
        assert len(rows) == NUM_LINES
        assert all(r["status"] == "finished" and r["output_tokens"] == MAX_TOKENS for r in rows)
    finally:
        second.stop()


def test_lines_cut_by_a_stop_run_again_and_are_billed_once_for_the_run_reported(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    """A stop whose drain runs out cuts the lines still running: the cut runs write no usage row (their
    telemetry says ``interrupted``, their tokens wasted), the next gateway runs those lines again, and
    each line has one row, for the whole output its result reports."""
    max_tokens = 1000  # a line runs for seconds: the 0.2 s drain cuts those running
    settings = {
        "engine_client": "inprocess",
        "max_output_tokens": 1024,
        "batch_drain_s": 0.2,
        "batch_lease_s": 30.0,
        "batch_poll_interval_s": 0.2,
        "batch_flush_interval_s": 0.2,
        "batch_line_concurrency": 2,
    }
    body = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True}
    lines = [
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                    "body": {**body, "prompt": f"Line {i}"}})
        for i in range(6)
    ]  # fmt: skip
    first = start_gateway(tmp_path, dev_checkpoint, **settings)
    try:
        client = first.client()
        data = io.BytesIO("\n".join(lines).encode())
        file_id = client.files.create(file=("in.jsonl", data), purpose="batch").id
        batch_id = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        ).id
        # One line committed: the next ones are running (each for seconds) when the stop comes.
        wait_until(lambda: client.batches.retrieve(batch_id).request_counts.completed >= 1, 60, "a line")
    finally:
        first.stop()
    path = first.gw.settings.telemetry_path
    assert path is not None
    records = [json.loads(line) for line in path.read_text().splitlines()]
    cut = [r for r in records if r.get("batch_id") == batch_id and r["outcome"] == "interrupted"]
    assert cut, "the stop cut no line"
    assert all(r["billed_tokens"] == 0 and r["wasted_tokens"] == r["output_tokens"] for r in cut)
    second = start_gateway(tmp_path, dev_checkpoint, **settings)
    try:
        client = second.client()
        wait_until(lambda: client.batches.retrieve(batch_id).status == "completed", 90, "the batch completed")
        counts = client.batches.retrieve(batch_id).request_counts
        assert (counts.total, counts.completed, counts.failed) == (6, 6, 0)
        rows = usage_rows(second.base_url, batch_id)
        assert sorted(r["request_id"] for r in rows) == sorted(f"{batch_id}:c{i}" for i in range(6))
        assert all(r["status"] == "finished" and r["output_tokens"] == max_tokens for r in rows), rows
    finally:
        second.stop()
