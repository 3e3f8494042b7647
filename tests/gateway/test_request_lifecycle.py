"""How a request ends: client gone, deadline, engine failure mid-stream. Each writes one usage row and one
telemetry record with the tokens actually produced, and cancels the engine call."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway

from cpu_engine.client import InProcessEngineClient
from sluice.text import TextCodec


def _used_blocks(gateway: RunningGateway) -> float:
    engine = gateway.gw.engine
    assert isinstance(engine, InProcessEngineClient) and engine.engine_thread is not None
    return engine.engine_thread.stats().kv_cache_block_metrics()["used"]


def test_closing_a_stream_cancels_the_engine_and_meters_the_partial_output(
    inprocess_gateway: RunningGateway,
) -> None:
    stream = inprocess_gateway.client().completions.create(
        model=MODEL, prompt="def main():\n", max_tokens=256, temperature=0.8, seed=1, stream=True
    )
    request_id = ""
    for i, chunk in enumerate(stream):
        request_id = chunk.id
        if i == 3:
            break
    assert _used_blocks(inprocess_gateway) > 0
    stream.close()
    deadline = time.monotonic() + 1.0
    while _used_blocks(inprocess_gateway) > 0:
        assert time.monotonic() < deadline, "the engine kept the sequence after the client left"
        time.sleep(0.01)
    row = inprocess_gateway.usage_row(request_id)
    assert row["status"] == "cancelled" and 4 <= row["output_tokens"] < 256
    [rec] = [r for r in inprocess_gateway.telemetry() if r["request_id"] == request_id]
    assert rec["outcome"] == "cancelled" and rec["output_tokens"] == row["output_tokens"]


@pytest.fixture(scope="module")
def codec(dev_checkpoint: Path) -> TextCodec:
    return TextCodec.from_checkpoint(dev_checkpoint)


@pytest.fixture
def slow_gateway(
    dev_checkpoint: Path, tmp_path: Path, codec: TextCodec
) -> Iterator[tuple[RunningGateway, ScriptedFakeEngine]]:
    engine = ScriptedFakeEngine(codec.encode("ab")[0], interval_s=0.02)
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=engine, request_deadline_s=0.3)
    yield gateway, engine
    gateway.stop()


def test_the_deadline_stops_generation_and_returns_what_was_produced(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    started = time.monotonic()
    resp = gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=200)
    assert time.monotonic() - started < 1.0
    assert resp.choices[0].finish_reason == "length" and resp.usage is not None
    assert 3 <= resp.usage.completion_tokens < 20
    row = gateway.usage_row(resp.id)
    assert row["status"] == "deadline" and row["output_tokens"] == resp.usage.completion_tokens
    assert engine.cancelled == [resp.id]


def test_an_engine_error_after_tokens_ends_the_stream_with_an_error_event(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    engine.fail_after = 3
    with httpx.Client(base_url=gateway.base_url, timeout=10) as http:
        resp = http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 50, "stream": True},
            headers={"Authorization": "Bearer sk-acme-dev"},
        )
    events = [line[len("data: ") :] for line in resp.text.splitlines() if line.startswith("data: ")]
    # The 3 tokens produced before the failure (held back by the output screen until then), then the error.
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == "ab" * 3 and '"error"' in events[-1] and "replica lost" in events[-1]
    assert "[DONE]" not in events
    request_id = httpx.Response(200, content=events[0]).json()["id"]
    row = gateway.usage_row(request_id)
    assert row["status"] == "failed" and row["output_tokens"] == 3
    # The official client surfaces the error event as an exception, not as a silent end.
    with pytest.raises(openai.APIError, match="replica lost"):
        list(gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=50, stream=True))


def test_an_engine_error_before_any_token_is_an_http_error(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    engine.fail_after = 0
    for stream in (True, False):
        with pytest.raises(openai.InternalServerError) as err:
            gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=5, stream=stream)
        assert err.value.code == "engine_error" and "replica lost" in err.value.message


def test_a_client_that_leaves_a_non_streaming_request_cancels_it(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    with pytest.raises(openai.APITimeoutError):
        gateway.client(timeout=0.1).completions.create(model=MODEL, prompt="x", max_tokens=100)
    deadline = time.monotonic() + 1.0
    while not engine.cancelled:
        assert time.monotonic() < deadline, "the engine call outlived the client"
        time.sleep(0.01)
    row = gateway.usage_row(engine.cancelled[0])
    assert row["status"] == "cancelled" and row["output_tokens"] < 100


def test_a_client_that_leaves_before_the_first_token_cancels_the_engine_call(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    engine.interval_s = 0.25  # the first token comes after the client has gone
    with pytest.raises(openai.APITimeoutError):
        gateway.client(timeout=0.1).completions.create(model=MODEL, prompt="x", max_tokens=100, stream=True)
    deadline = time.monotonic() + 1.0
    while not engine.cancelled:
        assert time.monotonic() < deadline, "the engine call outlived the client"
        time.sleep(0.01)
    row = gateway.usage_row(engine.cancelled[0])
    assert row["status"] == "cancelled" and row["output_tokens"] == 0


def test_ignore_eos_and_the_tenant_scope_reach_the_engine(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    client = gateway.client()
    client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"ignore_eos": True})
    client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert [r.sampling.ignore_eos for r in engine.requests] == [True, False]
    assert {r.cache_scope for r in engine.requests} == {"acme"}
