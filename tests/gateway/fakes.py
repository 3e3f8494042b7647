"""Named fakes for what a test cannot get from a real component: an engine that is slow on purpose, or
that fails mid-stream on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from sluice.engine_client import (
    Delta,
    EngineClient,
    EngineError,
    EngineErrorKind,
    FinishReason,
    GenerateRequest,
    ReplicaStats,
)


class ScriptedFakeEngine(EngineClient):
    """Emits token ``token_id`` every ``interval_s`` up to max_tokens; fails after ``fail_after`` tokens
    when set. Records what it was asked and whether each call was closed before finishing."""

    kind = "fake"
    replica = "fake"

    def __init__(self, token_id: int, interval_s: float, fail_after: int | None = None) -> None:
        self.token_id = token_id
        self.interval_s = interval_s
        self.fail_after = fail_after
        self.requests: list[GenerateRequest] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.stats: ReplicaStats | None = None  # what replica_stats() reports; None: unreadable

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ready(self) -> bool:
        return True

    async def model_loaded(self, model: str) -> bool:
        return True

    async def replica_stats(self) -> ReplicaStats | None:
        return self.stats

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        self.requests.append(request)
        done = False
        try:
            for i in range(request.sampling.max_tokens):
                await asyncio.sleep(self.interval_s)
                if self.fail_after is not None and i == self.fail_after:
                    done = True
                    raise EngineError(EngineErrorKind.ENGINE_ERROR, "replica lost")
                last = i == request.sampling.max_tokens - 1
                yield Delta([self.token_id], FinishReason.LENGTH if last else None,
                            len(request.prompt_token_ids) if last else None)  # fmt: skip
            done = True
        finally:
            (self.finished if done else self.cancelled).append(request.request_id)
