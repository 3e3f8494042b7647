"""Issue 11: a finished request's usage row carries the latencies it saw (TTFT and its own inter-token
p95), so a rollout can compare model versions on live traffic from the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, start_gateway, wait_until

from sluice.domain import UsageRecord
from sluice.engine_client import Delta, FinishReason, GenerateRequest
from sluice.stores.ledger.store import SqliteLedger
from sluice.text import TextCodec


class ChunkedFakeEngine(ScriptedFakeEngine):
    """Emits ``num_tokens_per_delta`` tokens together every ``interval_s``, as a replica that streams in
    chunks does."""

    def __init__(self, token_id: int, interval_s: float, num_tokens_per_delta: int) -> None:
        super().__init__(token_id, interval_s)
        self.num_tokens_per_delta = num_tokens_per_delta

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        self.requests.append(request)
        for start in range(0, request.sampling.max_tokens, self.num_tokens_per_delta):
            await asyncio.sleep(self.interval_s)
            num_tokens = min(self.num_tokens_per_delta, request.sampling.max_tokens - start)
            last = start + num_tokens == request.sampling.max_tokens
            yield Delta([self.token_id] * num_tokens, FinishReason.LENGTH if last else None,
                        len(request.prompt_token_ids) if last else None)  # fmt: skip
        self.finished.append(request.request_id)


def ledger_row(state_dir: Path, request_id: str) -> UsageRecord:
    """The row as the ledger holds it (GET /v1/usage does not show latencies)."""

    async def read() -> UsageRecord:
        ledger = SqliteLedger(state_dir / "sluice.db")
        await ledger.open()
        try:
            rows = (await ledger.query("acme", limit=1000)).rows
        finally:
            await ledger.close()
        return next(r for r in rows if r.request_id == request_id)

    return asyncio.run(read())


def test_a_finished_requests_usage_row_carries_its_ttft_and_inter_token_p95(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    """Three chunks of 25 tokens, 20 ms apart: 74 inter-token gaps of which 72 are zero (tokens of one
    chunk). The row's p95 is over the two real gaps; with the zeros it would be 0."""
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    engine = ChunkedFakeEngine(token_id, interval_s=0.02, num_tokens_per_delta=25)
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=engine, dev_tenants=True)
    try:
        with gateway.client(ACME_KEY) as client:
            done = client.completions.create(model=MODEL, prompt="x", max_tokens=75)
        assert done.usage is not None and done.usage.completion_tokens == 75
        gateway.usage_row(done.id)  # written in the request's finally, maybe just after the response
        wait_until(lambda: any(r["request_id"] == done.id for r in gateway.telemetry()), 5.0, "telemetry")
        seen = next(r for r in gateway.telemetry() if r["request_id"] == done.id)
        row = ledger_row(tmp_path, done.id)
    finally:
        gateway.stop()
    assert row.ttft_ms is not None and row.ttft_ms >= 20.0  # the first chunk came after 20 ms
    assert row.ttft_ms == seen["ttft_ms"]  # one measurement, in the telemetry line and the usage row
    assert row.itl_p95_ms is not None and 15.0 <= row.itl_p95_ms <= seen["inter_token_max_ms"]
    assert seen["inter_token_p50_ms"] == 0.0  # what counting the chunks' zero gaps would have said
