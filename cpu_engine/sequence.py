"""One request's state inside the engine: its tokens, its place in the KV cache and its lifecycle.

How a sequence ends is the wire's ``FinishReason`` (``sluice.wire``, which imports nothing
from Sluice): the engine's one import from Sluice, so the reason reaches the gateway as it is, unmapped.
"""

from __future__ import annotations

import time
from enum import Enum

import llguidance
import numpy as np

from cpu_engine.sampling import SamplingParams
from sluice.wire import EnginePriority, FinishReason, TokenLogprob


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request's tokens (prompt then output) and the KV blocks that hold them.

    ``num_computed_tokens`` counts tokens whose keys and values are in the cache; the scheduler moves it
    forward by whole chunks and a preemption resets it to 0 (recompute). ``block_table`` lists the block
    ids holding positions ``[i * block_size, (i + 1) * block_size)``.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: EnginePriority = EnginePriority.UNDER_SHARE,
        cache_scope: str = "",
        arrival_s: float | None = None,
        index: int = 0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.priority = priority
        # Prefix-cache sharing is scoped: blocks are only shared between sequences of one scope (tenant).
        self.cache_scope = cache_scope
        self.arrival_s = time.monotonic() if arrival_s is None else arrival_s
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_computed_tokens = 0
        self.num_cached_prompt_tokens = 0  # prefix-cache hits at the last admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hashes of the full blocks committed to the prefix cache
        self.num_preemptions = 0
        # Not preempted to admit a higher class again until it holds this many tokens (the scheduler's
        # grace after such a preemption: every readmission makes progress).
        self.protected_until_num_tokens = 0
        self.admitted_order = -1  # set by the scheduler at admission; higher = more recent
        # Answer ``index`` of a request with n > 1 draws from its own stream (the first, the seed's own).
        seed = params.seed if params.seed is None or index == 0 else [params.seed, index]
        self.generator = None if params.greedy else np.random.default_rng(seed)
        self.index = index
        # Unique in the engine: the request's id for its first answer, "<id>#<index>" for the others.
        self.key = request_id if index == 0 else f"{request_id}#{index}"
        # n > 1: the request's other answers, waiting for this one's prompt: they share its computed
        # blocks and each samples its first token from its last logits (the scheduler forks them).
        self.siblings: list[Sequence] = []
        # With params.prompt_logprobs: prompt token i + 1's log-probability after tokens 0..i, as computed.
        self.prompt_logprobs: list[TokenLogprob] = []
        # Structured output: where the guide stands after the output so far (the engine sets it at add).
        self.matcher: llguidance.LLMatcher | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt log-probabilities asked and not all computed yet (they need the prompt computed whole)."""
        return self.params.prompt_logprobs and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def in_prefill(self) -> bool:
        """True while more than one token is left to compute (the prompt, or a recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
