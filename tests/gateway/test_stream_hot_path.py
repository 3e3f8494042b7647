"""The streaming path's per-token shortcuts behave as what they replaced: a text chunk's SSE bytes from
the stream's framing are ``_sse(shape.text(text))`` byte for byte, and the request's one deadline timer
ends a wait for the next delta as ``asyncio.timeout`` around each wait did."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.openai.controller import ChatShape, CompletionShape, _sse
from gateway.openai.generation import _Deadline
from gateway.openai.job import TextEvent
from sluice.engine_client import Delta, Sampling


def job(**fields: Any) -> Any:
    base = {
        "request_id": "cmpl-abc",
        "created": 1_700_000_000,
        "model": "sluice-tiny",
        "system_fingerprint": "fp_1",
        "sampling": Sampling(16),
        "prompt_text": "",
        "prompt_token_ids": [1],
        "tool_plan": None,
    }
    return SimpleNamespace(**(base | fields))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),
    fingerprint=st.one_of(st.none(), st.text(max_size=8)),
    model=st.text(min_size=1, max_size=12),
)
def test_a_text_chunk_from_the_streams_framing_is_the_whole_chunk_encoded(
    text: str, fingerprint: str | None, model: str
) -> None:
    made = job(system_fingerprint=fingerprint, model=model)
    for shape in (ChatShape(made), CompletionShape([made])):
        plain, escaped = TextEvent(text), TextEvent(text + '"\\\n')
        assert shape.text_sse(plain) == _sse(shape.text(plain))
        assert shape.text_sse(escaped) == _sse(shape.text(escaped))  # the framing is reused


async def _never() -> Delta:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def _at_once() -> Delta:
    return Delta([1])


def test_the_deadline_ends_a_wait_for_the_next_delta_with_a_timeout() -> None:
    async def main() -> None:
        deadline = _Deadline(time.monotonic() + 0.05)
        assert await deadline.wait(_at_once()) == Delta([1])
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await deadline.wait(_never())
        assert 0.02 < time.monotonic() - began < 1.0
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        with pytest.raises(TimeoutError):  # past it: at once, without starting the wait
            await deadline.wait(_at_once())
        deadline.close()

    asyncio.run(main())


def test_a_deadline_that_passes_between_waits_times_out_the_next_wait() -> None:
    async def main() -> None:
        deadline = _Deadline(time.monotonic() + 0.02)
        await asyncio.sleep(0.05)  # not waiting for a delta when it passes: nothing is cancelled
        assert deadline.expired
        started = []

        async def delta() -> Delta:
            started.append(True)
            return Delta([1])

        with pytest.raises(TimeoutError):
            await deadline.wait(delta())
        assert not started

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def main() -> None:
        deadline = _Deadline(time.monotonic() + 3600)
        waiting = asyncio.create_task(deadline.wait(_never()))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        deadline.close()

    asyncio.run(main())


def test_a_cancellation_at_the_deadline_stays_a_cancellation() -> None:
    async def main() -> None:
        deadline = _Deadline(time.monotonic() + 0.02)
        waiting = asyncio.create_task(deadline.wait(_never()))
        await asyncio.sleep(0.005)
        # The deadline fires while the task was also cancelled by someone else: not a timeout.
        loop = asyncio.get_running_loop()
        loop.call_at(deadline._timer.when(), waiting.cancel)
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


def test_closing_the_deadline_disarms_it() -> None:
    async def main() -> None:
        deadline = _Deadline(time.monotonic() + 0.02)
        deadline.close()
        await asyncio.sleep(0.04)
        assert not deadline.expired
        assert await deadline.wait(_at_once()) == Delta([1])

    asyncio.run(main())
