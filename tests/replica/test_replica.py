"""The CPU engine behind a real tritonserver, over gRPC streaming as the gateway calls it."""

from __future__ import annotations

import asyncio
import queue
import time
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpc_sync
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from cpu_engine.config import EngineConfig
from cpu_engine.cpu_features import detect_dtype
from cpu_engine.engine import LLMEngine
from cpu_engine.sampling import SamplingParams
from replicas.launcher import TritonServer
from replicas.render import CpuEngineModelSettings
from sluice.engine_client import EngineError, EngineErrorKind
from sluice.triton.client import GenerateStream, TokenChunk, request_tensors, to_infer_inputs

MODEL_NAME = CpuEngineModelSettings.model_name
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 8192, 40)]


def read_metric(server: TritonServer, family: str, **labels: str) -> float:
    """The value of the sample of ``family`` whose labels include ``labels``."""
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(family + "{") and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"no sample {family}{labels} in the metrics")


Aio = Callable[[Coroutine[Any, Any, Any]], Any]


def generate(aio: Aio, server: TritonServer, tensors: dict[str, np.ndarray]) -> list[TokenChunk]:
    async def run() -> list[TokenChunk]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            async with GenerateStream(client, MODEL_NAME, tensors, timeout_s=30) as stream:
                return [chunk async for chunk in stream]
        finally:
            await client.close()

    return aio(run())


def in_process_greedy(settings: CpuEngineModelSettings, prompt: list[int], max_tokens: int) -> list[int]:
    config = EngineConfig(num_kv_blocks=settings.num_kv_blocks, block_size_tokens=settings.block_size_tokens)
    engine = LLMEngine.from_checkpoint(settings.checkpoint_dir, config)
    engine.add_request("ref", prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    return tokens


def test_streamed_greedy_tokens_match_the_engine_in_process(
    aio: Aio, replica: TritonServer, model_settings: CpuEngineModelSettings
) -> None:
    chunks = generate(aio, replica, request_tensors(PROMPT, 24, ignore_eos=True, cache_scope="acme"))
    assert [t for c in chunks for t in c.token_ids] == in_process_greedy(model_settings, PROMPT, 24)
    assert all(c.token_ids for c in chunks)
    assert [c.finish_reason for c in chunks].count(None) == len(chunks) - 1
    last = chunks[-1]
    assert last.finish_reason == "length" and last.num_prompt_tokens == len(PROMPT)
    assert last.num_cached_tokens is not None


def test_non_streaming_gets_one_response_with_every_token(aio: Aio, replica: TritonServer) -> None:
    streamed = [
        t
        for c in generate(aio, replica, request_tensors(PROMPT, 16, ignore_eos=True, cache_scope="acme"))
        for t in c.token_ids
    ]
    chunks = generate(
        aio, replica, request_tensors(PROMPT, 16, streaming=False, ignore_eos=True, cache_scope="acme")
    )
    assert len(chunks) == 1
    assert chunks[0].token_ids == streamed and chunks[0].finish_reason == "length"


def test_stop_token_ends_the_sequence_with_stop(aio: Aio, replica: TritonServer) -> None:
    tokens = [
        t
        for c in generate(aio, replica, request_tensors(PROMPT, 16, ignore_eos=True, cache_scope="acme"))
        for t in c.token_ids
    ]
    chunks = generate(
        aio,
        replica,
        request_tensors(PROMPT, 16, stop_token_ids=[tokens[3]], ignore_eos=True, cache_scope="acme"),
    )
    assert [t for c in chunks for t in c.token_ids] == tokens[: tokens.index(tokens[3]) + 1]
    assert chunks[-1].finish_reason == "stop"


def test_every_request_ends_with_its_last_tokens_flagged_final(replica: TritonServer) -> None:
    """The final flag rides on the response with the last tokens (no empty final response even for a
    client that asks for one: python_backend sends a response and the flag together)."""
    responses: queue.SimpleQueue[tuple[object, object]] = queue.SimpleQueue()
    client = grpc_sync.InferenceServerClient(replica.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        inputs = to_infer_inputs(request_tensors(PROMPT, 4, ignore_eos=True, cache_scope="acme"))
        client.async_stream_infer(MODEL_NAME, inputs, request_id="r1", enable_empty_final_response=True)
        received = []
        num_tokens = 0
        while True:
            result, error = responses.get(timeout=30)
            assert error is None
            response = result.get_response()  # type: ignore[attr-defined]
            received.append(response)
            num_tokens += int(result.as_numpy("sequence_length").sum())  # type: ignore[attr-defined]
            if response.parameters["triton_final_response"].bool_param:
                break
        assert responses.empty()
    finally:
        client.stop_stream()
        client.close()
    # NOTE: how many responses carry the 4 tokens depends on timing (the sender coalesces what the engine
    # made since its last send); what is fixed is that all 4 arrive and the last one is flagged final.
    assert num_tokens == 4 and 1 <= len(received) <= 4
    assert all(r.outputs for r in received)
    assert not any(r.parameters["triton_final_response"].bool_param for r in received[:-1])


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            request_tensors([5, 9_999_999], 4, cache_scope="acme"),
            "input_ids[1] = 9999999 is outside the vocabulary [0, 8192)",
        ),
        (request_tensors([5, 6], 0, cache_scope="acme"), "max_tokens must be at least 1"),
        (request_tensors([5, 6], 4, priority=7, cache_scope="acme"), "priority must be one of [0, 1, 2]"),
        (request_tensors([5, 6], 4, top_p=1.5, cache_scope="acme"), "top_p must be in (0, 1]"),
        (
            request_tensors([5] * 2048, 4, cache_scope="acme"),
            "a prompt of 2048 tokens reaches the model's context of 2048",
        ),
    ],
)
def test_bad_input_gets_a_clear_error(aio: Aio, replica: TritonServer, tensors: dict, message: str) -> None:
    """The model's refusal arrives as a response whose error_kind field says it is the caller's fault."""
    with pytest.raises(EngineError) as info:
        generate(aio, replica, tensors)
    assert info.value.kind is EngineErrorKind.INVALID_REQUEST and message in info.value.message


def test_missing_input_ids_is_refused(aio: Aio, replica: TritonServer) -> None:
    tensors = request_tensors([5, 6], 4, cache_scope="acme")
    del tensors["input_ids"]
    with pytest.raises(EngineError) as info:
        generate(aio, replica, tensors)
    assert info.value.kind is EngineErrorKind.INVALID_REQUEST
    assert "input 'input_ids' is required" in info.value.message


def test_a_request_without_a_cache_scope_is_refused(aio: Aio, replica: TritonServer) -> None:
    tensors = request_tensors([5, 6], 4, cache_scope="acme")
    del tensors["cache_scope"]
    with pytest.raises(EngineError) as info:
        generate(aio, replica, tensors)
    assert (
        info.value.kind is EngineErrorKind.INVALID_REQUEST
        and "'cache_scope' is required" in info.value.message
    )


def test_tritons_own_errors_come_without_the_field(aio: Aio, replica: TritonServer) -> None:
    """What Triton refuses before the model (a tensor of the wrong type here) has no error_kind: the
    client raises Triton's error as is, and the engine client classifies it by status alone."""
    tensors = request_tensors([5, 6], 4, cache_scope="acme")
    tensors["request_output_len"] = tensors["request_output_len"].astype(np.float32)
    with pytest.raises(InferenceServerException) as info:
        generate(aio, replica, tensors)
    assert "request_output_len" in str(info.value)


def test_cancelling_the_call_frees_the_kv_blocks_within_a_second(aio: Aio, replica: TritonServer) -> None:
    tensors = request_tensors(PROMPT * 5, 1500, ignore_eos=True, cache_scope="acme")

    def used_blocks() -> float:
        return read_metric(replica, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")

    async def seconds_from_cancel_to_free_blocks() -> float:
        client = grpcclient.InferenceServerClient(replica.grpc_url)
        try:
            async with GenerateStream(client, MODEL_NAME, tensors) as stream:
                num_chunks = 0
                async for _ in stream:
                    num_chunks += 1
                    if num_chunks == 3:
                        break
                await asyncio.sleep(0.1)
                assert used_blocks() > 0  # leaving the loop alone does not end the call
            cancelled_at = time.monotonic()
            # The client stays open, so it is the cancelled call, not a closed channel, that frees them.
            while used_blocks() > 0 and time.monotonic() - cancelled_at < 3.0:
                await asyncio.sleep(0.01)
            return time.monotonic() - cancelled_at
        finally:
            await client.close()

    assert aio(seconds_from_cancel_to_free_blocks()) < 1.0
    assert used_blocks() == 0
    assert read_metric(replica, "nv_trt_llm_request_metrics", request_type="active") == 0


def test_metrics_families_are_exported(
    aio: Aio, replica: TritonServer, model_settings: CpuEngineModelSettings
) -> None:
    generate(aio, replica, request_tensors(PROMPT, 4, cache_scope="acme"))
    kv = {
        kind: read_metric(
            replica, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=kind, model=MODEL_NAME
        )
        for kind in ("max", "free", "used", "tokens_per", "fraction")
    }
    assert (
        kv["max"] == model_settings.num_kv_blocks
        and kv["tokens_per"] == 16
        and kv["free"] + kv["used"] == kv["max"]
    )
    for kind in ("active", "scheduled", "context", "waiting", "max"):
        read_metric(replica, "nv_trt_llm_request_metrics", request_type=kind)
    for name in (
        "sluice_engine_preemptions_total",
        "sluice_engine_steps_total",
        "sluice_engine_step_ms_total",
        "sluice_prefix_cache_query_tokens_total",
        "sluice_prefix_cache_hit_tokens_total",
    ):
        read_metric(replica, name)
    assert read_metric(replica, "sluice_engine_steps_total") > 0


def test_the_engine_dtype_and_cpu_flags_are_a_metric_label(replica: TritonServer) -> None:
    """The replica runs on this machine, so its "auto" resolves as detect_dtype does here (any CPU)."""
    choice = detect_dtype("auto")
    labels = {"dtype": choice.dtype, "requested_dtype": "auto", "cpu_flags": choice.cpu_flags_label}
    assert read_metric(replica, "sluice_engine_info", model=MODEL_NAME, **labels) == 1.0


def test_concurrent_streams_all_finish(aio: Aio, replica: TritonServer) -> None:
    async def run() -> list[list[TokenChunk]]:
        client = grpcclient.InferenceServerClient(replica.grpc_url)

        async def one(i: int) -> list[TokenChunk]:
            tensors = request_tensors(PROMPT[i:], 20, ignore_eos=True, cache_scope=f"tenant-{i % 2}")
            async with GenerateStream(client, MODEL_NAME, tensors, timeout_s=30) as stream:
                return [chunk async for chunk in stream]

        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await client.close()

    for chunks in aio(run()):
        assert sum(len(c.token_ids) for c in chunks) == 20 and chunks[-1].finish_reason == "length"


def test_two_servers_run_at_once(
    aio: Aio, replica: TritonServer, start_replica: Callable[[str], TritonServer]
) -> None:
    second = start_replica("second")
    try:
        assert replica.is_running() and second.is_running()
        tensors = request_tensors(PROMPT, 8, ignore_eos=True, cache_scope="acme")
        first_tokens = [t for c in generate(aio, replica, tensors) for t in c.token_ids]
        assert [t for c in generate(aio, second, tensors) for t in c.token_ids] == first_tokens
    finally:
        second.stop()
    assert not second.is_running() and replica.is_running()
