"""Audit: the files' object store (a real S3 server, moto, behind a TCP proxy the test cuts) down at every
place the Files and Batch APIs use it. An upload, a read and a batch's creation (its input copy) are 503
``file_store_unavailable`` with ``Retry-After``, never a 500, and leave no batch behind; a runner whose
store goes away mid-batch (reading the input, committing a part, writing the result files) waits and
resumes, and the batch ends with every line reported once and billed once; the sweeper skips a sweep and
sweeps at the next."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from harness import MODEL, RunningGateway, start_gateway, wait_until
from pg import through_proxy
from s3_server import MotoS3, moto_s3  # noqa: F401  (pytest finds fixtures by name)
from tcp_proxy import ProxyThread

from gateway.files.sweeper import FileSweeper
from sluice.stores.files.catalog import FileCatalog
from sluice.stores.files.s3 import S3ObjectStore

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def line(custom_id: str, max_tokens: int = 4) -> str:
    body = {"model": MODEL, "prompt": f"Line {custom_id}", "max_tokens": max_tokens}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


def jsonl(lines: list[str]) -> io.BytesIO:
    return io.BytesIO(("\n".join(lines) + "\n").encode())


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[ProxyThread]:  # noqa: F811
    host, port = moto_s3.endpoint_url.removeprefix("http://").split(":")
    proxy = ProxyThread(host, int(port))
    yield proxy
    proxy.close()


def num_completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def runs_of(running: RunningGateway, batch_id: str) -> list[dict[str, Any]]:
    """The telemetry records of the batch's line runs (one per run of a line)."""
    return [r for r in running.telemetry() if r["batch_id"] == batch_id]


def gateway_on(proxy: ProxyThread, moto_s3: MotoS3, dev_checkpoint: Path, tmp_path: Path) -> RunningGateway:  # noqa: F811
    return start_gateway(
        tmp_path,
        dev_checkpoint,
        files_url=f"s3://{moto_s3.create_bucket()}/sluice",
        s3_endpoint_url=f"http://127.0.0.1:{proxy.port}",
        batch_lease_s=2.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
        batch_line_concurrency=2,
    )


def test_uploads_reads_and_batch_creation_are_503_while_s3_is_down(
    dev_checkpoint: Path,
    tmp_path: Path,
    moto_s3: MotoS3,  # noqa: F811
    s3_proxy: ProxyThread,
) -> None:
    running = gateway_on(s3_proxy, moto_s3, dev_checkpoint, tmp_path)
    try:
        client = running.client()
        uploaded = client.files.create(file=("in.jsonl", jsonl([line("a")])), purpose="batch")
        s3_proxy.cut()
        calls = {
            "upload": lambda: client.files.create(file=("in.jsonl", jsonl([line("b")])), purpose="batch"),
            "retrieve": lambda: client.files.retrieve(uploaded.id),
            "content": lambda: client.files.content(uploaded.id),
            "list": lambda: client.files.list(),
            "delete": lambda: client.files.delete(uploaded.id),
            "batch": lambda: client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
            ),
        }
        for what, call in calls.items():
            with pytest.raises(openai.APIStatusError) as caught:
                call()
            assert caught.value.status_code == 503, (what, caught.value.response.text)
            body = caught.value.body
            assert isinstance(body, dict) and body["code"] == "file_store_unavailable", (what, body)
            assert caught.value.response.headers["Retry-After"] == "5", what
        assert client.batches.list().data == []  # the refused create queued nothing
        s3_proxy.restore()
        assert client.files.content(uploaded.id).read() == jsonl([line("a")]).getvalue()  # nothing lost
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    finally:
        running.stop()


def test_a_runner_rides_out_an_s3_outage_reporting_and_billing_each_line_once(
    dev_checkpoint: Path,
    tmp_path: Path,
    moto_s3: MotoS3,  # noqa: F811
    s3_proxy: ProxyThread,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.batches")
    running = gateway_on(s3_proxy, moto_s3, dev_checkpoint, tmp_path)
    custom_ids = [f"q{i:02d}" for i in range(40)]
    try:
        client = running.client()
        input_file = client.files.create(
            file=("in.jsonl", jsonl([line(c, max_tokens=48) for c in custom_ids])), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=input_file.id, endpoint="/v1/completions", completion_window="24h"
        )
        wait_until(lambda: num_completed(client, batch.id) > 0, 60, "a first part")
        s3_proxy.cut()
        assert client.batches.retrieve(batch.id).status == "in_progress"  # the outage is mid-batch
        # Every line ends while S3 is down: none can be committed, the last flush included.
        wait_until(lambda: len(runs_of(running, batch.id)) >= len(custom_ids), 60, "every line to end")
        assert "not committed yet" in caplog.text
        time.sleep(3 * 2.0)  # past the lease: a runner that gave the batch up would have lost its lines
        s3_proxy.restore()
        deadline = time.monotonic() + 120
        while (batch := client.batches.retrieve(batch.id)).status not in TERMINAL:
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
        assert batch.status == "completed", batch
        counts = batch.request_counts
        assert counts is not None
        assert (counts.total, counts.completed, counts.failed) == (40, 40, 0)
        assert batch.error_file_id is None
        output = [
            json.loads(raw) for raw in client.files.content(batch.output_file_id or "").text.splitlines()
        ]
        assert sorted(o["custom_id"] for o in output) == custom_ids  # each line once, none lost
        # Each line ran once: the lines that ended during the outage were committed once S3 was back,
        # not run again (a rerun would be billed for its first run's tokens, but report its own output).
        assert sorted(r["custom_id"] for r in runs_of(running, batch.id)) == custom_ids
        rows = running.usage(limit="1000")["data"]
        billed = [r["request_id"] for r in rows if r["request_id"].startswith(batch.id + ":")]
        assert sorted(billed) == [f"{batch.id}:{c}" for c in custom_ids]  # each line billed once
    finally:
        running.stop()


@pytest.mark.anyio
async def test_the_sweeper_skips_a_sweep_while_s3_is_down_and_sweeps_at_the_next(
    moto_s3: MotoS3,  # noqa: F811
    s3_proxy: ProxyThread,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket = moto_s3.create_bucket()
    store = S3ObjectStore(bucket, "sluice", endpoint_url=f"http://127.0.0.1:{s3_proxy.port}", max_attempts=1)
    await store.open()
    now = [datetime(2026, 12, 1, tzinfo=UTC)]
    catalog = FileCatalog(store, clock=lambda: now[0])
    swept: list[int] = []
    try:
        stored: Any = await catalog.create("acme", "in.jsonl", "batch", b"{}\n", expires_after_s=3600)
        now[0] += timedelta(hours=2)
        sweeper = FileSweeper(catalog, 60.0, on_expired=swept.append)
        s3_proxy.cut()
        with caplog.at_level(logging.WARNING, logger="sluice.stores.files.s3"):
            assert await sweeper.sweep_once() == 0
        assert f"file store s3://{bucket}/sluice unavailable" in caplog.text  # the store's own report
        s3_proxy.restore()
        assert await sweeper.sweep_once() == 1
        assert swept == [1]
        assert await store.list(f"files/acme/{stored.file_id}") == []
    finally:
        await store.close()


def test_the_batch_api_is_503_while_the_batch_store_is_down(
    dev_checkpoint: Path, tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    """PostgreSQL (the batch store) cut: creating, listing, reading and cancelling batches are 503
    ``batch_store_unavailable`` with ``Retry-After`` within seconds, never a 500 nor a client held for
    half a minute; a create refused so queued nothing."""
    via_proxy = through_proxy(database, pg_proxy.port)
    # The tenant cache outlives the outage: this test is about the batch store, not about auth.
    running = start_gateway(tmp_path, dev_checkpoint, database_url=via_proxy, tenant_cache_ttl_s=3600.0,
                            batch_runner=False)  # fmt: skip
    try:
        client = running.client()
        file_id = client.files.create(file=("in.jsonl", jsonl([line("a")])), purpose="batch").id
        queued = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        )
        pg_proxy.cut()
        calls = {
            "create": lambda: client.batches.create(
                input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
            ),
            "list": lambda: client.batches.list(),
            "retrieve": lambda: client.batches.retrieve(queued.id),
            "cancel": lambda: client.batches.cancel(queued.id),
        }
        for what, call in calls.items():
            started_s = time.monotonic()
            with pytest.raises(openai.APIStatusError) as caught:
                call()
            assert time.monotonic() - started_s < 15, what  # answered in seconds, the client not held
            assert caught.value.status_code == 503, (what, caught.value.response.text)
            body = caught.value.body
            assert isinstance(body, dict) and body["code"] == "batch_store_unavailable", (what, body)
            assert caught.value.response.headers["Retry-After"] == "5", what
        pg_proxy.restore()
        wait_until(lambda: _lists(client), 30, "the batch store back")
        assert [b.id for b in client.batches.list()] == [queued.id]
        assert client.batches.retrieve(queued.id).status == "validating"  # the refused cancel did nothing
    finally:
        running.stop()


def _lists(client: openai.OpenAI) -> bool:
    try:
        client.batches.list()
    except openai.APIStatusError:
        return False
    return True
