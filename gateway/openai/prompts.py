"""Several prompts in one completions request (OpenAI's ``prompt`` as a list): one ``Job`` per prompt, each
generated, metered and billed on its own (its own usage row, quota grant and telemetry line), and their
events merged into one response whose choices are indexed per prompt (prompt i's answer j is choice
``i * n + j``) and whose usage sums them.

Nothing is sent before every prompt is admitted: a refusal of any of them (its quota, its safety screen)
is the request's HTTP error, and the others are cancelled. An error after that ends the merged stream the
way one prompt's would; leaving early cancels every prompt (``aclose`` of the merged events).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from contextlib import aclosing

from gateway.openai.job import Event, FinishEvent, TextEvent

MAX_PROMPTS = 32  # prompts in one request

_DONE = None


async def merged(streams: list[AsyncGenerator[Event, None]], n: int) -> AsyncGenerator[Event, None]:
    """The events of ``streams`` (one per prompt, each with ``n`` answers) as one request's: text events
    re-indexed per prompt, then one ``FinishEvent`` for them all (``combined``)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for event in only:
                yield event
        return
    queue: asyncio.Queue[tuple[int, Event | Exception | None]] = asyncio.Queue()

    async def pump(i: int, events: AsyncGenerator[Event, None]) -> None:
        try:
            async with aclosing(events):
                async for event in events:
                    await queue.put((i, event))
            await queue.put((i, _DONE))
        except Exception as exc:  # the request's error, raised by the merge
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        not_started = set(range(len(streams)))
        held: list[Event] = []  # events before every prompt was admitted
        finishes: dict[int, FinishEvent] = {}
        num_open = len(streams)
        while num_open:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is _DONE:
                num_open -= 1
                continue
            not_started.discard(i)
            if isinstance(item, FinishEvent):
                finishes[i] = item
                continue
            assert isinstance(item, TextEvent)
            held.append(dataclasses.replace(item, index=i * n + item.index))
            if not not_started:
                for event in held:
                    yield event
                held.clear()
        for event in held:
            yield event
        yield combined([finishes[i] for i in range(len(streams))], n)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def combined(finishes: list[FinishEvent], n: int) -> FinishEvent:
    """One request's end from its prompts' ends: tokens summed, every answer's finish reason in choice
    order, the first filter message (its stream ends with that error event)."""
    messages = [f.filter_message for f in finishes if f.filter_message is not None]
    return FinishEvent(
        finishes[0].finish_reason,
        sum(f.prompt_tokens for f in finishes),
        sum(f.output_tokens for f in finishes),
        filter_message=messages[0] if messages else None,
        finish_reasons=tuple(f.reason_of(j) for f in finishes for j in range(n)),
    )
