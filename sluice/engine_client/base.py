"""The engine-client interface the gateway codes against; every implementation passes the same
contract tests (tests/gateway/test_engine_client_contract.py).

``generate`` is an async generator of ``Delta``s. Closing it early (``aclose()``, which
``contextlib.aclosing`` does on leaving its block, whatever the reason) cancels the engine call: the
replica drops the sequence within a step. Leaving an ``async for`` alone does NOT close an async
generator, so callers must close it explicitly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from sluice.wire import EnginePriority, FinishReason, Guide, ReplicaStats, TokenLogprob

# A temperature below this samples as greedy on every engine (cpu_engine.sampling's threshold, vLLM's):
# dividing logits by 1e-310 overflows, and anything this small puts all the mass on the argmax anyway.
MIN_SAMPLED_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class Sampling:
    """How to generate, as the client asked: parsed once by the gateway, held by reference by its job and
    by the ``GenerateRequest``, and turned into tensors (Triton) or the CPU engine's ``SamplingParams``
    (in process) by the engine client: a new sampling control is added here and at those two ends.
    temperature None, 0 or below ``MIN_SAMPLED_TEMPERATURE`` is greedy; top_p None is no cut."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    top_k: int = 0  # 0: no cut
    min_p: float = 0.0  # 0: no cut
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: none
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted by token id
    guide: Guide | None = None  # structured output: every answer matches it
    logprobs: int | None = None  # None: none; K >= 0: each token's log-probability and K alternatives
    n: int = 1  # answers to the one prompt (prefilled once), each its own Delta.index
    prompt_logprobs: bool = False  # also the prompt's tokens' (echo with logprobs; needs logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature < MIN_SAMPLED_TEMPERATURE


@dataclass(frozen=True)
class GenerateRequest:
    """One generation. ``cache_scope`` (the tenant) is required and non-empty: prefix-cache blocks are
    shared within one scope only, and there is no shared default scope (an empty one is a ValueError)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    stop_token_ids: tuple[int, ...] = ()
    # A class preempts lower ones to be admitted (an int is taken as the EnginePriority of that value).
    priority: EnginePriority = EnginePriority.UNDER_SHARE
    # The model's end-of-sequence ids (its tokenizer's), for an engine that is not told them otherwise: the
    # TensorRT-LLM model stops only at the end_id it is sent. The CPU engine applies its checkpoint's own.
    eos_token_ids: tuple[int, ...] = ()
    cache_scope: str = field(kw_only=True)  # the tenant
    # The model's vocabulary size (config.json's vocab_size: its logits' width), for an engine that takes
    # logit_bias as a dense vector of that length (TensorRT-LLM's embedding_bias). None: not known.
    vocab_size: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not self.cache_scope:
            raise ValueError("cache_scope must be the tenant: there is no shared default scope")
        try:
            priority = EnginePriority(self.priority)
        except ValueError:
            allowed = ", ".join(str(int(p)) for p in EnginePriority)
            raise ValueError(f"priority must be one of {allowed}, got {self.priority!r}") from None
        object.__setattr__(self, "priority", priority)  # NOTE: frozen; the same value, as the enum


@dataclass(frozen=True)
class Delta:
    """Tokens produced since the previous delta for answer ``index`` (0 unless n > 1); the last delta of
    each answer carries its finish reason and the totals. ``logprobs`` (when asked) is one per token."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    # With an answer's first tokens, when asked: each prompt token's but the first.
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None


class EngineClient(ABC):
    #: "triton" or "inprocess": shown at start-up and in telemetry.
    kind: str
    #: Where requests go (a gRPC URL, or "inprocess"): the telemetry's replica.
    replica: str
    #: The served model's version.
    model_version: str = "1"

    @abstractmethod
    async def start(self) -> None:
        """Connect (or load the engine). Idempotent."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        """Stream the request's tokens. Raises ``EngineError``; ``aclose()`` cancels the engine call."""

    @abstractmethod
    async def ready(self) -> bool:
        """The replica answers and can take requests."""

    @abstractmethod
    async def model_loaded(self, model: str) -> bool:
        """The replica has ``model`` loaded and ready."""

    @abstractmethod
    async def replica_stats(self) -> ReplicaStats | None:
        """The replica's current load; None if it cannot be read now (the caller keeps its last view)."""
