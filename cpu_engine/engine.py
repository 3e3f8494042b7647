"""The engine loop: add requests, abort them, and step. Single-threaded; see engine_thread for the owner."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from cpu_engine.block_pool import BlockPool
from cpu_engine.config import EngineConfig, LinearDType, ModelConfig
from cpu_engine.cpu_features import DTypeChoice, detect_dtype
from cpu_engine.grammar import GrammarCompiler
from cpu_engine.model import KVCache, LlamaModel
from cpu_engine.native import elementwise_ext
from cpu_engine.runner import ModelRunner
from cpu_engine.sampling import SamplingParams
from cpu_engine.scheduler import Scheduler
from cpu_engine.sequence import Sequence
from cpu_engine.stats import EngineStats, StepTimeHistogram
from cpu_engine.step_plan import SchedulerOutput
from cpu_engine.weights import LlamaWeights, load_llama_weights
from sluice.wire import EnginePriority, FinishReason, TokenLogprob


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one answer of a request (``index``: 0 unless n > 1): its new tokens
    (with their log-probabilities, where asked), and whether it is done; ``request_finished`` once every
    answer of the request is."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_prompt_tokens: int
    index: int = 0
    new_logprobs: list[TokenLogprob] | None = None
    request_finished: bool = True
    # With the answer's first token, when asked: each prompt token's but the first (SamplingParams).
    prompt_logprobs: list[TokenLogprob] | None = None


class LLMEngine:
    def __init__(
        self,
        model_config: ModelConfig,
        weights: LlamaWeights,
        config: EngineConfig,
        grammar: GrammarCompiler | None = None,
    ) -> None:
        self.model_config = model_config
        self.config = config
        # "auto" becomes bfloat16 or float32 here, from this CPU's flags (see cpu_engine.cpu_features).
        self.dtype_choice: DTypeChoice = detect_dtype(config.dtype, config.kv_cache_dtype)
        self.block_pool = BlockPool(
            config.num_kv_blocks, config.block_size_tokens, config.enable_prefix_cache
        )
        self.kv_cache = KVCache(
            model_config,
            config.num_kv_blocks,
            config.block_size_tokens,
            dtype=self.dtype_choice.kv_cache_dtype,
        )
        # Structured output needs the checkpoint's tokenizer; without one, guided requests are refused.
        self.grammar = grammar
        self.runner = ModelRunner(
            LlamaModel(model_config, weights, self.kv_cache, self.dtype), config.block_size_tokens, grammar
        )
        self.scheduler = Scheduler(
            config,
            self.block_pool,
            model_config.max_position_embeddings,
            frozenset(model_config.eos_token_ids),
        )
        self.sequences: dict[str, list[Sequence]] = {}  # request id -> its answers (n, index order)
        self.step_ms = StepTimeHistogram(config.step_ms_buckets)
        self._ewma_step_ms: float | None = None
        self._num_steps = 0
        self._num_generated = 0
        self._last_num_scheduled = 0
        self._last_num_context = 0
        self._starting_team: int | None = None  # the stepping thread's OpenMP team before any step

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: EngineConfig | None = None) -> LLMEngine:
        model_config = ModelConfig.from_checkpoint(path)
        grammar = GrammarCompiler.for_checkpoint(
            path, list(model_config.eos_token_ids), model_config.vocab_size
        )
        return cls(model_config, load_llama_weights(path, model_config), config or EngineConfig(), grammar)

    @property
    def dtype(self) -> LinearDType:
        """The number format the engine runs in (``config.dtype`` with "auto" resolved)."""
        return self.dtype_choice.dtype

    # ----- requests -----
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: EnginePriority = EnginePriority.UNDER_SHARE,
        cache_scope: str = "",
    ) -> None:
        if request_id in self.sequences:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t, _ in params.logit_bias):  # a bad id would fail the whole step
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        answers = [
            Sequence(request_id, prompt_token_ids, params, priority, cache_scope, index=i)
            for i in range(params.n)
        ]
        if params.guide is not None:
            if self.grammar is None:
                raise ValueError(
                    "structured output needs the model's tokenizer.json, which this checkpoint lacks"
                )
            for seq in answers:
                seq.matcher = self.grammar.matcher(params.guide)  # raises GrammarError (a ValueError)
        first = answers[0]
        first.siblings = answers[1:]  # prefilled once, with the first (the scheduler forks them)
        self.scheduler.add(first)
        self.sequences[request_id] = answers

    def abort_request(self, request_id: str) -> list[RequestOutput]:
        """Drop a request now (between steps) and free its blocks: one output for each of its answers that
        had not finished (none if it is unknown or finished)."""
        answers = self.sequences.pop(request_id, [])
        live = [seq for seq in answers if not seq.is_finished]
        for seq in live:
            self.scheduler.abort(seq.key)  # the first answer's abort also ends the siblings waiting on it
        return [self._output(seq, [], request_finished=seq is live[-1]) for seq in live]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- the loop -----
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, and return one output per sequence that produced or finished."""
        started = time.perf_counter()
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        self._size_team(out)
        sampled = self.runner.execute(out)
        self.scheduler.update_from_output(out, sampled.tokens)
        outputs: list[RequestOutput] = []
        for seq, _ in out.scheduled:
            if seq.key not in sampled.tokens:
                continue
            answers = self.sequences[seq.request_id]
            forked_now = len(answers) > 1 and seq.index == 0 and seq.num_output_tokens == 1
            for member in answers if forked_now else [seq]:  # the first answer's step made its siblings'
                logprob = sampled.logprobs.get(member.key)
                new_logprobs = None if logprob is None else [logprob]
                outputs.append(self._output(member, [sampled.tokens[member.key]], new_logprobs, False))
        outputs = self._mark_request_ends(outputs)
        self._num_steps += 1
        self._num_generated += len(sampled.tokens)
        self._last_num_scheduled = len(out.scheduled)
        self._last_num_context = sum(1 for s, n in out.scheduled if s.key not in sampled.tokens or n > 1)
        self._observe_step(out, (time.perf_counter() - started) * 1000.0)
        return outputs

    def _size_team(self, out: SchedulerOutput) -> None:
        """The OpenMP team this step's kernels may use (``EngineConfig.prefill_num_threads``); the
        setting is the stepping thread's own, so it is set on every step."""
        if self.config.prefill_num_threads is None:
            return
        if self._starting_team is None:
            self._starting_team = elementwise_ext.get_max_threads()
        prefill = out.num_prefill_tokens >= self.config.parallel_prefill_min_tokens
        elementwise_ext.set_num_threads(self.config.prefill_num_threads if prefill else self._starting_team)

    def _mark_request_ends(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Flag the last output of each request whose every answer is now finished (``request_finished``)
        and forget the request."""
        marked = list(outputs)
        for i in range(len(marked) - 1, -1, -1):
            request_id = marked[i].request_id
            answers = self.sequences.get(request_id)
            if answers is not None and all(a.is_finished for a in answers):
                marked[i] = replace(marked[i], request_finished=True)
                del self.sequences[request_id]
        return marked

    def _observe_step(self, out: SchedulerOutput, ms: float) -> None:
        self.step_ms.observe(ms)
        # What the step carried and took: the costs the scheduler sizes the next steps' prefill share by.
        self.scheduler.step_costs.observe(out.num_decode_tokens, out.num_prefill_tokens, ms)
        target = self.config.target_step_ms
        if target is None or out.num_prefill_tokens:
            return
        # Adaptive batch: shrink the running cap when steps run over the target, grow it back slowly.
        # NOTE: judged on decode-only steps, what the batch's size costs every stream: a step's prefill
        # is bounded on its own (prefill_budget), and counted here it cut the cap to 3-4 sequences during
        # a wave of prompts (whole-budget prefill steps over the target), which then entered 3-4 at a time.
        self._ewma_step_ms = ms if self._ewma_step_ms is None else 0.8 * self._ewma_step_ms + 0.2 * ms
        num_running = len(self.scheduler.running)
        if self._ewma_step_ms > target and num_running > 1:
            self.scheduler.running_cap = max(1, int(num_running * target / self._ewma_step_ms))
        elif self._ewma_step_ms < 0.9 * target and num_running >= self.scheduler.running_cap:
            self.scheduler.running_cap = min(self.config.max_num_running, self.scheduler.running_cap + 1)

    def _output(
        self,
        seq: Sequence,
        new_tokens: list[int],
        new_logprobs: list[TokenLogprob] | None = None,
        request_finished: bool = True,
    ) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_tokens,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
            index=seq.index,
            new_logprobs=new_logprobs,
            request_finished=request_finished,
            prompt_logprobs=(
                seq.prompt_logprobs if seq.params.prompt_logprobs and seq.num_output_tokens == 1 else None
            ),
        )

    def stats(self) -> EngineStats:
        pool = self.block_pool
        return EngineStats(
            num_blocks_max=pool.num_blocks,
            num_blocks_used=pool.num_used_blocks,
            num_blocks_free=pool.num_free_blocks,
            tokens_per_block=pool.block_size_tokens,
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            num_scheduled=self._last_num_scheduled,
            num_context=self._last_num_context,
            running_cap=self.scheduler.running_cap,
            num_preemptions_total=self.scheduler.num_preemptions_total,
            num_steps_total=self._num_steps,
            num_generated_tokens_total=self._num_generated,
            num_prefix_query_tokens_total=pool.num_query_tokens,
            num_prefix_hit_tokens_total=pool.num_hit_tokens,
            step_ms_bounds=self.step_ms.bounds_ms,
            step_ms_counts=tuple(self.step_ms.counts),
            step_ms_sum=self.step_ms.sum_ms,
            dtype=self.dtype,
            cpu_flags=self.dtype_choice.cpu_flags_label,
        )
