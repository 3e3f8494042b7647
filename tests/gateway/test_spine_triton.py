"""The spine, end to end: the official openai client → the gateway → a real tritonserver over gRPC."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest
from harness import MODEL, RunningGateway, start_gateway
from metrics_text import read_metric, settled_count, used_kv_blocks
from openai.types.chat import ChatCompletionMessageParam
from ports import free_port

from replicas.launcher import TritonServer

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Write a loop."}]


def _num_inferences(replica: TritonServer) -> float:
    return read_metric(replica.metrics_url, "nv_inference_request_success", model=MODEL) + read_metric(
        replica.metrics_url, "nv_inference_request_failure", model=MODEL
    )


def test_non_stream(triton_gateway: RunningGateway) -> None:
    resp = triton_gateway.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)
    assert resp.choices[0].message.content is not None and resp.usage is not None
    assert 1 <= resp.usage.completion_tokens <= 8
    triton_gateway.usage_row(resp.id)
    [rec] = [r for r in triton_gateway.telemetry() if r["request_id"] == resp.id]
    assert rec["replica"] == triton_gateway.gw.engine.replica and rec["engine_client"] == "triton"
    assert rec["model_version"] == "1" and rec["ttft_ms"] > 0


def test_stream_with_include_usage_matches_non_stream(triton_gateway: RunningGateway) -> None:
    client = triton_gateway.client()
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == whole.choices[0].message.content
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert triton_gateway.usage_row(chunks[0].id)["status"] == "finished"


def test_bad_key_is_401(triton_gateway: RunningGateway) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        triton_gateway.client(api_key="sk-wrong").chat.completions.create(model=MODEL, messages=CHAT)
    assert err.value.code == "invalid_api_key"


def test_context_length_exceeded_never_reaches_triton(
    triton_gateway: RunningGateway, replica: TritonServer
) -> None:
    before = _num_inferences(replica)
    with pytest.raises(openai.BadRequestError) as err:
        triton_gateway.client().completions.create(model=MODEL, prompt="token " * 1000, max_tokens=4)
    assert err.value.code == "context_length_exceeded"
    triton_gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=1)  # one that does
    assert settled_count(lambda: _num_inferences(replica), before + 1) == before + 1


def test_a_stream_closed_early_frees_the_kv_blocks_and_meters_the_partial_output(
    triton_gateway: RunningGateway, replica: TritonServer
) -> None:
    stream = triton_gateway.client().completions.create(
        model=MODEL, prompt="def main():\n", max_tokens=256, temperature=0.8, seed=3, stream=True
    )
    request_id = ""
    for i, chunk in enumerate(stream):
        request_id = chunk.id
        if i == 3:
            break
    time.sleep(0.05)  # the replica exports stats every 20 ms in these tests
    assert used_kv_blocks(replica.metrics_url) > 0
    stream.close()
    closed = time.monotonic()
    while used_kv_blocks(replica.metrics_url) > 0:
        assert time.monotonic() - closed < 1.0, "the replica kept the sequence after the client left"
        time.sleep(0.01)
    row = triton_gateway.usage_row(request_id)
    assert row["status"] == "cancelled" and 4 <= row["output_tokens"] < 256


def test_concurrent_streams_each_get_their_own_tokens(triton_gateway: RunningGateway) -> None:
    """16 streams batched together in the engine: each caller gets exactly its own sequence back."""
    prompts = [f"def f{i}(x):\n    return x * {i}\n" for i in range(16)]
    client = triton_gateway.client()
    expected = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0).choices[0].text
        for p in prompts
    ]

    async def one(aclient: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await aclient.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream])

    async def run_all() -> list[str]:
        aclient = openai.AsyncOpenAI(
            base_url=triton_gateway.base_url + "/v1", api_key="sk-acme-dev", max_retries=0
        )
        try:
            return list(await asyncio.gather(*(one(aclient, p) for p in prompts)))
        finally:
            await aclient.close()

    assert asyncio.run(run_all()) == expected


def test_an_unreachable_replica_is_not_ready_and_answers_503(dev_checkpoint: Path, tmp_path: Path) -> None:
    gateway = start_gateway(
        tmp_path, dev_checkpoint, engine_client="triton", triton_grpc_url=f"127.0.0.1:{free_port()}"
    )
    try:
        with gateway.http() as http:
            ready = http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["replica_ready"] is False
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as err:
                gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=2, stream=stream)
            assert err.value.status_code == 503 and err.value.code == "replica_unavailable"
        assert gateway.usage()["totals"]["num_requests"] == 0  # nothing ran, nothing metered
        assert [r["outcome"] for r in gateway.telemetry()] == ["failed", "failed"]
    finally:
        gateway.stop()
