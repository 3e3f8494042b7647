"""One tenant floods a saturated replica (a real tritonserver); another tenant's request still starts
while the flood runs.

The gateway's latency target is set far below what the replica can do (10 us), so the replica is "slow"
from the flood's first tokens on and the dispatch gate closes. Alone, the flooding tenant holds its
first request within its share and the rest as borrowed capacity (engine priority OVER_SHARE); the quiet
tenant's request is UNDER_SHARE and a minority, so it goes ahead of the flood instead of waiting for the
flood to drain (before issue 10 it waited for every flood stream to end: the gate opens only when the
replica holds nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import ACME_KEY, GLOBEX_KEY, MODEL, RunningGateway, start_gateway

from replicas.launcher import TritonServer

NUM_FLOOD_STREAMS = 4
FLOOD_TOKENS = 900  # 4 x 900 tokens fit the test replica's 4,096-token KV pool


@pytest.fixture
def slow_replica_gateway(
    dev_checkpoint: Path, replica: TritonServer, tmp_path: Path
) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine_client="triton",
        triton_grpc_url=replica.grpc_url,
        itl_target_ms=0.01,
        max_prompt_tokens=256,
        max_output_tokens=1024,
    )
    yield gateway
    gateway.stop()


async def _stream(
    client: httpx.AsyncClient, key: str, prompt: str, num_tokens: int, started: asyncio.Event | None = None
) -> tuple[float, float, float]:
    """When (perf_counter) it was sent, its first text chunk came, and it ended."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": num_tokens, "ignore_eos": True, "stream": True,
            "temperature": 0.0}  # fmt: skip
    sent = time.perf_counter()
    first: float | None = None
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if first is None and line.startswith('data: {"') and '"text":""' not in line:
                first = time.perf_counter()
                if started is not None:
                    started.set()
    assert first is not None
    return sent, first, time.perf_counter()


def test_a_quiet_tenant_starts_while_a_flood_holds_the_replica(slow_replica_gateway: RunningGateway) -> None:
    async def scenario() -> tuple[tuple[float, float, float], list[tuple[float, float, float]]]:
        limits = httpx.Limits(max_connections=NUM_FLOOD_STREAMS + 4)
        base_url = slow_replica_gateway.base_url
        async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
            flooding = asyncio.Event()
            flood = [
                asyncio.create_task(_stream(client, GLOBEX_KEY, f"Flood {i}", FLOOD_TOKENS, flooding))
                for i in range(NUM_FLOOD_STREAMS)
            ]
            await flooding.wait()
            await asyncio.sleep(0.05)  # the gate has seen the flood's inter-token gaps: it is closed
            quiet = await _stream(client, ACME_KEY, "Quiet", 4)
            return quiet, list(await asyncio.gather(*flood))

    (sent, first, _), flood = asyncio.run(scenario())
    quiet_ttft_s = first - sent
    flood_durations_s = [end - flood_first for _, flood_first, end in flood]
    # Without priorities the quiet request waits until the flood's streams have all ended (the gate
    # opens only when the replica holds nothing): most of a flood stream's duration.
    assert first < min(end for _, _, end in flood), (quiet_ttft_s, flood_durations_s)
    assert quiet_ttft_s < min(flood_durations_s) / 4, (quiet_ttft_s, flood_durations_s)
