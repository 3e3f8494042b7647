"""The request dialect of the Triton model a replica serves: a ``GenerateRequest`` as that model's input
tensors, and that model's responses as ``Delta``s. Pure: no I/O; ``sluice.engine_client.triton`` sends
what these build and feeds back what the replica answers.

A version's dialect follows from how it was built (the registry version's ``build_config["target"]``):

- ``cpu_engine`` (target ``cpu``, and any version without a target): Sluice's CPU engine model, the
  tensors ``sluice.wire`` documents; its responses carry the finish reason and totals.
- ``tensorrt_llm`` (target ``trtllm``): the tensorrtllm_backend ``tensorrt_llm`` model
  (``model_repository/trtllm/tensorrt_llm/``), under the backend's own names and shapes
  (``sluice.engine_client.trtllm_dialect`` builds them, reads the responses, and says which of issue 25's
  controls the backend cannot carry and why: those are refused). What it cannot
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

from sluice.engine_client.base import GenerateRequest
from sluice.engine_client.trtllm_dialect import MIN_SENT_TOP_P, trtllm_tensors
from sluice.triton.client import request_tensors
from sluice.wire import EngineError, EngineErrorKind


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
        guide=asked.guide,
        logprobs=asked.logprobs,
        n=asked.n,
        prompt_logprobs=asked.prompt_logprobs,
    )
