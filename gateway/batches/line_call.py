"""One line of a batch, run as an interactive call is, at the batch class: the same admission (limits,
the model's routing, the prompt's length), the same ``generate_text`` (idempotency aside: safety screen,
quota, the model's fair queue, the replica, metering, telemetry), and the response body the endpoint
would have returned.

The line's request id is ``<batch id>:<custom_id>`` (``results.request_id``): its usage row is keyed by
it, so however often a line runs (a runner killed mid-line runs it again after the restart), the ledger
keeps one row for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import msgspec

from gateway.batches.lines import BatchLine
from gateway.batches.results import LineResult, request_id
from gateway.errors import OpenAIError
from gateway.openai.admission import admit_chat, admit_completion
from gateway.openai.controller import Answer, ChatShape, CompletionShape, collect, engine_http_error
from gateway.openai.generation import generate_text
from gateway.openai.job import FinishEvent, Job, TextEvent, Timing
from gateway.openai.prompts import merged
from gateway.openai.schemas import ChatCompletionRequest
from gateway.state import GatewayState
from sluice.domain import Tenant
from sluice.engine_client import EngineError, EngineErrorKind

# Refusals that pass with time (a tenant over its rate, a full queue, a dependency down): the line waits
# and runs again; it is not a result.
RETRIED_STATUS_CODES = frozenset({429, 503})
DEFAULT_RETRY_AFTER_S = 1.0


class RetryLater(Exception):
    def __init__(self, after_s: float, reason: str) -> None:
        super().__init__(reason)
        self.after_s = after_s
        self.reason = reason


async def run_line(
    line: BatchLine,
    batch_id: str,
    endpoint: str,
    tenant: Tenant,
    gw: GatewayState,
    runs_again_if_cut: Callable[[], bool],
) -> LineResult:
    """The line's result (its response, or the error an interactive call would have had). Raises
    ``RetryLater`` for a refusal that passes with time. ``runs_again_if_cut``: asked if the line is
    cancelled; True: the cut run bills nothing (``Job.runs_again_if_cut``)."""
    body: Any = msgspec.structs.replace(line.body, service_tier="flex")  # the batch class
    arrival_s = time.monotonic()
    line_request_id = request_id(batch_id, line.custom_id)
    try:
        if isinstance(body, ChatCompletionRequest):
            jobs = [await admit_chat(body, tenant, gw, arrival_s)]
        else:
            jobs = await admit_completion(body, tenant, gw, arrival_s)
        jobs = [
            dataclasses.replace(
                job,
                request_id=line_request_id if i == 0 else f"{line_request_id}-{i}",
                batch_id=batch_id,
                custom_id=line.custom_id,
                runs_again_if_cut=runs_again_if_cut,
            )
            for i, job in enumerate(jobs)
        ]
        response = await _generate(jobs, gw)
    except OpenAIError as exc:
        if not exc.counted:
            gw.metrics.count_rejected(endpoint, exc.status_code)
        if exc.status_code in RETRIED_STATUS_CODES:
            reason = exc.code or f"http_{exc.status_code}"  # a bounded metric label
            raise RetryLater(exc.retry_after_s or DEFAULT_RETRY_AFTER_S, reason) from None
        return LineResult(line.index, line.custom_id, exc.status_code, line_request_id, exc.body())
    except EngineError as exc:
        if exc.kind is EngineErrorKind.UNAVAILABLE:  # no replica could take it: as a 503
            raise RetryLater(DEFAULT_RETRY_AFTER_S, "replica_unavailable") from None
        err = engine_http_error(exc)
        return LineResult(line.index, line.custom_id, err.status_code, line_request_id, err.body())
    return LineResult(line.index, line.custom_id, 200, line_request_id, response)


async def _generate(jobs: list[Job], gw: GatewayState) -> Any:
    """The response body the endpoint returns for ``jobs`` (one per prompt; non-streaming)."""
    job = jobs[0]
    shape = ChatShape(job) if job.route == "/v1/chat/completions" else CompletionShape(jobs)
    answers: dict[int, Answer] = {}
    finish: FinishEvent | None = None
    streams = [generate_text(j, gw, Timing(j.arrival_s), collected=True) for j in jobs]
    async with aclosing(merged(streams, job.sampling.n)) as events:
        async for event in events:
            if isinstance(event, TextEvent):
                collect(answers, event)
            else:
                finish = event
    assert finish is not None  # generate_text ends with a FinishEvent or raises
    return msgspec.to_builtins(shape.whole(answers, finish))
