"""Pure converters between Triton tensors and the CPU engine (no Triton import, no threads, no I/O).

The tensor names mirror the TensorRT-LLM backend's ``tensorrt_llm`` model, so one client serves both
engines. The model has ``max_batch_size > 0``, so every tensor carries a leading batch dimension of 1
(``input_ids`` arrives as [1, N], ``output_ids`` leaves as [1, 1, T]: batch, beam, tokens).

Inputs (all optional but the first three and ``cache_scope``):

=====================  ======  ==================================================================
``input_ids``          INT32   prompt token ids
``input_lengths``      INT32   prompt length; ``input_ids[:input_lengths]`` is the prompt
``request_output_len`` INT32   maximum output tokens
``streaming``          BOOL    one response per step (coalesced) when true; one in all when false
``end_id``             INT32   one more end-of-sequence id (the model's own EOS ids always apply)
``pad_id``             INT32   accepted and ignored (one beam, no padding)
``temperature``        FP32    0 is greedy
``runtime_top_k``      INT32   0 is no top-k cut
``runtime_top_p``      FP32    0 or 1 is no top-p cut
``random_seed``        UINT64  seed for sampling
``stop_token_ids``     INT32   [-1] ids that end the sequence (Sluice's simple ``stop_words_list``)
``priority``           INT32   0 interactive within its tenant's share (default), 1 interactive over it,
                               2 batch; a class preempts lower ones to be admitted
``cache_scope``        BYTES   required: the tenant; prefix-cache blocks are shared only within one scope
``ignore_eos``         BOOL    keep generating past the EOS ids (and ``end_id``)
=====================  ======  ==================================================================

As in TensorRT-LLM, a request that gives none of ``temperature``, ``runtime_top_k``, ``runtime_top_p``
is decoded greedily; once any is given, a missing temperature is 1.0. A temperature below 1e-5
(``cpu_engine.sampling.MIN_SAMPLED_TEMPERATURE``) is greedy too.

``cache_scope`` must be given and non-empty: there is no shared default scope. config.pbtxt declares it
optional only so that a request without it gets this module's clear error, not Triton's generic one.

Outputs: ``output_ids`` INT32 [1, 1, T] and ``sequence_length`` INT32 [1, 1] (T, the tokens in *this*
response: the prompt is never echoed, i.e. TensorRT-LLM's ``exclude_input_in_output=true``). The
response that carries a request's last tokens also has ``finish_reason`` BYTES [1, 1] (stop, length or
abort), ``num_prompt_tokens`` and ``num_cached_tokens`` INT32 [1, 1] (prompt tokens served from the
prefix cache). An empty response flagged final ends every request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from cpu_engine.config import DTYPE_SETTINGS, EngineConfig
from cpu_engine.engine_thread import StreamDelta
from cpu_engine.sampling import PriorityClass, SamplingParams
from cpu_engine.stats import KV_CACHE_FAMILY, REQUEST_FAMILY, EngineStats

T = TypeVar("T")

MAX_CACHE_SCOPE_BYTES = 256

REQUIRED_INPUTS = ("input_ids", "input_lengths", "request_output_len")
OPTIONAL_INPUTS = (
    "streaming", "end_id", "pad_id", "temperature", "runtime_top_k", "runtime_top_p", "random_seed",
    "stop_token_ids", "priority", "cache_scope", "ignore_eos",
)  # fmt: skip
INPUT_NAMES = REQUIRED_INPUTS + OPTIONAL_INPUTS
OUTPUT_NAMES = ("output_ids", "sequence_length", "finish_reason", "num_prompt_tokens", "num_cached_tokens")


@dataclass(frozen=True)
class EngineRequest:
    """What ``EngineThread.submit`` needs, plus how the caller wants its responses."""

    prompt_token_ids: list[int]
    params: SamplingParams
    priority: PriorityClass
    cache_scope: str
    streaming: bool


def request_from_tensors(
    tensors: Mapping[str, np.ndarray], vocab_size: int, max_context_tokens: int | None = None
) -> EngineRequest:
    """Validate one request's tensors (name → array, absent optional inputs left out).

    Raises ``ValueError`` with a message fit for the caller on anything malformed, including a prompt
    that leaves no room for output in ``max_context_tokens``.
    """
    unknown = set(tensors) - set(INPUT_NAMES)
    if unknown:
        raise ValueError(f"unknown input(s): {', '.join(sorted(unknown))}")
    for name in REQUIRED_INPUTS:
        if name not in tensors:
            raise ValueError(f"input {name!r} is required")
    input_ids = _int_vector(tensors, "input_ids")
    num_prompt = _int_scalar(tensors, "input_lengths")
    if not 1 <= num_prompt <= input_ids.size:
        raise ValueError(f"input_lengths must be in [1, {input_ids.size}] (the size of input_ids)")
    if max_context_tokens is not None and num_prompt >= max_context_tokens:
        raise ValueError(
            f"a prompt of {num_prompt} tokens reaches the model's context of {max_context_tokens}"
        )
    prompt = input_ids[:num_prompt]
    _check_vocab("input_ids", prompt, vocab_size)

    ignore_eos = _bool_scalar(tensors, "ignore_eos", False)
    stop_ids = _int_vector(tensors, "stop_token_ids") if "stop_token_ids" in tensors else np.empty(0, int)
    _check_vocab("stop_token_ids", stop_ids, vocab_size)
    stop_token_ids = [int(t) for t in stop_ids]
    if "end_id" in tensors:
        end_id = _int_scalar(tensors, "end_id")
        _check_vocab("end_id", np.array([end_id]), vocab_size)
        if not ignore_eos:
            stop_token_ids.append(end_id)
    if "pad_id" in tensors:
        _int_scalar(tensors, "pad_id")  # validated for the caller's sake; one beam needs no padding

    sampled = any(n in tensors for n in ("temperature", "runtime_top_k", "runtime_top_p"))
    temperature = _float_scalar(tensors, "temperature", 1.0 if sampled else 0.0)
    top_p = _float_scalar(tensors, "runtime_top_p", 1.0)
    seed = _int_scalar(tensors, "random_seed") if "random_seed" in tensors else None
    if seed is not None and seed < 0:
        raise ValueError("random_seed must be >= 0")
    priority = _int_scalar(tensors, "priority") if "priority" in tensors else int(PriorityClass.INTERACTIVE)
    if priority not in tuple(PriorityClass):
        raise ValueError(f"priority must be one of {[int(p) for p in PriorityClass]}, got {priority}")
    params = SamplingParams(  # raises ValueError on out-of-range values
        max_tokens=_int_scalar(tensors, "request_output_len"),
        temperature=temperature,
        top_p=1.0 if top_p == 0.0 else top_p,  # TensorRT-LLM's "no top-p"
        top_k=_int_scalar(tensors, "runtime_top_k") if "runtime_top_k" in tensors else 0,
        seed=seed,
        stop_token_ids=tuple(dict.fromkeys(stop_token_ids)),
        ignore_eos=ignore_eos,
    )
    return EngineRequest(
        prompt_token_ids=[int(t) for t in prompt],
        params=params,
        priority=PriorityClass(priority),
        cache_scope=_cache_scope(tensors),
        streaming=_bool_scalar(tensors, "streaming", False),
    )


def response_tensors(token_ids: Sequence[int], final: StreamDelta | None = None) -> dict[str, np.ndarray]:
    """Output tensors for a response carrying ``token_ids``; ``final`` adds the request's totals."""
    out = {
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(token_ids)]], dtype=np.int32),
    }
    if final is not None:
        reason = final.finish_reason.value if final.finish_reason is not None else ""
        out["finish_reason"] = np.array([[reason.encode()]], dtype=np.object_)
        out["num_prompt_tokens"] = np.array([[final.num_prompt_tokens]], dtype=np.int32)
        out["num_cached_tokens"] = np.array([[final.num_cached_prompt_tokens]], dtype=np.int32)
    return out


def request_tensors(
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    *,
    streaming: bool = True,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    end_id: int | None = None,
    stop_token_ids: Sequence[int] = (),
    priority: int | None = None,
    cache_scope: str,
    ignore_eos: bool | None = None,
) -> dict[str, np.ndarray]:
    """The client's side of ``request_from_tensors``: input tensors with their batch dimension of 1.

    ``cache_scope`` (the tenant) is always sent; other arguments left as None are not, so the model's
    defaults apply.
    """
    out = {
        "input_ids": np.asarray(prompt_token_ids, dtype=np.int32).reshape(1, -1),
        "input_lengths": np.array([[len(prompt_token_ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "streaming": np.array([[streaming]], dtype=np.bool_),
    }
    scalars: dict[str, tuple[object, type]] = {
        "temperature": (temperature, np.float32),
        "runtime_top_k": (top_k, np.int32),
        "runtime_top_p": (top_p, np.float32),
        "random_seed": (seed, np.uint64),
        "end_id": (end_id, np.int32),
        "priority": (priority, np.int32),
        "ignore_eos": (ignore_eos, np.bool_),
    }
    for name, (value, dtype) in scalars.items():
        if value is not None:
            out[name] = np.array([[value]], dtype=dtype)
    if stop_token_ids:
        out["stop_token_ids"] = np.asarray(stop_token_ids, dtype=np.int32).reshape(1, -1)
    out["cache_scope"] = np.array([[cache_scope.encode()]], dtype=np.object_)
    return out


# ----- model parameters (config.pbtxt) -----
@dataclass(frozen=True)
class ModelParameters:
    """The model's ``parameters`` block, parsed: where the weights are and how the engine runs."""

    checkpoint_dir: Path
    engine: EngineConfig
    stats_interval_ms: float
    # 0: ask Triton whether each live request was cancelled once per engine step.
    cancellation_check_period_ms: float
    # While higher-priority work is live, a lower-priority stream is sent at most this often; 0: never held.
    yield_send_interval_ms: float


def parameters_from_config(raw: Mapping[str, Mapping[str, str]]) -> ModelParameters:
    """Parse config.pbtxt ``parameters`` (name → {"string_value": ...}); ``ValueError`` names the key."""
    values = {k: v.get("string_value", "") for k, v in raw.items()}
    checkpoint = values.get("checkpoint_dir", "")
    if not checkpoint:
        raise ValueError("model parameter 'checkpoint_dir' is missing")
    target = values.get("target_step_ms", "")
    # NOTE: a repository rendered before this parameter existed lacks it: the engine's default then.
    stretch = EngineConfig.prefill_step_stretch
    if values.get("prefill_step_stretch") is not None:
        stretch = _parse(values, "prefill_step_stretch", float) if values["prefill_step_stretch"] else None
    dtype = _parse(values, "dtype", str)
    if dtype not in DTYPE_SETTINGS:
        raise ValueError(f"model parameter 'dtype' must be one of {', '.join(DTYPE_SETTINGS)}, got {dtype!r}")
    engine = EngineConfig(
        dtype=dtype,
        block_size_tokens=_parse(values, "block_size_tokens", int),
        num_kv_blocks=_parse(values, "num_kv_blocks", int),
        step_token_budget=_parse(values, "step_token_budget", int),
        max_num_running=_parse(values, "max_num_running", int),
        target_step_ms=_parse(values, "target_step_ms", float) if target else None,
        prefill_step_stretch=stretch,
    )
    return ModelParameters(
        checkpoint_dir=Path(checkpoint),
        engine=engine,
        stats_interval_ms=_parse(values, "stats_interval_ms", float),
        cancellation_check_period_ms=_parse(values, "cancellation_check_period_ms", float),
        yield_send_interval_ms=_parse(values, "yield_send_interval_ms", float),
    )


def _parse(values: Mapping[str, str], key: str, cast: Callable[[str], T]) -> T:
    if key not in values:
        raise ValueError(f"model parameter {key!r} is missing")
    try:
        return cast(values[key])
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise ValueError(f"model parameter {key!r} must be {kind}, got {values[key]!r}") from None


# ----- metrics -----
def gauge_values(stats: EngineStats) -> dict[tuple[str, str, str], float]:
    """(family, label name, label value) → value, for the TensorRT-LLM gauge families."""
    out: dict[tuple[str, str, str], float] = {}
    for kind, value in stats.kv_cache_block_metrics().items():
        out[(KV_CACHE_FAMILY, "kv_cache_block_type", kind)] = float(value)
    for kind, value in stats.request_metrics().items():
        out[(REQUEST_FAMILY, "request_type", kind)] = float(value)
    return out


COUNTER_FAMILIES = {
    "sluice_engine_preemptions_total": "Sequences preempted for recompute",
    "sluice_engine_steps_total": "Engine steps run",
    "sluice_engine_step_ms_total": "Milliseconds spent in engine steps (divide by steps for the mean)",
    "sluice_engine_generated_tokens_total": "Tokens sampled",
    "sluice_prefix_cache_query_tokens_total": "Prompt tokens looked up in the prefix cache",
    "sluice_prefix_cache_hit_tokens_total": "Prompt tokens served from the prefix cache",
}


def counter_totals(stats: EngineStats) -> dict[str, float]:
    """Monotonic totals for ``COUNTER_FAMILIES``; the exporter increments counters by the difference."""
    return {
        "sluice_engine_preemptions_total": float(stats.num_preemptions_total),
        "sluice_engine_steps_total": float(stats.num_steps_total),
        "sluice_engine_step_ms_total": float(stats.step_ms_sum),
        "sluice_engine_generated_tokens_total": float(stats.num_generated_tokens_total),
        "sluice_prefix_cache_query_tokens_total": float(stats.num_prefix_query_tokens_total),
        "sluice_prefix_cache_hit_tokens_total": float(stats.num_prefix_hit_tokens_total),
    }


# ----- tensor helpers -----
def _flat(tensors: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    arr = np.asarray(tensors[name])
    # A leading batch dimension must be 1: the Python backend never merges requests.
    if arr.ndim >= 2 and arr.shape[0] != 1:
        raise ValueError(f"{name} must have batch size 1, got shape {list(arr.shape)}")
    return arr.reshape(-1)


def _int_vector(tensors: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    arr = _flat(tensors, name)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers, got {arr.dtype}")
    return arr


def _int_scalar(tensors: Mapping[str, np.ndarray], name: str) -> int:
    arr = _int_vector(tensors, name)
    if arr.size != 1:
        raise ValueError(f"{name} must hold one value, got {arr.size}")
    return int(arr[0])


def _float_scalar(tensors: Mapping[str, np.ndarray], name: str, default: float) -> float:
    if name not in tensors:
        return default
    arr = _flat(tensors, name)
    if arr.size != 1 or arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must hold one number")
    value = float(arr[0])
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite")
    return value


def _bool_scalar(tensors: Mapping[str, np.ndarray], name: str, default: bool) -> bool:
    if name not in tensors:
        return default
    arr = _flat(tensors, name)
    if arr.size != 1 or arr.dtype.kind not in "biu":
        raise ValueError(f"{name} must hold one boolean")
    return bool(arr[0])


def _check_vocab(name: str, ids: np.ndarray, vocab_size: int) -> None:
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {int(ids[i])} is outside the vocabulary [0, {vocab_size})")


def _cache_scope(tensors: Mapping[str, np.ndarray]) -> str:
    """The request's prefix-cache scope. Required and non-empty: a default scope would let every caller
    that forgot it share (and probe, by timing) each other's cached prompts."""
    if "cache_scope" not in tensors:
        raise ValueError(
            "input 'cache_scope' is required (the tenant: prefix-cache blocks are shared only within one "
            "scope, and there is no shared default)"
        )
    arr = _flat(tensors, "cache_scope")
    if arr.size != 1:
        raise ValueError("cache_scope must hold one string")
    raw = arr[0]
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, bytes | np.bytes_):
        raise ValueError("cache_scope must be bytes")
    if len(raw) > MAX_CACHE_SCOPE_BYTES:
        raise ValueError(f"cache_scope must be at most {MAX_CACHE_SCOPE_BYTES} bytes")
    if not raw:
        raise ValueError("cache_scope must not be empty (there is no shared default scope)")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("cache_scope must be UTF-8") from None
