"""The request dialect of the Triton model a replica serves: a ``GenerateRequest`` as that model's input
tensors, and that model's responses as ``Delta``s. Pure: no I/O; ``sluice.engine_client.triton`` sends
what these build and feeds back what the replica answers.

A version's dialect follows from how it was built (the registry version's ``build_config["target"]``):

- ``cpu_engine`` (target ``cpu``, and any version without a target): Sluice's CPU engine model, the
  tensors ``sluice.wire`` documents; its responses carry the finish reason and totals.
- ``tensorrt_llm`` (target ``trtllm``): the tensorrtllm_backend ``tensorrt_llm`` model
  (``model_repository/trtllm/tensorrt_llm/``), under the backend's own names and shapes. What it cannot
  carry, checked against the backend's config.pbtxt and request parser (TensorRT-LLM 1.2, and main as of
  2026): no request priority input (the executor has one, the Triton backend never sets it) and no
  per-request cache salt, so prefix-cache blocks cannot be scoped to a tenant: such replicas are rendered
  with ``enable_kv_cache_reuse`` false (``build_engines.repository.TrtllmServing``), and the priority is
  dropped (the gateway's fair queue still orders dispatch). No ``ignore_eos`` either: the model stops only
  at the ``end_id`` it is sent, so ``ignore_eos`` sends none. Its responses carry no finish reason: the
  stream's end is the final response, and ``TrtllmDecoder`` gives the final delta its reason (``length``
  when max_tokens were produced, ``stop`` otherwise).
- ``llmapi`` (target ``trtllm-llmapi``): TensorRT-LLM's PyTorch-backend model takes *text*
  (``text_input``) and returns text; the gateway tokenizes, counts and bills tokens itself, so this
  client cannot serve it: ``UNSERVABLE`` says why, and the gateway keeps such replicas out of rotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import numpy as np

from sluice.engine_client.base import Delta, GenerateRequest, Sampling
from sluice.triton.client import request_tensors
from sluice.wire import EngineError, EngineErrorKind, FinishReason


class Dialect(StrEnum):
    CPU_ENGINE = "cpu_engine"
    TENSORRT_LLM = "tensorrt_llm"
    LLMAPI = "llmapi"


# build_config["target"] (``sluice build-engine --target``) -> the dialect of the model it renders.
DIALECT_BY_TARGET: Mapping[str, Dialect] = {
    "cpu": Dialect.CPU_ENGINE,
    "trtllm": Dialect.TENSORRT_LLM,
    "trtllm-llmapi": Dialect.LLMAPI,
}

# Dialects this client cannot send requests in, and why (shown where a replica is kept out of rotation).
UNSERVABLE: Mapping[Dialect, str] = {
    Dialect.LLMAPI: (
        "its llmapi model takes text (text_input), and the gateway sends token ids: build the version with "
        "--target trtllm to serve it through Sluice"
    ),
}

# top_p travels as FP32, where a tiny value rounds to 0, which TensorRT-LLM reads as "no cut" (the whole
# distribution). Any top_p at or below this keeps only the most likely token (whose probability is at
# least 1 / vocabulary size), so it is sent as this instead.
MIN_SENT_TOP_P = 1e-6

# The tensorrt_llm model's output tensors a response is decoded from.
TRTLLM_OUTPUTS = ("output_ids", "sequence_length")


def dialect_of(build_config: Mapping[str, Any] | None) -> Dialect:
    """The dialect of a version built with ``build_config`` (none, or no target: ``cpu_engine``). An
    unknown target is a ValueError: guessing would send tensors the replica rejects."""
    target = (build_config or {}).get("target", "cpu")
    try:
        return DIALECT_BY_TARGET[target]
    except KeyError:
        raise ValueError(f"unknown build target {target!r}: no request dialect for it") from None


def build_tensors(dialect: Dialect, request: GenerateRequest) -> dict[str, np.ndarray]:
    """``request`` as ``dialect``'s input tensors, each with its batch dimension of 1."""
    if dialect is Dialect.CPU_ENGINE:
        return cpu_engine_tensors(request)
    if dialect is Dialect.TENSORRT_LLM:
        return trtllm_tensors(request)
    why = UNSERVABLE[dialect]
    raise EngineError(EngineErrorKind.ENGINE_ERROR, f"cannot send to a {dialect} replica: {why}")


def _sent_top_p(request: GenerateRequest) -> float | None:
    return max(request.sampling.top_p, MIN_SENT_TOP_P) if request.sampling.top_p is not None else None


def cpu_engine_tensors(request: GenerateRequest) -> dict[str, np.ndarray]:
    """The CPU engine model's tensors (``sluice.wire``). ``eos_token_ids`` are not sent:
    the engine applies its checkpoint's own."""
    # NOTE: a tiny temperature is sent as greedy (no sampling inputs), whatever engine serves it; the
    # penalties and the bias apply to greedy too. Controls at their "off" value are not sent.
    asked = request.sampling
    sampled = not asked.greedy
    return request_tensors(
        request.prompt_token_ids,
        asked.max_tokens,
        streaming=True,
        temperature=asked.temperature if sampled else None,
        top_k=asked.top_k if sampled and asked.top_k else None,
        top_p=_sent_top_p(request) if sampled else None,
        min_p=asked.min_p if sampled and asked.min_p else None,
        seed=asked.seed,
        stop_token_ids=request.stop_token_ids,
        priority=request.priority,
        cache_scope=request.cache_scope,
        ignore_eos=asked.ignore_eos or None,
        presence_penalty=asked.presence_penalty or None,
        frequency_penalty=asked.frequency_penalty or None,
        repetition_penalty=asked.repetition_penalty if asked.repetition_penalty != 1.0 else None,
        logit_bias=asked.logit_bias,
    )


def _scalar(value: object, dtype: type) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def stop_words_list(token_ids: tuple[int, ...]) -> np.ndarray:
    """Single-token stop words in the backend's [1, 2, N] form: row 0 the ids, row 1 each word's end
    offset (1, 2, ..., N: one token per word)."""
    ids = np.asarray(token_ids, dtype=np.int32)
    offsets = np.arange(1, len(token_ids) + 1, dtype=np.int32)
    return np.stack([ids, offsets]).reshape(1, 2, -1)


def _not_carried_by_trtllm(asked: Sampling) -> str | None:
    """The first control this dialect does not map yet (issue 25's TensorRT-LLM item), or None."""
    off: dict[str, object] = {"top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    off |= {"repetition_penalty": 1.0, "logit_bias": ()}
    return next((name for name, value in off.items() if getattr(asked, name) != value), None)


def trtllm_tensors(request: GenerateRequest) -> dict[str, np.ndarray]:
    """The tensorrt_llm model's tensors (module docstring: what is not sent). Greedy is ``runtime_top_k``
    1; sampled sends the temperature, no top-k cut (0) and the top-p (1.0: none). A control this dialect
    does not map yet is refused as the caller's request, never dropped."""
    if (name := _not_carried_by_trtllm(request.sampling)) is not None:
        raise EngineError(
            EngineErrorKind.INVALID_REQUEST,
            f"{name} is not supported by this model's engine (TensorRT-LLM) in this version of Sluice",
        )
    out = {
        "input_ids": np.asarray(request.prompt_token_ids, dtype=np.int32).reshape(1, -1),
        "input_lengths": _scalar(len(request.prompt_token_ids), np.int32),
        "request_output_len": _scalar(request.sampling.max_tokens, np.int32),
        "streaming": _scalar(True, np.bool_),
        "exclude_input_in_output": _scalar(True, np.bool_),
    }
    stop_ids = request.stop_token_ids
    if not request.sampling.ignore_eos:
        if not request.eos_token_ids:
            # NOTE: without an end_id the model never stops before max_tokens: a gateway bug, said loudly.
            raise EngineError(
                EngineErrorKind.ENGINE_ERROR, "a tensorrt_llm replica needs the model's eos_token_ids"
            )
        out["end_id"] = _scalar(request.eos_token_ids[0], np.int32)
        out["pad_id"] = _scalar(request.eos_token_ids[0], np.int32)
        stop_ids = stop_ids + tuple(i for i in request.eos_token_ids[1:] if i not in stop_ids)
    if request.sampling.greedy:
        out["runtime_top_k"] = _scalar(1, np.int32)
    else:
        out["temperature"] = _scalar(request.sampling.temperature, np.float32)
        out["runtime_top_k"] = _scalar(0, np.int32)
        out["runtime_top_p"] = _scalar(_sent_top_p(request) or 1.0, np.float32)
    if request.sampling.seed is not None:
        out["seed"] = _scalar(request.sampling.seed, np.uint64)
    if stop_ids:
        out["stop_words_list"] = stop_words_list(stop_ids)
    return out


class TrtllmDecoder:
    """One request's tensorrt_llm responses as ``Delta``s: ``on_response`` for each response's outputs
    (the tokens of this response: ``output_ids[0, 0, :sequence_length[0, 0]]``, one beam), ``on_end``
    once the stream ended after the response flagged final: the final delta, with no tokens, the finish
    reason, and the prompt's length (the backend reports no prefix-cache hits per request: None)."""

    def __init__(self, request: GenerateRequest) -> None:
        self._max_tokens = request.sampling.max_tokens
        self._num_prompt_tokens = len(request.prompt_token_ids)
        self.num_generated_tokens = 0

    def on_response(self, outputs: Mapping[str, np.ndarray | None]) -> Delta:
        output_ids, lengths = outputs.get("output_ids"), outputs.get("sequence_length")
        if output_ids is None or lengths is None:
            raise EngineError(EngineErrorKind.ENGINE_ERROR, "a tensorrt_llm response without output_ids")
        num_tokens = int(lengths.reshape(-1)[0])
        token_ids = [int(t) for t in output_ids.reshape(-1)[:num_tokens]]
        self.num_generated_tokens += len(token_ids)
        return Delta(token_ids)

    def on_end(self) -> Delta:
        reason = FinishReason.LENGTH if self.num_generated_tokens >= self._max_tokens else FinishReason.STOP
        return Delta([], reason, self._num_prompt_tokens, None)
