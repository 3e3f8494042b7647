"""Tokens the engine made for a client that left before reading them are billed: a stream whose client
stopped reading is closed while the generation waits at its ``yield``, with the engine's output for it
still queued in the engine client. ``_num_unread_tokens`` takes that backlog before the call is cancelled
(bounded in time, so an engine with nothing queued cannot hold the request's ending)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from gateway.openai.generation import UNREAD_DRAIN_S, _num_unread_tokens
from sluice.engine_client import Delta, EngineError, EngineErrorKind, FinishReason


async def _queued_then_waiting(queued: list[list[int]], closed: list[bool]) -> AsyncGenerator[Delta, None]:
    """What an engine client holds for a stalled reader: ``queued`` deltas ready at once, then nothing."""
    try:
        for token_ids in queued:
            yield Delta(token_ids)
        await asyncio.Event().wait()  # the engine is still generating: no more output for now
        yield Delta([0])
    finally:
        closed.append(True)


def test_the_queued_backlog_is_counted_and_a_waiting_engine_does_not_hold_the_ending() -> None:
    async def main() -> tuple[int, float, list[bool]]:
        closed: list[bool] = []
        deltas = _queued_then_waiting([[1, 2, 3], [4] * 40, [5]], closed)
        started_s = time.monotonic()
        num_tokens = await _num_unread_tokens(deltas)
        return num_tokens, time.monotonic() - started_s, closed

    num_tokens, took_s, closed = asyncio.run(main())
    assert num_tokens == 44
    assert took_s < UNREAD_DRAIN_S + 0.5
    assert closed == [True]  # the engine call is cancelled once the budget is spent


def test_a_finished_or_failed_engine_stream_ends_the_count() -> None:
    async def finished() -> AsyncGenerator[Delta, None]:
        yield Delta([7, 8])
        yield Delta([9], FinishReason.LENGTH, 3)

    async def failing() -> AsyncGenerator[Delta, None]:
        yield Delta([7])
        raise EngineError(EngineErrorKind.ENGINE_ERROR, "replica lost")

    assert asyncio.run(_num_unread_tokens(finished())) == 3
    assert asyncio.run(_num_unread_tokens(failing())) == 1
