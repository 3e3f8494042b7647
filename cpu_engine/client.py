"""``EngineClient`` over an ``EngineThread`` in this process: no Triton, for platforms where tritonserver
cannot run and for fast tests. The engine thread owns the engine; this side only submits, reads the
request's stream when the engine signals an update, and aborts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from pathlib import Path

from cpu_engine.config import EngineConfig
from cpu_engine.engine import LLMEngine
from cpu_engine.engine_thread import EngineThread, error_kind
from cpu_engine.sampling import SamplingParams
from sluice.engine_client.base import Delta, EngineClient, GenerateRequest, ReplicaStats
from sluice.wire import EngineError, EngineErrorKind

log = logging.getLogger(__name__)


class InProcessEngineClient(EngineClient):
    kind = "inprocess"
    replica = "inprocess"

    def __init__(self, checkpoint_dir: Path, model_name: str, config: EngineConfig | None = None) -> None:
        self._checkpoint_dir = Path(checkpoint_dir)
        self._model_name = model_name
        self._config = config or EngineConfig()
        self.engine_thread: EngineThread | None = None

    async def start(self) -> None:
        if self.engine_thread is None:
            engine = await asyncio.to_thread(LLMEngine.from_checkpoint, self._checkpoint_dir, self._config)
            self.engine_thread = EngineThread(engine, name="sluice-inprocess-engine")

    async def close(self) -> None:
        if self.engine_thread is not None:
            await asyncio.to_thread(self.engine_thread.close)
            self.engine_thread = None

    async def ready(self) -> bool:
        return self.engine_thread is not None

    async def model_loaded(self, model: str) -> bool:
        return self.engine_thread is not None and model == self._model_name

    async def replica_stats(self) -> ReplicaStats | None:
        if self.engine_thread is None:
            return None
        stats = self.engine_thread.stats()
        return ReplicaStats(
            num_kv_tokens_total=stats.num_blocks_max * stats.tokens_per_block,
            num_kv_tokens_free=stats.num_blocks_free * stats.tokens_per_block,
            num_waiting=stats.num_waiting,
            num_running=stats.num_running,
        )

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        thread = self.engine_thread
        if thread is None:
            raise EngineError(EngineErrorKind.UNAVAILABLE, "the in-process engine is not started")
        asked = request.sampling
        try:
            params = SamplingParams(
                max_tokens=asked.max_tokens,
                temperature=asked.temperature if not asked.greedy and asked.temperature else 0.0,
                top_p=asked.top_p or 1.0,
                top_k=asked.top_k,
                min_p=asked.min_p,
                seed=asked.seed,
                stop_token_ids=request.stop_token_ids,
                ignore_eos=asked.ignore_eos,
                presence_penalty=asked.presence_penalty,
                frequency_penalty=asked.frequency_penalty,
                repetition_penalty=asked.repetition_penalty,
                logit_bias=asked.logit_bias,
                guide=asked.guide,
                logprobs=asked.logprobs,
                prompt_logprobs=asked.prompt_logprobs,
                n=asked.n,
            )
        except ValueError as exc:
            raise EngineError(EngineErrorKind.INVALID_REQUEST, str(exc)) from None
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_update() -> None:  # the engine thread: hand the wake-up to the event loop
            loop.call_soon_threadsafe(wake.set)

        stream = thread.submit(
            request.request_id,
            request.prompt_token_ids,
            params,
            request.priority,
            request.cache_scope,
            on_update,
        )
        finished = False
        try:
            while True:
                wake.clear()  # NOTE: clear before taking, so an update between the two is not lost
                delta = stream.take_nowait()
                if delta is None:
                    await wake.wait()
                    continue
                if delta.error is not None:
                    finished = True
                    raise EngineError(error_kind(delta.error_kind), delta.error)
                logprobs = tuple(delta.logprobs) if delta.logprobs is not None else None
                prompt = tuple(delta.prompt_logprobs) if delta.prompt_logprobs is not None else None
                if delta.answer_finished:
                    yield Delta(
                        delta.token_ids,
                        delta.finish_reason,  # the engine's is the wire's own FinishReason
                        delta.num_prompt_tokens,
                        delta.num_cached_prompt_tokens,
                        delta.index,
                        logprobs,
                        prompt,
                    )
                elif delta.token_ids:
                    yield Delta(delta.token_ids, index=delta.index, logprobs=logprobs, prompt_logprobs=prompt)
                if delta.finished:
                    finished = True
                    return
        finally:
            if not finished:
                thread.abort(request.request_id)
