"""One request's generation: admitted (the Idempotency-Key's stored state, safety screen of the prompt, the
tenant's quota, the key's attempt, the model's queue), opened in the usage outbox at dispatch, then engine
deltas in (their token counts checkpointed, so a gateway crash still bills them), screened text events
out, and ONE ``finally`` that cancels the engine call, releases the replica slot and the quota, settles
the idempotency record and writes the usage record, the telemetry line and the metrics, however it ends
(finished, stop string, deadline, content filter, client gone, engine failure, refused).

``generate_text`` is an async generator; callers must close it (``contextlib.aclosing``). A refusal is
raised (``OpenAIError``) before the first event, so it can still be an HTTP error. A client disconnect
reaches it as a cancellation at its current ``await``.

Failover: a replica that cannot be reached (``EngineErrorKind.UNAVAILABLE``: refused, reset, died) is
suspended in the scheduler at once. If the client has seen nothing of the output yet (no token, or tokens
whose text the stop strings or the output screen still held back) and another replica takes work, it
goes back to the head of the queue and on to another replica (``_next_delta``), at most
``max_redispatches`` times and never past its deadline, keeping its usage record, quota grant and
idempotency attempt: the client sees a later first token, and is billed for the output it was sent, not
the lost replica's tokens it never saw. Otherwise it fails with the replica's error. A caller that reads the
whole answer before anything goes back (``collected``: a non-streaming response, a batch line) gets its
text events only with the finish, so for it nothing is sent until the end and a lost replica is replaced
at any point of the answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Coroutine
from contextlib import suppress
from dataclasses import dataclass, field

import anyio

from gateway.errors import OpenAIError
from gateway.metering.pipeline import OpenUsage
from gateway.openai.idempotency import begin_attempt, lookup_attempt, settle_attempt
from gateway.openai.job import (
    Event,
    FinishEvent,
    IdempotentAttempt,
    Job,
    QuotaTaken,
    TextEvent,
    Timing,
    TokenLogprobs,
)
from gateway.openai.records import Ended, record_request, usage_record
from gateway.openai.stops import StopMatcher
from gateway.scheduling.quota_gate import acquire_quota
from gateway.scheduling.scheduler import Slot
from gateway.state import GatewayState
from sluice.domain import Outcome
from sluice.engine_client import (
    Delta,
    EngineError,
    EngineErrorKind,
    EnginePriority,
    FinishReason,
    GenerateRequest,
)
from sluice.safety.base import ClassifierUnavailableError, Verdict
from sluice.safety.policy import SafetyPolicy
from sluice.safety.stream import StreamScreen
from sluice.stores.quota.base import QuotaGrant
from sluice.text import IncrementalDetokenizer
from sluice.wire import TokenLogprob

log = logging.getLogger(__name__)

# How long a request whose client left may spend taking the engine's unread output before cancelling it.
UNREAD_DRAIN_S = 0.005
# A re-dispatched request that is not dispatched again this long before its deadline fails.
REDISPATCH_MARGIN_S = 0.05


def _finish_reason(reason: FinishReason) -> str:
    return "stop" if reason is FinishReason.STOP else "length"


@dataclass
class _Ending:
    """What the one ``finally`` needs, however the request ended; filled in as it goes."""

    outcome: Outcome | None = None  # None at the end: the caller went away
    finish_reason: str | None = None
    error: str | None = None
    num_output_tokens: int = 0
    num_lost_tokens: int = 0  # made by replicas lost before any output was sent: not billed
    output_sent: bool = False  # an event of the output went to the caller: it cannot be taken back
    # The caller collects the whole answer: its text events wait here for the finish (None: streamed).
    held_events: list[TextEvent] | None = None
    num_cached_tokens: int | None = None  # from the final delta: prompt tokens its prefix cache served
    reached_replica: bool = False
    num_dispatches: int = 0  # to a replica: 1 + its re-dispatches
    failed_replicas: list[str] = field(default_factory=list)  # the replicas that could not be reached
    num_unread_tokens: int = 0  # the client left: tokens the engine made that were never read
    texts: list[str] = field(default_factory=list)  # sent: kept only with an Idempotency-Key, for replays
    verdict: Verdict | None = None
    attempt: IdempotentAttempt | None = None
    grant: QuotaGrant | None = None
    slot: Slot | None = None
    usage: OpenUsage | None = None  # open in the usage outbox from dispatch to the final record
    answers: list[_Answer] = field(default_factory=list)  # n of them, once admitted
    policy: SafetyPolicy | None = None  # the tenant's, once admitted
    engine_deltas: AsyncGenerator[Delta, None] | None = None


@dataclass
class _Answer:
    """One answer's path from tokens to text (n per request): its detokenizer, stop strings and output
    screen, its finish reason once it ended, and the log-probabilities of tokens whose text is not out."""

    index: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    screen: StreamScreen | None
    eos_token_ids: tuple[int, ...]
    finish_reason: str | None = None
    pending_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # not sent yet (echo with logprobs)

    def take(self, delta: Delta) -> str:
        """The text ``delta`` releases past the stop strings (ending the answer at a stop string or at the
        engine's finish)."""
        if delta.logprobs is not None:
            self.pending_logprobs.extend(zip(delta.token_ids, delta.logprobs, strict=True))
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        text = self.detok.push(delta.token_ids)
        if delta.finish_reason is not None:
            text += self.detok.finish()
        emit, hit_stop = self.stops.feed(text)
        if hit_stop:
            self.finish_reason = "stop"
        elif delta.finish_reason is not None:
            emit += self.stops.flush()
            self.finish_reason = _finish_reason(delta.finish_reason)
            if delta.finish_reason is FinishReason.STOP and delta.token_ids:
                self._drop_final_eos(delta.token_ids[-1])
        return emit

    def end_as(self, reason: str) -> str:
        """End the answer now (its deadline): the text it still holds."""
        self.finish_reason = reason
        return self.stops.flush() + self.detok.finish()

    def take_logprobs(self) -> tuple[TokenLogprobs, ...]:
        """The log-probabilities to send with the text going out now: every one held (its text is out, or
        was cut by a stop string or the end)."""
        taken = tuple(self.pending_logprobs)
        self.pending_logprobs.clear()
        return taken

    def _drop_final_eos(self, token: int) -> None:
        """The end-of-sequence token that ended the answer is not part of it (OpenAI reports none)."""
        if token in self.eos_token_ids and self.pending_logprobs and self.pending_logprobs[-1][0] == token:
            self.pending_logprobs.pop()


async def generate_text(
    job: Job,
    gw: GatewayState,
    timing: Timing,
    quota_taken: QuotaTaken | None = None,
    *,
    collected: bool = False,
) -> AsyncGenerator[Event, None]:
    """Admit the request, then yield its text as it is produced and one ``FinishEvent``.
    Raises ``OpenAIError`` if refused before any event, ``EngineError`` if the replica fails.

    ``timing`` is filled in as tokens arrive (``Timing(job.arrival_s)``); ``quota_taken``, if given, gets the
    quota grant of a request that will generate, before the first event (for the rate-limit headers).
    ``collected``: the caller reads the whole answer before any of it goes back, so the text events are
    yielded together just before the finish (and a replica lost before then can be replaced)."""
    end = _Ending(held_events=[] if collected else None)
    deadline: _Deadline | None = None
    try:
        replay = await _admit(job, gw, end)
        if quota_taken is not None and replay is None:  # a replay's grant (if any) goes back unused
            quota_taken.grant = end.grant
        if replay is not None:  # finished before: replay, no generation, no billing
            end.outcome = Outcome.REPLAYED
            for event in replay:
                yield event
            return
        assert end.slot is not None  # dispatched: _admit returned no replay
        end.engine_deltas = end.slot.engine.generate(_engine_request(job, end.slot.priority))
        gw.metrics.in_flight.inc()
        timing.engine_start_s = time.monotonic()
        deadline = _Deadline(job.deadline_s)
        answers = end.answers
        while end.finish_reason is None:
            try:
                delta = await deadline.wait(_next_delta(job, gw, end, timing))
            except TimeoutError:
                end.outcome = Outcome.DEADLINE
                ready = [(a, a.end_as("length")) for a in answers if a.finish_reason is None]
            except StopAsyncIteration:
                # The engine client's contract is a final delta with a finish reason.
                raise EngineError(
                    EngineErrorKind.ENGINE_ERROR, "the replica ended the stream without finishing"
                ) from None
            else:
                if end.usage is not None and end.usage.opening is not None:
                    await gw.meter.opened(end.usage)  # the first output waits for its open line
                ready = _taken(job, gw, end, timing, delta)
            for event in _text_events(gw, end, ready):
                if end.held_events is not None:
                    end.held_events.append(event)
                else:
                    end.output_sent = True
                    yield event
            if end.finish_reason is None and all(a.finish_reason is not None for a in answers):
                end.outcome = end.outcome or Outcome.FINISHED
                end.finish_reason = answers[0].finish_reason
        assert end.finish_reason is not None
        for event in end.held_events or ():
            yield event
        yield FinishEvent(
            end.finish_reason,
            len(job.prompt_token_ids),
            end.num_output_tokens,
            filter_message=end.verdict.message if end.verdict is not None else None,
            finish_reasons=tuple(a.finish_reason or "length" for a in answers) if len(answers) > 1 else (),
        )
    except OpenAIError as exc:  # refused at admission
        end.outcome, end.error = Outcome.REFUSED, exc.code
        raise
    except EngineError as exc:
        end.outcome, end.error = Outcome.FAILED, f"{exc.kind}: {exc.message}"
        # A replica that could not be reached ran nothing: no usage row (telemetry still records it), unless
        # one before it ran the prompt (its tokens were lost, the prompt is billed).
        end.reached_replica = (
            exc.kind is not EngineErrorKind.UNAVAILABLE or end.num_output_tokens + end.num_lost_tokens > 0
        )
        sends_rest = end.verdict is None and end.held_events is None  # a collected answer fails whole
        for answer in end.answers if sends_rest else ():  # what is held back and safe goes
            if answer.screen is None or answer.finish_reason is not None:
                continue
            rest, _ = _screened(answer.screen, "", ended=True)
            if rest:
                if end.attempt is not None:
                    end.texts.append(rest)
                yield TextEvent(rest, answer.index)
        raise
    except Exception as exc:
        # NOTE: the type only: a repr may carry the request's text (a UnicodeDecodeError's holds the bytes
        # it failed on), and telemetry never does; the error handler logs the exception with its request id.
        end.outcome, end.error = Outcome.FAILED, f"internal: {type(exc).__name__}"
        raise
    finally:
        if deadline is not None:
            deadline.close()
        # NOTE: shielded, so a client disconnect (a cancelled scope) cannot skip the cancel, the releases
        # or the records.
        with anyio.CancelScope(shield=True):
            await _settle(job, gw, timing, end)


def _taken(
    job: Job, gw: GatewayState, end: _Ending, timing: Timing, delta: Delta
) -> list[tuple[_Answer, str]]:
    """A delta counted (the output tokens, their checkpoint, timing, the replica's pacing) and taken by
    its answer: the (answer, text) ready to send, none for an answer already ended."""
    end.num_output_tokens += len(delta.token_ids)
    gw.meter.checkpoint(end.usage, end.num_output_tokens)  # what a crash from here bills
    now = time.monotonic()
    gap_s = None if timing.last_token_s is None else now - timing.last_token_s
    timing.observe(now, len(delta.token_ids))
    assert end.slot is not None
    job.target.scheduler.on_tokens(end.slot, len(delta.token_ids), gap_s)
    if delta.finish_reason is not None:
        end.num_cached_tokens = delta.num_cached_tokens
    if not 0 <= delta.index < len(end.answers):
        raise EngineError(EngineErrorKind.ENGINE_ERROR, f"the replica sent answer {delta.index}")
    answer = end.answers[delta.index]
    # NOTE: an answer that met a stop string while others run (n > 1) makes tokens until the engine ends
    # it: counted and billed above, not sent.
    return [] if answer.finish_reason is not None else [(answer, answer.take(delta))]


def _text_events(gw: GatewayState, end: _Ending, ready: list[tuple[_Answer, str]]) -> list[TextEvent]:
    """The events of the ready texts, each screened by its answer's output screen: up to and including
    the safe part before a verdict, which ends every answer as ``content_filter``."""
    events = []
    for answer, text in ready:
        ended = answer.finish_reason is not None
        if answer.screen is not None:
            text, end.verdict = _screened(answer.screen, text, ended)
            if end.verdict is not None:
                end.outcome, end.finish_reason = Outcome.FILTERED, "content_filter"
                gw.metrics.filtered.labels("output", end.verdict.category).inc()
                for other in end.answers:
                    other.finish_reason = other.finish_reason or "content_filter"
                answer.finish_reason = "content_filter"
        if text or (ended and answer.pending_logprobs) or answer.prompt_logprobs:
            if end.attempt is not None:
                end.texts.append(text)
            prompt, answer.prompt_logprobs = answer.prompt_logprobs, ()
            events.append(TextEvent(text, answer.index, answer.take_logprobs(), prompt))
        if end.verdict is not None:
            break
    return events


async def _admit(job: Job, gw: GatewayState, end: _Ending) -> list[Event] | None:
    """Admission, cheapest refusal first: the key's stored state (read only), the prompt's safety screen,
    the tenant's quota, the key's attempt (its first write), the model's queue. A refusal raises before
    any event and costs the tenant nothing. Returns a stored result's events to replay, or None once the
    request holds its slot on a replica and is open in the usage outbox (what a gateway crash bills)."""
    if job.idempotency_key is not None:  # a replay, 409 or 422 before any other work
        replay = await lookup_attempt(gw, job)
        if replay is not None:
            return replay
    end.policy = policy = _safety_policy(job, gw)
    await _screen_prompt(job, gw, policy)
    end.answers = _new_answers(job, gw, policy)
    end.grant = await acquire_quota(
        gw.quota,
        gw.metrics,
        job.model,
        job.tenant,
        len(job.prompt_token_ids) + job.max_tokens,  # every answer's tokens (n)
        job.deadline_s,
        request_id=job.request_id,
    )
    if job.idempotency_key is not None:
        # NOTE: after the quota: a request refused above leaves no record. A result or a running attempt
        # found now (a race since the lookup) answers as the lookup would; the grant goes back unused.
        begun = await begin_attempt(gw, job)
        if isinstance(begun, list):
            return begun
        end.attempt = begun
    end.slot = await job.target.scheduler.wait_for_dispatch(job, prefix_key=_prefix_key(job))
    end.num_dispatches = 1
    if job.batch_id is None:
        end.usage = gw.meter.begin(usage_record(job, gw, end.attempt))  # on disk before the first output
    # NOTE: a batch line is not opened in the usage outbox: had its gateway died mid-line, the line is in
    # no committed part and runs again, and the ledger keeps a row's first write: a row billed from the
    # last checkpoint would stand for the whole output of the run the batch reports.
    end.reached_replica = True
    return None


def _new_answers(job: Job, gw: GatewayState, policy: SafetyPolicy) -> list[_Answer]:
    codec, holdback = job.target.codec, gw.settings.safety_holdback_chars
    return [
        _Answer(
            i, codec.detokenizer(), StopMatcher(job.stop), policy.output_screen(holdback), codec.eos_token_ids
        )
        for i in range(job.sampling.n)
    ]


async def _settle(job: Job, gw: GatewayState, timing: Timing, end: _Ending) -> None:
    """The one ending of every request: cancel the engine call, release the slot and the quota, settle the
    idempotency record, then write the telemetry, metrics and usage records."""
    # The client left (its cancellation reached the generation just now): cancel-to-free starts here.
    client_left_s = time.monotonic() if end.outcome is None else None
    if end.engine_deltas is not None:
        if end.outcome is None:  # the client left: what the engine made and nobody read was still made
            end.num_unread_tokens = await _num_unread_tokens(end.engine_deltas)
            end.num_output_tokens += end.num_unread_tokens
        with suppress(Exception):
            await end.engine_deltas.aclose()  # cancels the engine call if it is still running
        gw.metrics.in_flight.dec()
    if end.slot is not None:
        job.target.scheduler.release(end.slot)
    if client_left_s is not None:
        held_slot = end.engine_deltas is not None
        cancel_to_free_s = time.monotonic() - client_left_s if held_slot else None
        gw.metrics.count_cancelled(job.model, job.model_version, job.request_class, cancel_to_free_s)
    if end.grant is not None:
        used_tokens = len(job.prompt_token_ids) + end.num_output_tokens if end.reached_replica else 0
        with suppress(Exception):
            await gw.quota.settle(end.grant, used_tokens)
    if end.outcome is None:
        runs_again = job.runs_again_if_cut is not None and job.runs_again_if_cut()
        end.outcome = Outcome.INTERRUPTED if runs_again else Outcome.CANCELLED
    if end.attempt is not None:
        await settle_attempt(
            gw,
            job,
            end.attempt,
            end.outcome,
            end.finish_reason,
            "".join(end.texts),
            end.num_output_tokens,
            end.verdict.message if end.verdict is not None else None,
        )
    ended_as = Ended(
        end.outcome,
        end.finish_reason,
        end.num_output_tokens,
        end.error,
        end.reached_replica,
        end.slot.engine if end.slot is not None else None,
        end.num_cached_tokens,
        end.num_dispatches,
        tuple(end.failed_replicas),
        end.num_unread_tokens,
    )
    await record_request(job, gw, ended_as, timing, end.attempt, end.usage)


class _Deadline:
    """The request's deadline, one timer for the whole generation: while the generation waits for the
    engine's next delta (``wait``), the deadline cancels that wait and ``wait`` raises ``TimeoutError``;
    past it, ``wait`` raises ``TimeoutError`` at once. What ``asyncio.timeout`` around each wait would do,
    without arming and cancelling a timer for every delta.

    NOTE: the task is the one waiting now (the first event is awaited in the request's handler, the rest
    in the response's streaming task). Like ``asyncio.timeout``, a cancellation of the task from elsewhere
    at the same moment stays a cancellation (``uncancel`` counts it)."""

    def __init__(self, deadline_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.expired = False
        self._waiting: asyncio.Task[object] | None = None
        self._cancelled_wait = False
        # NOTE: on the loop's clock (the deadline is time.monotonic()'s, which asyncio's default loop uses).
        self._timer = loop.call_at(loop.time() + (deadline_s - time.monotonic()), self._on_deadline)

    def _on_deadline(self) -> None:
        self.expired = True
        if self._waiting is not None and not self._cancelled_wait:
            self._cancelled_wait = True
            self._waiting.cancel()

    async def wait(self, delta: Coroutine[object, object, Delta]) -> Delta:
        if self.expired:
            delta.close()
            raise TimeoutError
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        self._waiting, self._cancelled_wait = task, False
        try:
            return await delta
        except asyncio.CancelledError:
            if self._cancelled_wait and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._waiting = None

    def close(self) -> None:
        self._timer.cancel()


async def _next_delta(job: Job, gw: GatewayState, end: _Ending, timing: Timing) -> Delta:
    """The generation's next delta. A replica that cannot be reached is suspended; while the client has
    seen none of the output it is replaced (``_redispatch``) if re-dispatches are left and another replica
    takes work, else its error is raised."""
    scheduler = job.target.scheduler
    while True:
        assert end.engine_deltas is not None and end.slot is not None
        try:
            return await anext(end.engine_deltas)
        except EngineError as exc:
            if exc.kind is not EngineErrorKind.UNAVAILABLE:
                raise
            scheduler.suspend(end.slot)  # it takes nothing new from this gateway until it answers again
            end.failed_replicas.append(end.slot.engine.replica)
            if (
                end.output_sent
                or end.num_dispatches > gw.settings.max_redispatches
                or not scheduler.takes_work_besides(end.slot)  # none to go to: fail fast
            ):
                raise
            await _redispatch(job, gw, end, timing, exc)


async def _redispatch(job: Job, gw: GatewayState, end: _Ending, timing: Timing, lost: EngineError) -> None:
    """Back to the head of the queue, then the engine call on the replica it is dispatched to next. Raises
    ``lost`` when its deadline drops it first (the error it would have had without a re-dispatch)."""
    assert end.engine_deltas is not None and end.slot is not None
    with suppress(Exception):
        await end.engine_deltas.aclose()
    scheduler = job.target.scheduler
    # NOTE: end.slot stays the released slot until the next one: release is idempotent, and the telemetry
    # names its replica if the request fails while waiting.
    scheduler.release(end.slot)
    log.info(
        "request %s lost replica %s before any output went back: dispatching it again",
        job.request_id,
        end.slot.replica_key,
    )
    try:
        # NOTE: its own bound, before the stream's deadline: a request out of time fails as the lost
        # replica failed it, not as a generation that ran out of time.
        async with asyncio.timeout(job.deadline_s - REDISPATCH_MARGIN_S - time.monotonic()):
            end.slot = await scheduler.wait_for_dispatch(job, prefix_key=_prefix_key(job), redispatch=True)
    except (OpenAIError, TimeoutError):  # dropped at its deadline
        raise lost from None
    end.num_dispatches += 1
    # The lost replica's tokens, if any, never reached the client (the stop strings or the output screen
    # held their text back, or the caller collects the whole answer): the answers start again, and the
    # client is billed for what it is sent, after a gateway crash too (the checkpoint goes back to 0).
    assert end.policy is not None
    gw.meter.restart(end.usage)
    end.answers[:] = _new_answers(job, gw, end.policy)  # in place: the generation's loop holds the list
    if end.held_events is not None:
        end.held_events.clear()
    end.texts.clear()  # what an Idempotency-Key's replay would have sent of the lost answer
    end.num_lost_tokens += end.num_output_tokens
    end.num_output_tokens = 0
    timing.restart()
    end.engine_deltas = end.slot.engine.generate(_engine_request(job, end.slot.priority))
    timing.engine_start_s = time.monotonic()


async def _num_unread_tokens(deltas: AsyncGenerator[Delta, None]) -> int:
    """Output tokens the engine produced that the gateway had not read yet: a client that stops reading
    holds the generation at its ``yield`` while the engine runs ahead. Takes what is already there (for
    at most ``UNREAD_DRAIN_S``), so those tokens are billed like the ones that were sent."""
    num_tokens = 0
    with suppress(TimeoutError, StopAsyncIteration, EngineError):
        async with asyncio.timeout(UNREAD_DRAIN_S):
            while True:
                num_tokens += len((await anext(deltas)).token_ids)
    return num_tokens


def _engine_request(job: Job, priority: EnginePriority) -> GenerateRequest:
    """``priority``: the engine priority the scheduler gave the request at dispatch (``Slot.priority``)."""
    return GenerateRequest(
        request_id=job.request_id,
        prompt_token_ids=job.prompt_token_ids,
        sampling=job.sampling,
        cache_scope=job.tenant.tenant_id,
        priority=priority,
        eos_token_ids=job.target.codec.eos_token_ids,
        vocab_size=job.target.codec.model_vocab_size,
    )


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


def _prefix_key(job: Job) -> int | None:
    return job.target.scheduler.prefix_key(job.tenant_id, job.prompt_token_ids)
