"""Issue 15: the Batch API across a fleet: two gateways sharing PostgreSQL (batch store, ledger, tenants)
and S3 (files, on moto's S3 server). One only accepts batches (``batch_runner=False``), the other runs
them: a batch created on the first is run by the second, and a cancel sent to the first reaches the
second's runner through the store."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import openai
from harness import MODEL, start_gateway, wait_until
from s3_server import MotoS3, moto_s3  # noqa: F401  (pytest finds fixtures by name)


def upload(client: openai.OpenAI, num_lines: int, max_tokens: int) -> str:
    body = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True}
    lines = [
        json.dumps(
            {
                "custom_id": f"f{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {**body, "messages": [{"role": "user", "content": f"Item {i}"}]},
            }
        )
        for i in range(num_lines)
    ]
    return client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch").id


def wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.1)
    return batch


def test_one_gateway_accepts_the_batch_another_runs_it_and_a_cancel_crosses_over(
    dev_checkpoint: Path,
    tmp_path: Path,
    database: str,
    moto_s3: MotoS3,  # noqa: F811
) -> None:
    bucket = moto_s3.create_bucket()
    shared = {
        "engine_client": "inprocess",
        "database_url": database,
        "files_url": f"s3://{bucket}/fleet",
        "s3_endpoint_url": moto_s3.endpoint_url,
        "max_output_tokens": 1024,
        "batch_lease_s": 3.0,
        "batch_poll_interval_s": 0.2,
        "batch_flush_interval_s": 0.2,
        "batch_line_concurrency": 2,
    }
    front = start_gateway(tmp_path / "front", dev_checkpoint, batch_runner=False, **shared)
    worker = start_gateway(tmp_path / "worker", dev_checkpoint, **shared)
    try:
        client = front.client()
        small = client.batches.create(
            input_file_id=upload(client, 3, 8), endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(client, small.id, {"completed", "failed"})
        assert done.status == "completed" and done.request_counts.completed == 3
        outputs = [json.loads(x) for x in client.files.content(done.output_file_id or "").text.splitlines()]
        assert sorted(o["custom_id"] for o in outputs) == ["f0", "f1", "f2"]
        assert all(o["response"]["body"]["object"] == "chat.completion" for o in outputs)
        keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
        assert f"fleet/files/acme/{done.output_file_id}" in keys
        assert not [k for k in keys if "/part-" in k]  # the parts' objects are gone once the files hold them
        assert not (tmp_path / "front" / "files").exists() and not (tmp_path / "worker" / "files").exists()
        worker_records = [r for r in worker.telemetry() if r.get("batch_id") == small.id]
        assert len(worker_records) == 3 and not [r for r in front.telemetry() if r.get("batch_id")]

        big = client.batches.create(
            input_file_id=upload(client, 30, 300), endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_until(lambda: client.batches.retrieve(big.id).request_counts.completed >= 1, 60, "a line done")
        client.batches.cancel(big.id)  # on the gateway that does not run it
        cancelled = wait_for(client, big.id, {"cancelled", "completed"}, timeout_s=30)
        assert cancelled.status == "cancelled"
        counts = cancelled.request_counts
        assert counts.completed + counts.failed < counts.total == 30
    finally:
        front.stop()
        worker.stop()
