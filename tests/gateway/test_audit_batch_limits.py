"""Audit: a batch's limits hold before work. A tenant has at most ``SLUICE_BATCH_MAX_ACTIVE_PER_TENANT``
batches queued or running (one more is 429 ``too_many_batches``, other tenants unaffected, and a batch
that ended frees its place), so one tenant cannot queue thousands and hold every other tenant's second
batch behind them in the runners' claim order; a request line over the JSON body limit of an interactive
call (``SLUICE_MAX_BODY_BYTES``) is an error line, unparsed, and the rest run."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import GLOBEX_KEY, MODEL, start_gateway

from gateway.batches.lines import parse_input
from sluice.domain import Tenant
from sluice.engine_client import Delta, GenerateRequest
from sluice.settings import Settings
from sluice.stores.tenants.store import SqliteTenantStore
from sluice.text import TextCodec

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def line(custom_id: str, prompt: str = "Hello", max_tokens: int = 4) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


def create(client: openai.OpenAI, lines: list[str]) -> Any:
    data = ("\n".join(lines) + "\n").encode()
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
    return client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")


def wait_for(client: openai.OpenAI, batch_id: str, statuses: set[str]) -> Any:
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    return batch


def test_a_tenant_at_its_active_batch_cap_gets_429_and_others_do_not(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    running = start_gateway(tmp_path, dev_checkpoint, batch_runner=False, batch_max_active_per_tenant=2)
    try:
        acme = running.client()
        first, second = create(acme, [line("a")]), create(acme, [line("b")])
        with pytest.raises(openai.RateLimitError) as refused:
            create(acme, [line("c")])
        error = refused.value.body
        assert isinstance(error, dict) and error["code"] == "too_many_batches"
        assert "SLUICE_BATCH_MAX_ACTIVE_PER_TENANT=2" in error["message"]
        assert {b.id for b in acme.batches.list()} == {first.id, second.id}  # nothing was queued
        create(running.client(GLOBEX_KEY), [line("g")])  # another tenant's cap is its own
    finally:
        running.stop()


def test_a_batch_that_ended_frees_its_place(dev_checkpoint: Path, tmp_path: Path) -> None:
    running = start_gateway(
        tmp_path,
        dev_checkpoint,
        batch_max_active_per_tenant=1,
        batch_lease_s=3.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
        batch_line_concurrency=1,
    )
    try:
        acme = running.client()
        long_batch = create(acme, [line(f"q{i}", max_tokens=64) for i in range(200)])
        with pytest.raises(openai.RateLimitError):
            create(acme, [line("b")])
        acme.batches.cancel(long_batch.id)
        wait_for(acme, long_batch.id, TERMINAL)
        assert wait_for(acme, create(acme, [line("b")]).id, TERMINAL).status == "completed"
    finally:
        running.stop()


def test_a_line_over_the_body_limit_is_an_error_line_and_the_rest_run(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    running = start_gateway(
        tmp_path,
        dev_checkpoint,
        max_body_bytes=4096,
        batch_lease_s=3.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
    )
    try:
        acme = running.client()
        batch = wait_for(acme, create(acme, [line("small"), line("huge", prompt="y" * 8000)]).id, TERMINAL)
        assert batch.status == "completed"
        assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
        assert batch.error_file_id is not None
        [error_line] = [json.loads(raw) for raw in acme.files.content(batch.error_file_id).text.splitlines()]
        assert error_line["error"]["code"] == "line_too_large"
        assert "4096 bytes" in error_line["error"]["message"] and "yyyy" not in json.dumps(error_line)
    finally:
        running.stop()


def test_the_line_size_check_counts_bytes_not_characters() -> None:
    body = {"model": MODEL, "prompt": "€" * 100, "max_tokens": 4}  # 300 bytes of UTF-8 in the prompt
    raw = json.dumps({"custom_id": "euro", "method": "POST", "url": "/v1/completions", "body": body},
                     ensure_ascii=False)  # fmt: skip
    assert len(raw) < 250 < len(raw.encode()) < 600
    parsed = parse_input(raw.encode(), "/v1/completions", 10, max_line_bytes=250)
    assert [p.code for p in parsed.problems] == ["line_too_large"]
    parsed = parse_input(raw.encode(), "/v1/completions", 10, max_line_bytes=600)
    assert parsed.problems == [] and [b.custom_id for b in parsed.lines] == ["euro"]


def test_the_cap_is_a_setting_with_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().batch_max_active_per_tenant == 100
    monkeypatch.setenv("SLUICE_BATCH_MAX_ACTIVE_PER_TENANT", "7")
    assert Settings().batch_max_active_per_tenant == 7
    monkeypatch.setenv("SLUICE_BATCH_MAX_ACTIVE_PER_TENANT", "0")
    with pytest.raises(ValueError):
        Settings()


def create_tenants(state_dir: Path, *tenants: Tenant) -> list[str]:
    """The tenants in the gateway's tenant store (SQLite under ``state_dir``); their API keys."""

    async def create() -> list[str]:
        store = SqliteTenantStore(state_dir / "sluice.db")
        await store.open()
        try:
            return [await store.create(t) for t in tenants]
        finally:
            await store.close()

    return asyncio.run(create())


class InFlightEngine(ScriptedFakeEngine):
    """The scripted engine, counting the most requests it ran at once."""

    def __init__(self, token_id: int, interval_s: float) -> None:
        super().__init__(token_id, interval_s)
        self.num_in_flight = 0
        self.max_in_flight = 0

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        self.num_in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.num_in_flight)
        try:
            async for delta in super().generate(request):
                yield delta
        finally:
            self.num_in_flight -= 1


def test_a_tenants_concurrency_limit_holds_its_batch_lines(dev_checkpoint: Path, tmp_path: Path) -> None:
    """Lines go through the tenant's limits as its interactive calls do: a tenant allowed one request at
    a time runs one line at a time whatever the runner's line concurrency; the refused lines wait and run,
    none fails."""
    [key] = create_tenants(tmp_path, Tenant("one", "One", max_concurrent_requests=1))
    engine = InFlightEngine(TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0], interval_s=0.01)
    running = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=engine,
        batch_line_concurrency=4,
        batch_lease_s=3.0,
        batch_poll_interval_s=0.2,
        batch_flush_interval_s=0.2,
    )
    try:
        client = running.client(key)
        batch = wait_for(
            client, create(client, [line(f"q{i}", max_tokens=10) for i in range(6)]).id, TERMINAL
        )
        assert batch.status == "completed" and batch.request_counts.completed == 6
        assert engine.max_in_flight == 1
        retried = running.gw.metrics.registry.get_sample_value(
            "sluice_gateway_batch_line_retries_total", {"reason": "concurrent_requests_exceeded"}
        )
        assert retried is not None and retried > 0  # the runner did try more at once, and was held
    finally:
        running.stop()


def test_an_error_line_never_echoes_a_huge_field_name() -> None:
    huge = "k" * 5000
    on_the_line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", huge: 1})
    in_the_body = line("b").replace('"max_tokens"', f'"{huge}": 1, "max_tokens"')
    parsed = parse_input(f"{on_the_line}\n{in_the_body}\n".encode(), "/v1/completions", 10)
    assert [(p.custom_id, p.code) for p in parsed.problems] == [
        ("a", "invalid_request"),
        ("b", "invalid_request"),
    ]
    for problem in parsed.problems:
        assert "k" * 64 + "..." in problem.message and len(problem.message) < 200
