"""Issue 15: OpenAI's Batch API on the gateway, driven by the official ``openai`` client unmodified
(``files.create``, ``batches.create/retrieve/list/cancel``, ``files.content``): a gateway over the
in-process engine, SQLite and the state directory's files; its batch runner on short intervals so the
tests wait on events, not minutes."""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from expired_files import expire_now, stored_keys
from harness import ACME_KEY, GLOBEX_KEY, MODEL, RunningGateway, start_gateway, wait_until
from metrics_text import read_metric
from s3_server import MotoS3, moto_s3  # noqa: F401  (pytest finds fixtures by name)

from gateway.batches.controller import COMPLETION_WINDOWS
from gateway.batches.results import result_file_id
from sluice.stores.batches.base import Batch, BatchStatus
from sluice.stores.openers import open_batch_store

TERMINAL = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def gateway(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(
        tmp_path_factory.mktemp("gateway_batches"),
        dev_checkpoint,
        engine_client="inprocess",
        max_prompt_tokens=256,
        max_output_tokens=1024,
        batch_lease_s=3.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
        batch_line_concurrency=2,
    )
    yield running
    running.stop()


def line(custom_id: str, prompt: str = "Hello", max_tokens: int = 8, **body: Any) -> str:
    request = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": request})


def upload(client: openai.OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.1)


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(raw) for raw in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_every_line_and_reports_a_malformed_one_in_the_error_file(
    gateway: RunningGateway,
) -> None:
    client = gateway.client()
    lines = [
        line("a"),
        line("b", prompt="Once upon a time", max_tokens=5),
        "{this is not json",
        line("c", max_tokens=100_000),  # over the limit: the error an interactive call gets
        line("d", seed=7, temperature=0.5),
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    done = wait_for(client, batch.id, TERMINAL)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 3, 2)
    assert done.completed_at is not None and done.in_progress_at is not None
    # Named by the batch, so a finish redone after a crash rewrites the same files.
    assert done.output_file_id == result_file_id(batch.id, "output")
    assert done.error_file_id == result_file_id(batch.id, "error")

    outputs = {o["custom_id"]: o for o in file_lines(client, done.output_file_id)}
    assert set(outputs) == {"a", "b", "d"}
    for custom_id, out in outputs.items():
        assert out["error"] is None and out["response"]["status_code"] == 200
        body = out["response"]["body"]
        assert body["object"] == "text_completion" and body["choices"][0]["text"]
        assert out["response"]["request_id"] == f"{batch.id}:{custom_id}"
    assert outputs["b"]["response"]["body"]["usage"]["completion_tokens"] <= 5

    errors = file_lines(client, done.error_file_id)
    by_id = {e["custom_id"]: e for e in errors}
    assert set(by_id) == {None, "c"}
    assert by_id[None]["response"] is None and by_id[None]["error"]["code"] == "invalid_json_line"
    assert by_id["c"]["response"]["status_code"] == 400
    assert by_id["c"]["response"]["body"]["error"]["param"] == "max_tokens"

    # One usage row per line that ran, keyed by batch and custom_id, at the batch class.
    rows = [r for r in gateway.usage(limit="1000")["data"] if r["request_id"].startswith(batch.id)]
    assert sorted(r["request_id"] for r in rows) == [f"{batch.id}:{c}" for c in ("a", "b", "d")]
    for row in rows:
        assert row["status"] == "finished" and row["request_class"] == "batch"
    records = [r for r in gateway.telemetry() if r.get("batch_id") == batch.id]
    assert sorted(r["custom_id"] for r in records) == ["a", "b", "d"]
    metrics_url = gateway.base_url + "/metrics"
    assert read_metric(metrics_url, "sluice_gateway_batch_lines_total", outcome="completed") >= 3
    assert read_metric(metrics_url, "sluice_gateway_batch_lines_total", outcome="invalid") >= 1
    assert read_metric(metrics_url, "sluice_gateway_batch_lines_total", outcome="failed") >= 1


def test_a_batch_cancelled_midway_keeps_what_finished_and_bills_each_line_once(
    gateway: RunningGateway,
) -> None:
    client = gateway.client()
    num_lines = 40
    lines = [line(f"n{i}", max_tokens=300, ignore_eos=True) for i in range(num_lines)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/completions", completion_window="24h"
    )
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2, 60, "two lines done")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in {"cancelling", "cancelled"}
    done = wait_for(client, batch.id, TERMINAL)
    assert done.status == "cancelled" and done.cancelled_at is not None

    counts = done.request_counts
    outputs = file_lines(client, done.output_file_id)
    errors = file_lines(client, done.error_file_id)
    assert counts.total == num_lines and counts.completed == len(outputs) >= 2
    assert counts.failed == len(errors) and counts.completed + counts.failed < num_lines
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
    ended = {o["custom_id"] for o in outputs} | {e["custom_id"] for e in errors}
    assert len(ended) == counts.completed + counts.failed

    # Every line that reached the engine has one row; the finished ones their whole output.
    rows = {
        r["request_id"]: r
        for r in gateway.usage(limit="1000")["data"]
        if r["request_id"].startswith(batch.id)
    }
    for out in outputs:
        row = rows[f"{batch.id}:{out['custom_id']}"]
        assert row["status"] == "finished" and row["output_tokens"] == 300
    assert set(rows) <= {f"{batch.id}:{c}" for c in ended}
    # Cancelling again changes nothing.
    assert client.batches.cancel(batch.id).status == "cancelled"


def test_batches_are_the_tenants_own(gateway: RunningGateway) -> None:
    acme = gateway.client()
    batch = acme.batches.create(
        input_file_id=upload(acme, [line("x")]), endpoint="/v1/completions", completion_window="24h"
    )
    globex = gateway.client(GLOBEX_KEY)
    with pytest.raises(openai.NotFoundError):
        globex.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        globex.batches.cancel(batch.id)
    assert batch.id not in {b.id for b in globex.batches.list()}
    assert batch.id in {b.id for b in acme.batches.list()}
    wait_for(acme, batch.id, TERMINAL)
    with pytest.raises(openai.NotFoundError):  # nor its result files
        globex.files.content(acme.batches.retrieve(batch.id).output_file_id or "")


def test_bad_batch_requests_get_clear_errors(gateway: RunningGateway) -> None:
    client = gateway.client()
    file_id = upload(client, [line("x")])
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert bad.value.body["param"] == "endpoint"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-" + "0" * 24, endpoint="/v1/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_a_file_whose_lines_share_a_custom_id_fails_the_batch_before_anything_runs(
    gateway: RunningGateway,
) -> None:
    client = gateway.client()
    batch = client.batches.create(
        input_file_id=upload(client, [line("same"), line("other"), line("same")]),
        endpoint="/v1/completions",
        completion_window="24h",
    )
    done = wait_for(client, batch.id, TERMINAL)
    assert done.status == "failed" and done.errors is not None
    assert [(e.code, e.line) for e in done.errors.data or []] == [("duplicate_custom_id", 3)]
    assert not [r for r in gateway.usage(limit="1000")["data"] if r["request_id"].startswith(batch.id)]


def test_a_batch_past_its_window_expires_reporting_every_line_it_did_not_finish(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The only window OpenAI offers is 24 h: shortened here (the gateway runs in this process).
    monkeypatch.setitem(COMPLETION_WINDOWS, "24h", timedelta(seconds=2))
    client = gateway.client()
    num_lines = 30
    lines = [line(f"e{i}", max_tokens=300, ignore_eos=True) for i in range(num_lines)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_for(client, batch.id, TERMINAL)
    assert done.status == "expired" and done.expired_at is not None
    counts = done.request_counts
    outputs = file_lines(client, done.output_file_id)
    errors = file_lines(client, done.error_file_id)
    assert counts.total == num_lines == counts.completed + counts.failed
    assert (len(outputs), len(errors)) == (counts.completed, counts.failed) and counts.failed > 0
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert sorted(x["custom_id"] for x in outputs + errors) == sorted(f"e{i}" for i in range(num_lines))


# ----- the batch's own input copy, and its result files' retention -----


def input_copies(gateway: RunningGateway) -> list[str]:
    return [key for key in stored_keys(gateway.state_dir) if key.endswith("/input.jsonl")]


@pytest.mark.parametrize("gone", ["deleted", "expired"])
def test_a_batch_keeps_running_when_its_input_file_is_deleted_or_expires(
    gateway: RunningGateway, gone: str
) -> None:
    client = gateway.client()
    file_id = upload(client, [line(f"r{i}", max_tokens=4) for i in range(3)])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
    assert f"batches/acme/{batch.id}/input.jsonl" in input_copies(gateway)  # copied before the response
    if gone == "deleted":
        client.files.delete(file_id)
    else:
        expire_now(gateway.state_dir, file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    done = wait_for(client, batch.id, TERMINAL)
    assert done.status == "completed", done
    assert done.input_file_id == file_id and done.request_counts.completed == 3
    assert sorted(o["custom_id"] for o in file_lines(client, done.output_file_id)) == ["r0", "r1", "r2"]
    assert f"batches/acme/{batch.id}/input.jsonl" not in input_copies(gateway)  # deleted once it ended


def test_with_files_in_s3_the_copy_is_s3s_and_outlives_the_input_file(
    dev_checkpoint: Path,
    tmp_path: Path,
    moto_s3: MotoS3,  # noqa: F811
) -> None:
    bucket = moto_s3.create_bucket()
    s3 = {"files_url": f"s3://{bucket}/sluice", "s3_endpoint_url": moto_s3.endpoint_url}
    running = start_gateway(
        tmp_path, dev_checkpoint, engine_client="inprocess", batch_poll_interval_s=0.2, **s3
    )

    def keys() -> list[str]:
        return [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])]

    try:
        client = running.client()
        file_id = upload(client, [line("s3", max_tokens=4)])
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        )
        client.files.delete(file_id)
        copy_key = f"sluice/batches/acme/{batch.id}/input.jsonl"
        assert copy_key in keys() or client.batches.retrieve(batch.id).status in TERMINAL
        done = wait_for(client, batch.id, TERMINAL)
        assert done.status == "completed" and [
            o["custom_id"] for o in file_lines(client, done.output_file_id)
        ] == ["s3"]
        assert copy_key not in keys()
    finally:
        running.stop()


def test_a_failed_batch_deletes_its_input_copy_too(gateway: RunningGateway) -> None:
    client = gateway.client()
    file_id = upload(client, [line("same"), line("same")])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
    assert wait_for(client, batch.id, TERMINAL).status == "failed"
    assert f"batches/acme/{batch.id}/input.jsonl" not in input_copies(gateway)


def insert_batch_of_before(gateway: RunningGateway, input_file_id: str) -> str:
    """A batch as a gateway of before created it (no input copy), written to the gateway's batch store."""
    batch_id = f"batch_{secrets.token_hex(16)}"
    now = datetime.now(UTC)
    batch = Batch(batch_id=batch_id, tenant_id="acme", endpoint="/v1/completions",
                  input_file_id=input_file_id, completion_window="24h", status=BatchStatus.VALIDATING,
                  created_at=now, expires_at=now + timedelta(hours=24))  # fmt: skip

    async def insert() -> None:
        store = await open_batch_store(gateway.gw.settings)
        try:
            await store.create(batch)
        finally:
            await store.close()

    asyncio.run(insert())
    return batch_id


def test_a_batch_created_before_input_copies_reads_its_input_file(gateway: RunningGateway) -> None:
    client = gateway.client()
    kept = upload(client, [line("old", max_tokens=4)])
    done = wait_for(client, insert_batch_of_before(gateway, kept), TERMINAL)
    assert done.status == "completed" and [
        o["custom_id"] for o in file_lines(client, done.output_file_id)
    ] == ["old"]
    deleted = upload(client, [line("old", max_tokens=4)])
    client.files.delete(deleted)  # a batch of before depends on its file staying, as it always did
    failed = wait_for(client, insert_batch_of_before(gateway, deleted), TERMINAL)
    assert failed.status == "failed" and failed.errors is not None
    assert failed.errors.data[0].code == "invalid_file"


def test_output_expires_after_sets_the_result_files_expiry(gateway: RunningGateway) -> None:
    client = gateway.client()
    batch = client.batches.create(
        input_file_id=upload(client, [line("ok", max_tokens=4), "{not json"]),
        endpoint="/v1/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    done = wait_for(client, batch.id, TERMINAL)
    assert done.output_file_id is not None and done.error_file_id is not None
    for file_id in (done.output_file_id, done.error_file_id):
        result = client.files.retrieve(file_id)
        assert result.purpose == "batch_output" and result.expires_at == result.created_at + 7200
    plain = client.batches.create(
        input_file_id=upload(client, [line("ok", max_tokens=4)]),
        endpoint="/v1/completions",
        completion_window="24h",
    )
    output_file_id = wait_for(client, plain.id, TERMINAL).output_file_id
    assert output_file_id is not None and client.files.retrieve(output_file_id).expires_at is None


@pytest.mark.parametrize(
    ("output_expires_after", "param"),
    [
        ({"anchor": "last_active_at", "seconds": 7200}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 2592001}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 7200.5}, "output_expires_after.seconds"),
        ({"anchor": "created_at"}, "output_expires_after"),
        ({"anchor": "created_at", "seconds": 7200, "extra": 1}, "output_expires_after"),
        ("7200", "output_expires_after"),
    ],
)
def test_a_bad_output_expires_after_is_400_naming_the_field(
    gateway: RunningGateway, output_expires_after: object, param: str
) -> None:
    client = gateway.client()
    file_id = upload(client, [line("x")])
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h",
            "output_expires_after": output_expires_after}  # fmt: skip
    copies_before = set(input_copies(gateway))
    with gateway.http() as http:
        resp = http.post("/v1/batches", json=body, headers={"Authorization": f"Bearer {ACME_KEY}"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].startswith(param), error
    assert set(input_copies(gateway)) <= copies_before  # refused before the input is copied
