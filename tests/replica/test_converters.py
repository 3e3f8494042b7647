"""The replica's pure converters (replica_converters.py beside the CPU engine's model.py), without a
server; tests/replica/conftest.py puts that folder on sys.path as Triton's Python backend does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from replica_converters import (
    COUNTER_FAMILIES,
    EngineRequest,
    counter_totals,
    error_tensors,
    gauge_values,
    parameters_from_config,
    request_from_tensors,
    response_tensors,
)

from cpu_engine.config import EngineConfig
from cpu_engine.engine_thread import StreamDelta, StreamError, error_kind
from cpu_engine.stats import EngineStats
from sluice.engine_client import EngineErrorKind, EnginePriority, FinishReason
from sluice.triton.client import request_tensors
from sluice.wire import ERROR_OUTPUTS, FINAL_OUTPUTS, LOGPROB_OUTPUTS, TOKEN_OUTPUTS, TokenLogprob

VOCAB = 8192


def convert(
    prompt: list[int] | None = None, max_tokens: int = 8, cache_scope: str = "acme", **kwargs: Any
) -> EngineRequest:
    tensors = request_tensors(prompt or [5, 6, 7], max_tokens, cache_scope=cache_scope, **kwargs)
    return request_from_tensors(tensors, VOCAB)


def test_defaults_are_greedy_and_interactive() -> None:
    req = convert(prompt=[1, 2, 3], max_tokens=9)
    assert req.prompt_token_ids == [1, 2, 3] and req.streaming
    assert req.params.max_tokens == 9 and req.params.greedy and req.params.stop_token_ids == ()
    assert req.priority is EnginePriority.UNDER_SHARE and req.cache_scope == "acme"


def test_a_request_without_a_cache_scope_is_refused() -> None:
    """No shared default scope: a caller that forgot its tenant must not share everyone's prefixes."""
    tensors = request_tensors([5, 6, 7], 4, cache_scope="acme")
    del tensors["cache_scope"]
    with pytest.raises(ValueError, match="'cache_scope' is required"):
        request_from_tensors(tensors, VOCAB)
    with pytest.raises(ValueError, match="cache_scope must not be empty"):
        convert(cache_scope="")


@pytest.mark.parametrize("temperature", [1e-310, 1e-30, 1e-6])
def test_a_tiny_positive_temperature_is_greedy(temperature: float) -> None:
    params = convert(temperature=temperature, top_p=0.9).params
    assert params.greedy and params.temperature >= 0


def test_sampling_inputs_follow_tensorrt_llm() -> None:
    assert not convert(top_p=0.9).params.greedy  # any sampling input: temperature defaults to 1
    assert convert(top_p=0.0).params.top_p == 1.0  # 0 is "no top-p cut"
    assert convert(temperature=0.0, top_k=5).params.greedy
    params = convert(temperature=0.5, top_k=40, top_p=0.75, seed=2**63 + 5).params
    assert (params.temperature, params.top_k, params.top_p, params.seed) == (0.5, 40, 0.75, 2**63 + 5)


def test_end_id_joins_the_stop_ids_unless_eos_is_ignored() -> None:
    assert convert(end_id=2, stop_token_ids=[9, 2]).params.stop_token_ids == (9, 2)
    ignoring = convert(end_id=2, stop_token_ids=[9], ignore_eos=True).params
    assert ignoring.stop_token_ids == (9,) and ignoring.ignore_eos


def test_extras_priority_scope_and_streaming() -> None:
    req = convert(priority=2, cache_scope="acme", streaming=False)
    assert req.priority is EnginePriority.BATCH and req.cache_scope == "acme" and not req.streaming
    assert convert(priority=1, cache_scope="acme").priority is EnginePriority.OVER_SHARE


def test_input_lengths_trims_padding() -> None:
    tensors = request_tensors([4, 5, 6, 0, 0], 3, cache_scope="acme")
    tensors["input_lengths"] = np.array([[3]], dtype=np.int32)
    assert request_from_tensors(tensors, VOCAB).prompt_token_ids == [4, 5, 6]


def test_a_prompt_must_leave_room_for_output() -> None:
    tensors = request_tensors(list(range(3, 13)), 4, cache_scope="acme")
    assert len(request_from_tensors(tensors, VOCAB, max_context_tokens=11).prompt_token_ids) == 10
    with pytest.raises(ValueError, match="a prompt of 10 tokens reaches the model's context of 10"):
        request_from_tensors(tensors, VOCAB, max_context_tokens=10)


def test_shapes_without_the_batch_dimension_are_accepted() -> None:
    tensors = {k: v.reshape(-1) for k, v in request_tensors([4, 5], 3, cache_scope="acme").items()}
    assert request_from_tensors(tensors, VOCAB).prompt_token_ids == [4, 5]


def _edit(**changes: np.ndarray | None) -> dict[str, np.ndarray]:
    tensors = request_tensors([5, 6, 7], 4, cache_scope="acme")
    for name, value in changes.items():
        if value is None:
            tensors.pop(name)
        else:
            tensors[name] = value
    return tensors


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (_edit(input_ids=None), "input 'input_ids' is required"),
        (_edit(bogus=np.zeros(1)), "unknown input(s): bogus"),
        (_edit(input_ids=np.array([[1, 2], [3, 4]], np.int32)), "batch size 1"),
        (_edit(input_ids=np.array([[1.0, 2.0]], np.float32)), "input_ids must be integers"),
        (_edit(input_ids=np.array([[1, -2, 3]], np.int32)), "input_ids[1] = -2 is outside the vocabulary"),
        (_edit(input_lengths=np.array([[9]], np.int32)), "input_lengths must be in [1, 3]"),
        (_edit(request_output_len=np.array([[0]], np.int32)), "max_tokens must be at least 1"),
        (_edit(stop_token_ids=np.array([[VOCAB]], np.int32)), "stop_token_ids[0] = 8192"),
        (_edit(end_id=np.array([[-1]], np.int32)), "end_id[0] = -1"),
        (_edit(priority=np.array([[3]], np.int32)), "priority must be one of [0, 1, 2]"),
        (_edit(temperature=np.array([[np.nan]], np.float32)), "temperature must be finite"),
        (_edit(temperature=np.array([[-1.0]], np.float32)), "temperature must be >= 0"),
        (_edit(runtime_top_k=np.array([[-1]], np.int32)), "top_k must be >= 0"),
        (_edit(cache_scope=np.array([[b"\xff"]], np.object_)), "cache_scope must be UTF-8"),
        (_edit(cache_scope=np.array([[b"x" * 300]], np.object_)), "at most 256 bytes"),
        (_edit(streaming=np.array([[1.0]], np.float32)), "streaming must hold one boolean"),
    ],
)
def test_bad_requests_raise_clear_value_errors(tensors: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ValueError) as info:
        request_from_tensors(tensors, VOCAB)
    assert message in str(info.value)


def test_response_tensors_mirror_tensorrt_llm_shapes() -> None:
    out = response_tensors(StreamDelta([7, 8, 9], False, None, 12, 3, 4), [7, 8, 9])
    assert set(out) == {"output_ids", "sequence_length"}
    assert out["output_ids"].shape == (1, 1, 3) and out["output_ids"].dtype == np.int32
    assert out["sequence_length"].tolist() == [[3]]
    final = StreamDelta([9], True, FinishReason.STOP, 12, 5, 4, answer_finished=True)
    out = response_tensors(final, [9])
    assert set(out) == {*TOKEN_OUTPUTS, *FINAL_OUTPUTS}
    assert out["finish_reason"].tolist() == [[b"stop"]]
    assert out["num_prompt_tokens"].tolist() == [[12]] and out["num_cached_tokens"].tolist() == [[4]]
    assert response_tensors(final, [])["output_ids"].shape == (1, 1, 0)


def test_logprobs_and_the_answer_index_travel_beside_the_tokens() -> None:
    delta = StreamDelta([7, 8], False, None, 12, 2, 0, index=2)
    logprobs = [TokenLogprob(-0.5, ((7, -0.5), (3, -1.5))), TokenLogprob(-2.0, ((1, -0.25), (8, -2.0)))]
    out = response_tensors(delta, [7, 8], logprobs)
    assert set(out) == {*TOKEN_OUTPUTS, *LOGPROB_OUTPUTS, "sequence_index"}
    assert out["output_log_probs"].tolist() == [[[-0.5, -2.0]]]
    assert out["top_logprob_ids"].shape == (1, 1, 2, 2) and out["top_logprob_ids"].tolist() == [
        [[[7, 3], [1, 8]]]
    ]
    assert out["top_logprobs"].tolist() == [[[[-0.5, -1.5], [-0.25, -2.0]]]]
    assert out["sequence_index"].tolist() == [[2]]
    plain = response_tensors(StreamDelta([7], False, None, 12, 1, 0), [7], [TokenLogprob(-0.5)])
    assert set(plain) == {*TOKEN_OUTPUTS, "output_log_probs"}  # no alternatives asked: none sent


def test_every_finish_reason_travels_as_its_own_value() -> None:
    """The engine ends sequences with the wire's ``FinishReason`` itself: no map between two enums."""
    for reason in FinishReason:
        final = StreamDelta([], True, reason, 3, 0, 0, answer_finished=True)
        assert FinishReason(response_tensors(final, [])["finish_reason"].item().decode()) is reason


def test_errors_travel_as_a_kind_field_and_a_message() -> None:
    out = error_tensors(EngineErrorKind.INVALID_REQUEST, "input_ids[1] = -2 is outside the vocabulary")
    assert tuple(out) == ERROR_OUTPUTS
    assert out["error_kind"].tolist() == [[b"invalid_request"]] and out["error_kind"].dtype == np.object_
    assert out["error_message"].item() == b"input_ids[1] = -2 is outside the vocabulary"
    assert error_tensors(EngineErrorKind.ENGINE_ERROR, "caf\u00e9")["error_message"].item() == "café".encode()
    # Only a refusal is the caller's fault; the engine stopping or failing a step is the engine's.
    assert error_kind(StreamError.INVALID_REQUEST) is EngineErrorKind.INVALID_REQUEST
    assert error_kind(StreamError.ENGINE_ERROR) is EngineErrorKind.ENGINE_ERROR
    assert error_kind(StreamError.ENGINE_STOPPED) is EngineErrorKind.ENGINE_ERROR
    assert error_kind(None) is EngineErrorKind.ENGINE_ERROR


def _params(**overrides: str) -> dict[str, dict[str, str]]:
    raw = {
        "checkpoint_dir": "/ckpt",
        "num_kv_blocks": "64",
        "block_size_tokens": "16",
        "step_token_budget": "256",
        "max_num_running": "8",
        "target_step_ms": "",
        "prefill_step_stretch": "2.0",
        "stats_interval_ms": "100",
        "cancellation_check_period_ms": "0",
        "yield_send_interval_ms": "50",
        "dtype": "auto",
    } | overrides
    return {k: {"string_value": v} for k, v in raw.items()}


def test_parameters_parse_into_an_engine_config() -> None:
    parsed = parameters_from_config(_params())
    assert parsed.checkpoint_dir == Path("/ckpt") and parsed.stats_interval_ms == 100.0
    assert parsed.engine.num_kv_blocks == 64 and parsed.engine.max_num_running == 8
    assert parsed.engine.target_step_ms is None
    assert parameters_from_config(_params(target_step_ms="25")).engine.target_step_ms == 25.0
    with pytest.raises(ValueError, match="'num_kv_blocks' must be an integer"):
        parameters_from_config(_params(num_kv_blocks="lots"))
    with pytest.raises(ValueError, match="'max_num_running' is missing"):
        parameters_from_config({k: v for k, v in _params().items() if k != "max_num_running"})


def test_the_prefill_step_stretch_parameter_reaches_the_engine_config() -> None:
    assert parameters_from_config(_params()).engine.prefill_step_stretch == 2.0
    assert parameters_from_config(_params(prefill_step_stretch="1.5")).engine.prefill_step_stretch == 1.5
    assert parameters_from_config(_params(prefill_step_stretch="")).engine.prefill_step_stretch is None
    # A repository rendered before the parameter existed: the engine's default.
    older = {k: v for k, v in _params().items() if k != "prefill_step_stretch"}
    assert parameters_from_config(older).engine.prefill_step_stretch == EngineConfig.prefill_step_stretch
    with pytest.raises(ValueError, match="'prefill_step_stretch' must be a number"):
        parameters_from_config(_params(prefill_step_stretch="lots"))
    with pytest.raises(ValueError, match="prefill_step_stretch must be >= 1"):
        parameters_from_config(_params(prefill_step_stretch="0.5"))


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16"])
def test_the_dtype_parameter_reaches_the_engine_config(dtype: str) -> None:
    assert parameters_from_config(_params(dtype=dtype)).engine.dtype == dtype


def test_a_missing_or_unknown_dtype_parameter_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="model parameter 'dtype' must be one of auto, float32, bfloat16"):
        parameters_from_config(_params(dtype="fp16"))
    with pytest.raises(ValueError, match="'dtype' is missing"):
        parameters_from_config({k: v for k, v in _params().items() if k != "dtype"})


def test_stats_become_trt_llm_gauges_and_sluice_counters() -> None:
    stats = EngineStats(
        num_blocks_max=100, num_blocks_used=25, num_blocks_free=75, tokens_per_block=16,
        num_running=3, num_waiting=2, num_scheduled=3, num_context=1, running_cap=64,
        num_preemptions_total=4, num_steps_total=10, num_generated_tokens_total=30,
        num_prefix_query_tokens_total=200, num_prefix_hit_tokens_total=50, step_ms_sum=123.0,
    )  # fmt: skip
    gauges = gauge_values(stats)
    assert gauges[("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction")] == 0.25
    assert gauges[("nv_trt_llm_request_metrics", "request_type", "active")] == 5
    assert gauges[("nv_trt_llm_request_metrics", "request_type", "max")] == 64
    totals = counter_totals(stats)
    assert set(totals) == set(COUNTER_FAMILIES)
    assert totals["sluice_engine_preemptions_total"] == 4 and totals["sluice_engine_step_ms_total"] == 123.0


def test_the_prefill_num_threads_parameter_reaches_the_engine_config() -> None:
    cores = len(os.sched_getaffinity(0))
    assert parameters_from_config(_params(prefill_num_threads="auto")).engine.prefill_num_threads == cores
    assert parameters_from_config(_params(prefill_num_threads="3")).engine.prefill_num_threads == 3
    assert parameters_from_config(_params(prefill_num_threads="")).engine.prefill_num_threads is None
    # A repository rendered before the parameter existed: every step on the server's OMP_NUM_THREADS.
    assert parameters_from_config(_params()).engine.prefill_num_threads is None
    with pytest.raises(ValueError, match="'prefill_num_threads' must be an integer"):
        parameters_from_config(_params(prefill_num_threads="many"))
    with pytest.raises(ValueError, match="prefill_num_threads must be in"):
        parameters_from_config(_params(prefill_num_threads="0"))
