"""The replica's converters between the wire (``sluice.wire``: tensor names, finish
reasons, priorities, error kinds) and the CPU engine's own types: pure functions, no Triton import, no
threads, no I/O. They live beside model.py, the one user, and travel with it into the rendered model
repository; the gateway never imports them (nor the engine).

The tensors and their meaning are documented in ``sluice.wire``. Here: how the CPU engine
reads them. A temperature below ``cpu_engine.sampling.MIN_SAMPLED_TEMPERATURE`` (1e-5) is greedy, as is
a request with none of the sampling inputs; TensorRT-LLM's top-p of 0 is no cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from cpu_engine.config import DTYPE_SETTINGS, EngineConfig, prefill_num_threads_of
from cpu_engine.engine_thread import StreamDelta
from cpu_engine.sampling import SamplingParams
from cpu_engine.stats import KV_CACHE_FAMILY, REQUEST_FAMILY, EngineStats
from sluice.weights_digest import check_digest
from sluice.wire import (
    ERROR_OUTPUTS,
    INPUT_NAMES,
    REQUIRED_INPUTS,
    EngineErrorKind,
    EnginePriority,
    Guide,
    GuideKind,
    TokenLogprob,
)

T = TypeVar("T")

MAX_CACHE_SCOPE_BYTES = 256
MAX_GUIDE_BYTES = 256 * 1024  # a schema, regex or grammar; the gateway's own limit is lower


@dataclass(frozen=True)
class EngineRequest:
    """What ``EngineThread.submit`` needs, plus how the caller wants its responses."""

    prompt_token_ids: list[int]
    params: SamplingParams
    priority: EnginePriority
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
    priority = _int_scalar(tensors, "priority") if "priority" in tensors else int(EnginePriority.UNDER_SHARE)
    if priority not in {int(p) for p in EnginePriority}:
        raise ValueError(f"priority must be one of {[int(p) for p in EnginePriority]}, got {priority}")
    params = SamplingParams(  # raises ValueError on out-of-range values
        max_tokens=_int_scalar(tensors, "request_output_len"),
        temperature=temperature,
        top_p=1.0 if top_p == 0.0 else top_p,  # TensorRT-LLM's "no top-p"
        top_k=_int_scalar(tensors, "runtime_top_k") if "runtime_top_k" in tensors else 0,
        min_p=_float_scalar(tensors, "min_p", 0.0),
        seed=seed,
        stop_token_ids=tuple(dict.fromkeys(stop_token_ids)),
        ignore_eos=ignore_eos,
        presence_penalty=_float_scalar(tensors, "presence_penalty", 0.0),
        frequency_penalty=_float_scalar(tensors, "frequency_penalty", 0.0),
        repetition_penalty=_float_scalar(tensors, "repetition_penalty", 1.0),
        logit_bias=_logit_bias(tensors, vocab_size),
        guide=_guide(tensors),
        logprobs=_logprobs(tensors),
        prompt_logprobs=_bool_scalar(tensors, "return_prompt_log_probs", False),
        n=_int_scalar(tensors, "num_return_sequences") if "num_return_sequences" in tensors else 1,
    )
    return EngineRequest(
        prompt_token_ids=[int(t) for t in prompt],
        params=params,
        priority=EnginePriority(priority),  # the engine takes the wire's enum, as it reports FinishReason
        cache_scope=_cache_scope(tensors),
        streaming=_bool_scalar(tensors, "streaming", False),
    )


def response_tensors(
    delta: StreamDelta, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
) -> dict[str, np.ndarray]:
    """Output tensors for a response carrying ``token_ids`` of ``delta``'s answer (and their
    ``logprobs``, when asked); the answer's totals when it has finished, its index when the request asked
    for several."""
    out = {
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(token_ids)]], dtype=np.int32),
    }
    if logprobs is not None:
        out |= logprob_tensors(logprobs)
    if delta.prompt_logprobs is not None:
        out |= {
            f"prompt_{k.removeprefix('output_')}": v
            for k, v in logprob_tensors(delta.prompt_logprobs).items()
        }
    if delta.index:  # absent: the first answer (n = 1, or the first of n)
        out["sequence_index"] = np.array([[delta.index]], dtype=np.int32)
    if delta.answer_finished:
        reason = delta.finish_reason.value if delta.finish_reason is not None else ""
        out["finish_reason"] = np.array([[reason.encode()]], dtype=np.object_)
        out["num_prompt_tokens"] = np.array([[delta.num_prompt_tokens]], dtype=np.int32)
        out["num_cached_tokens"] = np.array([[delta.num_cached_prompt_tokens]], dtype=np.int32)
    return out


def logprob_tensors(logprobs: Sequence[TokenLogprob]) -> dict[str, np.ndarray]:
    """``output_log_probs`` [1, 1, T] and, when alternatives were asked, ``top_logprob_ids`` and
    ``top_logprobs`` [1, 1, T, K]."""
    out = {"output_log_probs": np.array([lp.logprob for lp in logprobs], dtype=np.float32).reshape(1, 1, -1)}
    k = len(logprobs[0].top) if logprobs else 0
    if k:
        out["top_logprob_ids"] = np.array(
            [[t for t, _ in lp.top] for lp in logprobs], dtype=np.int32
        ).reshape(1, 1, -1, k)
        out["top_logprobs"] = np.array([[v for _, v in lp.top] for lp in logprobs], dtype=np.float32).reshape(
            1, 1, -1, k
        )
    return out


def error_tensors(kind: EngineErrorKind, message: str) -> dict[str, np.ndarray]:
    """Output tensors of the one final response that ends a refused or failed request."""
    kind_tensor, message_tensor = ERROR_OUTPUTS
    return {
        kind_tensor: np.array([[kind.value.encode()]], dtype=np.object_),
        message_tensor: np.array([[message.encode("utf-8", "replace")]], dtype=np.object_),
    }


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
    # A stream's tokens wait at most this long to leave in one response (0: each as it is made) ...
    send_budget_ms: float = 0.0
    # ... and wait at all only while the live streams would otherwise make more responses a second than this.
    max_responses_per_s: float = 1000.0
    # What the checkpoint must digest to (sluice.weights_digest) before the model loads; None: not given.
    weights_digest: str | None = None


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
    # NOTE: a repository rendered before kv_cache_dtype existed lacks it: "auto" then.
    kv_cache_dtype = _parse(values, "kv_cache_dtype", str) if "kv_cache_dtype" in values else "auto"
    for name, value in (("dtype", dtype), ("kv_cache_dtype", kv_cache_dtype)):
        if value not in DTYPE_SETTINGS:
            raise ValueError(
                f"model parameter '{name}' must be one of {', '.join(DTYPE_SETTINGS)}, got {value!r}"
            )
    engine = EngineConfig(
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        block_size_tokens=_parse(values, "block_size_tokens", int),
        num_kv_blocks=_parse(values, "num_kv_blocks", int),
        step_token_budget=_parse(values, "step_token_budget", int),
        max_num_running=_parse(values, "max_num_running", int),
        target_step_ms=_parse(values, "target_step_ms", float) if target else None,
        prefill_step_stretch=stretch,
        prefill_num_threads=_prefill_num_threads(values),
    )
    params = ModelParameters(
        checkpoint_dir=Path(checkpoint),
        engine=engine,
        stats_interval_ms=_parse(values, "stats_interval_ms", float),
        cancellation_check_period_ms=_parse(values, "cancellation_check_period_ms", float),
        yield_send_interval_ms=_parse(values, "yield_send_interval_ms", float),
        # NOTE: a repository rendered before these parameters existed lacks them: each token at once.
        send_budget_ms=_parse(values, "send_budget_ms", float) if "send_budget_ms" in values else 0.0,
        max_responses_per_s=(
            _parse(values, "max_responses_per_s", float) if "max_responses_per_s" in values else 1000.0
        ),
        weights_digest=check_digest(values["weights_digest"]) if values.get("weights_digest") else None,
    )
    if params.send_budget_ms < 0 or params.max_responses_per_s <= 0:
        raise ValueError("model parameters 'send_budget_ms' must be >= 0 and 'max_responses_per_s' > 0")
    return params


def _prefill_num_threads(values: Mapping[str, str]) -> int | None:
    """``prefill_num_threads`` as ``prefill_num_threads_of`` reads it (a repository rendered before the
    parameter existed: every step on the team the server started with)."""
    raw = values.get("prefill_num_threads", "")
    try:
        return prefill_num_threads_of(raw)
    except ValueError:
        raise ValueError(f"model parameter 'prefill_num_threads' must be an integer, got {raw!r}") from None


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


def _logit_bias(tensors: Mapping[str, np.ndarray], vocab_size: int) -> tuple[tuple[int, float], ...]:
    """``logit_bias_ids`` and ``logit_bias_values``, both or neither, as (token id, bias) pairs."""
    if "logit_bias_ids" not in tensors and "logit_bias_values" not in tensors:
        return ()
    if "logit_bias_ids" not in tensors or "logit_bias_values" not in tensors:
        raise ValueError("logit_bias_ids and logit_bias_values are sent together")
    ids = _int_vector(tensors, "logit_bias_ids")
    values = _flat(tensors, "logit_bias_values")
    if values.dtype.kind != "f" or values.shape != ids.shape or not np.isfinite(values).all():
        raise ValueError("logit_bias_values must be one finite number per logit_bias_ids entry")
    _check_vocab("logit_bias_ids", ids, vocab_size)
    return tuple((int(t), float(v)) for t, v in zip(ids, values, strict=True))


def _logprobs(tensors: Mapping[str, np.ndarray]) -> int | None:
    """How many alternatives to report per token, or None for no log-probabilities."""
    if not _bool_scalar(tensors, "return_log_probs", False):
        if "top_logprobs" in tensors:
            raise ValueError("top_logprobs needs return_log_probs")
        return None
    return _int_scalar(tensors, "top_logprobs") if "top_logprobs" in tensors else 0


def _guide(tensors: Mapping[str, np.ndarray]) -> Guide | None:
    """``guided_decoding_guide_type`` and ``guided_decoding_guide`` as a ``Guide`` (the text may be left
    out for ``json``, any JSON object)."""
    if "guided_decoding_guide_type" not in tensors:
        if "guided_decoding_guide" in tensors:
            raise ValueError("guided_decoding_guide needs guided_decoding_guide_type")
        return None
    kind = _string_scalar(tensors, "guided_decoding_guide_type", 64)
    try:
        guide_kind = GuideKind(kind)
    except ValueError:
        allowed = ", ".join(k.value for k in GuideKind)
        raise ValueError(f"guided_decoding_guide_type must be one of {allowed}, got {kind!r}") from None
    text = (
        _string_scalar(tensors, "guided_decoding_guide", MAX_GUIDE_BYTES)
        if "guided_decoding_guide" in tensors
        else ""
    )
    if not text and guide_kind is not GuideKind.JSON:
        raise ValueError(f"a {guide_kind.value} guide needs its guided_decoding_guide")
    return Guide(guide_kind, text)


def _string_scalar(tensors: Mapping[str, np.ndarray], name: str, max_bytes: int) -> str:
    arr = _flat(tensors, name)
    if arr.size != 1:
        raise ValueError(f"{name} must hold one string")
    raw = arr[0]
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, bytes | np.bytes_):
        raise ValueError(f"{name} must be bytes")
    if len(raw) > max_bytes:
        raise ValueError(f"{name} must be at most {max_bytes} bytes")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name} must be UTF-8") from None


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
    scope = _string_scalar(tensors, "cache_scope", MAX_CACHE_SCOPE_BYTES)
    if not scope:
        raise ValueError("cache_scope must not be empty (there is no shared default scope)")
    return scope
