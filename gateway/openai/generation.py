"""One request's generation: admitted (safety screen of the prompt, the tenant's quota, the model's queue),
then engine deltas in, screened text events out, and ONE ``finally`` that cancels the engine call,
releases the replica slot and the quota, settles the idempotency record and writes the usage record, the
telemetry line and the metrics, however it ends (finished, stop string, deadline, content filter, client
gone, engine failure, refused).

``generate_text`` is an async generator; callers must close it (``contextlib.aclosing``). A refusal is
raised (``OpenAIError``) before the first event, so it can still be an HTTP error. A client disconnect
reaches it as a cancellation at its current ``await``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import suppress

import anyio

from gateway.errors import OpenAIError
from gateway.openai.idempotency import begin_attempt, settle_attempt
from gateway.openai.job import Event, FinishEvent, IdempotentAttempt, Job, TextEvent, Timing
from gateway.openai.records import Ended, record_request
from gateway.openai.stops import StopMatcher
from gateway.scheduling.quota_gate import acquire_quota
from gateway.scheduling.scheduler import Admission, Slot
from gateway.state import GatewayState
from sluice.domain import Outcome, RequestClass
from sluice.engine_client import Delta, EngineError, EngineErrorKind, FinishReason, GenerateRequest
from sluice.quota.base import QuotaGrant
from sluice.safety.base import ClassifierUnavailableError, Verdict
from sluice.safety.policy import SafetyPolicy
from sluice.safety.stream import StreamScreen

log = logging.getLogger(__name__)


def _finish_reason(reason: FinishReason) -> str:
    return "stop" if reason is FinishReason.STOP else "length"


async def generate_text(job: Job, gw: GatewayState, timing: Timing) -> AsyncGenerator[Event, None]:
    """Admit the request, then yield its text as it is produced and one ``FinishEvent``.
    Raises ``OpenAIError`` if refused before any event, ``EngineError`` if the replica fails.

    ``timing`` is filled in as tokens arrive (``Timing(job.arrival_s)``)."""
    request = GenerateRequest(
        request_id=job.request_id,
        prompt_token_ids=job.prompt_token_ids,
        max_tokens=job.max_tokens,
        temperature=job.temperature,
        top_p=job.top_p,
        seed=job.seed,
        cache_scope=job.tenant.tenant_id,
        priority=1 if job.request_class is RequestClass.BATCH else 0,
        ignore_eos=job.ignore_eos,
    )
    detok = gw.codec.detokenizer()
    stops = StopMatcher(job.stop)
    outcome: Outcome | None = None  # None at the end: the caller went away
    finish_reason: str | None = None
    error: str | None = None
    num_output_tokens = 0
    reached_replica = False
    texts: list[str] = []  # what the client was sent: kept only with an Idempotency-Key, for replays
    verdict: Verdict | None = None
    attempt: IdempotentAttempt | None = None
    grant: QuotaGrant | None = None
    slot: Slot | None = None
    engine_deltas: AsyncGenerator[Delta, None] | None = None
    screen: StreamScreen | None = None
    try:
        if job.idempotency_key is not None:  # 409 while another attempt runs, 422 for another body
            begun = await begin_attempt(gw, job)
            if isinstance(begun, list):  # finished before: replay, no generation, no billing
                outcome = Outcome.REPLAYED
                for event in begun:
                    yield event
                return
            attempt = begun
        # Admission: the prompt's safety screen, the tenant's quota, then the model's queue. A refusal
        # raises before any event; none of them costs the tenant anything.
        policy = _safety_policy(job, gw)
        await _screen_prompt(job, gw, policy)
        screen = policy.output_screen(gw.settings.safety_holdback_chars)
        grant = await acquire_quota(
            gw.quota,
            gw.metrics,
            job.tenant,
            len(job.prompt_token_ids) + job.max_tokens,
            job.deadline_s,
            request_id=job.request_id,
        )
        slot = await gw.scheduler.wait_for_dispatch(_admission(job))
        reached_replica = True
        engine_deltas = gw.engine.generate(request)
        gw.metrics.in_flight.inc()
        timing.engine_start_s = time.monotonic()
        while finish_reason is None:
            ended = False
            try:
                async with asyncio.timeout(job.deadline_s - time.monotonic()):
                    delta: Delta = await anext(engine_deltas)
            except TimeoutError:
                outcome, finish_reason = Outcome.DEADLINE, "length"
                emit, ended = stops.flush() + detok.finish(), True
            except StopAsyncIteration:
                # The engine client's contract is a final delta with a finish reason.
                raise EngineError(
                    EngineErrorKind.ENGINE_ERROR, "the replica ended the stream without finishing"
                ) from None
            else:
                num_output_tokens += len(delta.token_ids)
                now = time.monotonic()
                gap_s = None if timing.last_token_s is None else now - timing.last_token_s
                timing.observe(now, len(delta.token_ids))
                gw.scheduler.on_tokens(slot, len(delta.token_ids), gap_s)
                text = detok.push(delta.token_ids)
                if delta.finish_reason is not None:
                    text += detok.finish()
                emit, hit_stop = stops.feed(text)
                if hit_stop:
                    outcome, finish_reason, ended = Outcome.FINISHED, "stop", True
                elif delta.finish_reason is not None:
                    emit += stops.flush()
                    outcome, finish_reason = Outcome.FINISHED, _finish_reason(delta.finish_reason)
                    ended = True
            if screen is not None:
                emit, verdict = _screened(screen, emit, ended)
                if verdict is not None:
                    outcome, finish_reason = Outcome.FILTERED, "content_filter"
                    gw.metrics.filtered.labels("output", verdict.category).inc()
            if emit:
                if attempt is not None:
                    texts.append(emit)
                yield TextEvent(emit)
        assert finish_reason is not None
        yield FinishEvent(
            finish_reason,
            len(job.prompt_token_ids),
            num_output_tokens,
            filter_message=verdict.message if verdict is not None else None,
        )
    except OpenAIError as exc:  # refused at admission
        outcome, error = Outcome.REFUSED, exc.code
        raise
    except EngineError as exc:
        outcome, error = Outcome.FAILED, f"{exc.kind}: {exc.message}"
        # A replica that could not be reached ran nothing: no usage row (telemetry still records it).
        reached_replica = exc.kind is not EngineErrorKind.UNAVAILABLE or num_output_tokens > 0
        if screen is not None and verdict is None:  # the stream ends here: what is held back and safe goes
            rest, _ = _screened(screen, "", ended=True)
            if rest:
                if attempt is not None:
                    texts.append(rest)
                yield TextEvent(rest)
        raise
    except Exception as exc:
        outcome, error = Outcome.FAILED, repr(exc)
        raise
    finally:
        # NOTE: shielded, so a client disconnect (a cancelled scope) cannot skip the cancel, the releases
        # or the records.
        with anyio.CancelScope(shield=True):
            if engine_deltas is not None:
                with suppress(Exception):
                    await engine_deltas.aclose()  # cancels the engine call if it is still running
                gw.metrics.in_flight.dec()
            if slot is not None:
                gw.scheduler.release(slot)
            if grant is not None:
                used_tokens = len(job.prompt_token_ids) + num_output_tokens if reached_replica else 0
                with suppress(Exception):
                    await gw.quota.settle(grant, used_tokens)
            outcome = outcome or Outcome.CANCELLED
            if attempt is not None:
                filter_message = verdict.message if verdict is not None else None
                await settle_attempt(
                    gw,
                    job,
                    attempt,
                    outcome,
                    finish_reason,
                    "".join(texts),
                    num_output_tokens,
                    filter_message,
                )
            ended_as = Ended(outcome, finish_reason, num_output_tokens, error, reached_replica)
            await record_request(job, gw, ended_as, timing, attempt)


def _safety_policy(job: Job, gw: GatewayState) -> SafetyPolicy:
    policy = gw.safety.get(job.tenant.safety_policy)
    if policy is None:  # the tenant names a policy this gateway was not configured with
        log.error("tenant %s names unknown safety policy %r", job.tenant.tenant_id, job.tenant.safety_policy)
        raise OpenAIError(
            500,
            "This API key's safety policy is not configured on this gateway.",
            type="server_error",
            code="safety_policy_unknown",
        )
    return policy


async def _screen_prompt(job: Job, gw: GatewayState, policy: SafetyPolicy) -> None:
    """400 ``content_filter`` for a blocked prompt; 503 if a remote classifier cannot be reached (fail
    closed: an unscreened prompt never reaches a replica)."""
    try:
        verdict = await policy.screen_input(job.prompt_text)
    except ClassifierUnavailableError as exc:
        log.warning("safety classifier unavailable: %s", exc)
        raise OpenAIError(
            503,
            "The safety classifier is unavailable; retry later.",
            type="server_error",
            code="safety_classifier_unavailable",
            retry_after_s=1.0,
        ) from None
    if verdict is not None:
        gw.metrics.filtered.labels("input", verdict.category).inc()
        raise OpenAIError(
            400, f"The prompt was blocked: {verdict.message}.", code="content_filter", param="prompt"
        )


def _screened(screen: StreamScreen, text: str, ended: bool) -> tuple[str, Verdict | None]:
    """The part of ``text`` that is safe to send now (all of it that was screened once the stream
    ended), or the verdict that ends the stream (and nothing more is sent)."""
    released, verdict = screen.feed(text) if text else ("", None)
    if verdict is None and ended:
        rest, verdict = screen.finish()
        released += rest
    return released, verdict


def _admission(job: Job) -> Admission:
    return Admission(
        request_id=job.request_id,
        tenant_id=job.tenant.tenant_id,
        weight=job.tenant.weight,
        request_class=job.request_class,
        prompt_tokens=len(job.prompt_token_ids),
        max_tokens=job.max_tokens,
        arrival_s=job.arrival_s,
        deadline_s=job.deadline_s,
    )
