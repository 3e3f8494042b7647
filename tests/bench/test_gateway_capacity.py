"""bench.gateway_capacity's pure parts (the sweep, the per message / token / request split, the fake's
lateness percentile) and the fake replica itself, served in-process and read by the engine client the
gateway uses: its responses decode on the fast path as the CPU engine model's do."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bench import fake_replica
from bench.gateway_capacity import LevelResult, per_message_token_request_us, sweep_counts
from sluice.engine_client import FinishReason, GenerateRequest, Sampling
from sluice.engine_client.triton import TritonEngineClient


def test_the_sweep_doubles_while_it_passes_then_bisects_twice() -> None:
    passes: dict[int, bool] = {}
    limit = 300  # what the "gateway" carries
    tried = []
    while (n := sweep_counts(100, passes, 4000)) is not None:
        tried.append(n)
        passes[n] = n <= limit
    assert tried == [100, 200, 400, 300, 350]


def test_the_sweep_goes_down_when_the_first_count_fails() -> None:
    assert sweep_counts(100, {100: False}, 4000) == 50
    assert sweep_counts(100, {100: False, 50: True}, 4000) == 75
    assert sweep_counts(100, {100: True, 200: True}, 200) is None  # the ceiling passed


def level(messages: int, tokens: int, requests: int, cpu_us: float) -> LevelResult:
    return LevelResult(
        streams=100, wall_s=10, tokens=tokens, messages=messages, requests=requests,
        offered_tokens_per_s=tokens / 10, gateway_cpu_s=cpu_us / 1e6, gateway_system_s=0,
        fake_cpu_s=0, client_cpu_s=0, gap_p50_ms=40, gap_p99_ms=41, period_ms=40, fake_late_p99_ms=0,
        errors=0,
    )  # fmt: skip


def test_the_split_recovers_per_message_token_and_request_costs() -> None:
    def cpu(m: int, t: int, r: int) -> float:
        return 90 * m + 4 * t + 4_000 * r

    runs = [(10_000, 10_000, 40), (10_000, 40_000, 40), (10_000, 10_000, 160)]
    a, b, r = per_message_token_request_us([level(m, t, q, cpu(m, t, q)) for m, t, q in runs])
    assert (round(a, 6), round(b, 6), round(r, 6)) == (90, 4, 4_000)


def test_the_fakes_lateness_percentile_reads_its_buckets() -> None:
    before = [0] * fake_replica.LATE_BUCKETS
    after = list(before)
    after[0], after[30] = 98, 2  # 98 sends within 100 µs, 2 about 3 ms late
    assert fake_replica.late_percentile_us(before, after, 50) == 100
    assert fake_replica.late_percentile_us(before, after, 99) == 3_100
    assert fake_replica.late_percentile_us(before, before, 99) == 0


def test_the_engine_client_streams_the_fakes_tokens_at_its_cadence() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = fake_replica.FakeConfig(interval_s=0.005, tokens_per_message=2, token_ids=(11, 12, 13))

    async def main() -> None:
        server = asyncio.create_task(fake_replica.serve(port, config))
        client = TritonEngineClient(f"127.0.0.1:{port}", "fake")
        try:
            for _ in range(100):  # until the server listens
                await client.start()
                if await client.ready():
                    break
                await client.close()
                await asyncio.sleep(0.05)
            request = GenerateRequest("r1", [1, 2, 3], Sampling(7), cache_scope="t")
            deltas = [d async for d in client.generate(request)]
        finally:
            await client.close()
            server.cancel()
            with pytest.raises(asyncio.CancelledError):
                await server
        assert [d.token_ids for d in deltas] == [[11, 12], [13, 11], [12, 13], [11]]
        assert deltas[-1].finish_reason is FinishReason.LENGTH
        assert (deltas[-1].num_prompt_tokens, deltas[-1].num_cached_tokens) == (3, 0)
        assert all(d.finish_reason is None for d in deltas[:-1])

    asyncio.run(main())
