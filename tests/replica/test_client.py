"""GenerateStream cancels a request the consumer abandoned, and never one that already finished.

Cancelling a finished request races the model's final response; Triton 2.51 was seen to crash on it.
A fake stands in for gRPC's aio call (named as one): only the call's iteration and cancel matter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from sluice.triton import client as client_module
from sluice.triton.client import GenerateStream, TokenChunk, request_tensors


class FakeCall:
    """Yields each chunk as its response, then optionally hangs instead of ending; records cancel()."""

    def __init__(self, chunks: list[TokenChunk], hang_at_end: bool = False) -> None:
        self.chunks = list(chunks)
        self.hang_at_end = hang_at_end
        self.num_cancels = 0
        self.ended = False

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> TokenChunk:
        await asyncio.sleep(0)
        if self.chunks:
            return self.chunks.pop(0)
        if self.hang_at_end:
            await asyncio.sleep(3600)
        self.ended = True
        raise StopAsyncIteration

    def cancel(self) -> bool:
        self.num_cancels += 1
        return True


class FakeChannel:
    """gRPC's aio channel (named as one): its unary-stream method starts the one call."""

    def __init__(self, call: FakeCall) -> None:
        self.call = call

    def unary_stream(self, method: str, **serializers: Any) -> Callable[..., FakeCall]:
        assert method == client_module.MODEL_STREAM_INFER
        return lambda request, timeout=None: self.call


class FakeClient:
    """tritonclient's aio client (named as one): only its channel is used."""

    def __init__(self, call: FakeCall) -> None:
        self._channel = FakeChannel(call)


@pytest.fixture(autouse=True)
def chunks_are_passed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "chunk_from_response", lambda chunk: chunk)


def stream(call: FakeCall, drain_timeout_s: float = 1.0) -> GenerateStream:
    tensors = request_tensors(np.array([1, 2, 3]).tolist(), 4, cache_scope="acme")
    return GenerateStream(FakeClient(call), "m", tensors, drain_timeout_s=drain_timeout_s)  # type: ignore[arg-type]


TOKENS = [TokenChunk([5]), TokenChunk([6]), TokenChunk([7], finish_reason="length")]


async def consume_until_finish(s: GenerateStream) -> None:
    async with s:
        async for chunk in s:
            if chunk.finish_reason:
                return


def test_a_finished_request_is_drained_not_cancelled() -> None:
    call = FakeCall(TOKENS)
    asyncio.run(consume_until_finish(stream(call)))
    assert call.num_cancels == 0 and call.ended


def test_a_generator_closed_right_after_the_finish_drains_too() -> None:
    call = FakeCall(TOKENS)

    async def gen() -> AsyncIterator[TokenChunk]:
        async with stream(call) as s:
            async for chunk in s:
                yield chunk

    async def main() -> None:
        agen = gen()
        async for chunk in agen:
            if chunk.finish_reason:
                break
        await agen.aclose()

    asyncio.run(main())
    assert call.num_cancels == 0 and call.ended


def test_an_abandoned_request_is_cancelled() -> None:
    call = FakeCall(TOKENS)

    async def main() -> None:
        async with stream(call) as s:
            async for _ in s:
                return  # after the first token

    asyncio.run(main())
    assert call.num_cancels == 1


def test_a_finished_stream_that_never_ends_is_cancelled_after_the_drain_timeout() -> None:
    call = FakeCall(TOKENS, hang_at_end=True)
    asyncio.run(consume_until_finish(stream(call, drain_timeout_s=0.05)))
    assert call.num_cancels == 1
