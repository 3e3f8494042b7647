"""One admitted request's generation: engine deltas in, text events out, and ONE ``finally`` that cancels
the engine call and writes the usage record, the telemetry record and the metrics, however it ends
(finished, stop string, deadline, client gone, engine failure).

``generate_text`` is an async generator; callers must close it (``contextlib.aclosing``). A client
disconnect reaches it as a cancellation at its current ``await``.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio

from gateway.errors import OpenAIError
from gateway.openai.stops import StopMatcher
from gateway.scheduling.quota_gate import acquire_quota
from gateway.scheduling.scheduler import Admission, Slot
from gateway.state import GatewayState
from gateway.telemetry import TelemetryRecord
from sluice.domain import Outcome, RequestClass, Tenant, UsageRecord
from sluice.engine_client import Delta, EngineError, EngineErrorKind, FinishReason, GenerateRequest
from sluice.quota.base import QuotaGrant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """A request that passed auth and every limit: what the engine is asked to do."""

    request_id: str
    route: str
    tenant: Tenant
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: list[str]
    ignore_eos: bool
    arrival_s: float  # time.monotonic() at arrival (ns resolution; uvloop's loop.time() has only ms)
    deadline_s: float  # time.monotonic() by which generation stops
    request_class: RequestClass = RequestClass.INTERACTIVE
    created: int = field(default_factory=lambda: int(time.time()))
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class TextEvent:
    text: str


@dataclass(frozen=True)
class FinishEvent:
    finish_reason: str  # OpenAI's: "stop" or "length"
    prompt_tokens: int
    output_tokens: int


Event = TextEvent | FinishEvent


@dataclass
class Timing:
    """When tokens arrived, as the gateway saw them (several tokens in one delta arrive together).

    The caller creates it and may read it while the request runs: once the first event is out,
    ``engine_start_s`` and ``first_token_s`` split TTFT into the gateway's part and the replica's.
    """

    arrival_s: float
    engine_start_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)

    def server_timing(self) -> str:
        """A ``Server-Timing`` header value (ms): time in the gateway before the replica call, and the
        replica's time to first token as seen from the gateway."""
        parts = []
        if self.engine_start_s is not None:
            parts.append(f"gateway;dur={(self.engine_start_s - self.arrival_s) * 1000:.3f}")
            if self.first_token_s is not None:
                parts.append(f"replica-ttft;dur={(self.first_token_s - self.engine_start_s) * 1000:.3f}")
        return ", ".join(parts)

    def observe(self, now: float, num_tokens: int) -> None:
        if num_tokens == 0:
            return
        if self.first_token_s is None:
            self.first_token_s = now
            self.gaps_s.extend([0.0] * (num_tokens - 1))
        else:
            assert self.last_token_s is not None
            self.gaps_s.append(now - self.last_token_s)
            self.gaps_s.extend([0.0] * (num_tokens - 1))
        self.last_token_s = now


def _finish_reason(reason: FinishReason) -> str:
    return "stop" if reason is FinishReason.STOP else "length"


async def generate_text(job: Job, gw: GatewayState, timing: Timing) -> AsyncGenerator[Event, None]:
    """Admit the request (quota, queue), then yield its text as it is produced and one ``FinishEvent``.
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
    grant: QuotaGrant | None = None
    slot: Slot | None = None
    engine_deltas: AsyncGenerator[Delta, None] | None = None
    try:
        # Admission: the tenant's quota, then the model's queue. A refusal raises (429) before any event.
        grant = await acquire_quota(
            gw.quota, gw.metrics, job.tenant, len(job.prompt_token_ids) + job.max_tokens, job.deadline_s
        )
        slot = await gw.scheduler.wait_for_dispatch(_admission(job))
        reached_replica = True
        engine_deltas = gw.engine.generate(request)
        gw.metrics.in_flight.inc()
        timing.engine_start_s = time.monotonic()
        while finish_reason is None:
            try:
                async with asyncio.timeout(job.deadline_s - time.monotonic()):
                    delta: Delta = await anext(engine_deltas)
            except TimeoutError:
                outcome, finish_reason = Outcome.DEADLINE, "length"
                text = stops.flush() + detok.finish()
                if text:
                    yield TextEvent(text)
                break
            except StopAsyncIteration:
                # The engine client's contract is a final delta with a finish reason.
                raise EngineError(
                    EngineErrorKind.ENGINE_ERROR, "the replica ended the stream without finishing"
                ) from None
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
                outcome, finish_reason = Outcome.FINISHED, "stop"
            elif delta.finish_reason is not None:
                emit += stops.flush()
                outcome, finish_reason = Outcome.FINISHED, _finish_reason(delta.finish_reason)
            if emit:
                yield TextEvent(emit)
        assert finish_reason is not None
        yield FinishEvent(finish_reason, len(job.prompt_token_ids), num_output_tokens)
    except OpenAIError as exc:  # refused at admission
        outcome, error = Outcome.REFUSED, exc.code
        raise
    except EngineError as exc:
        outcome, error = Outcome.FAILED, f"{exc.kind}: {exc.message}"
        # A replica that could not be reached ran nothing: no usage row (telemetry still records it).
        reached_replica = exc.kind is not EngineErrorKind.UNAVAILABLE or num_output_tokens > 0
        raise
    except Exception as exc:
        outcome, error = Outcome.FAILED, repr(exc)
        raise
    finally:
        # NOTE: shielded, so a client disconnect (a cancelled scope) cannot skip the cancel, the release
        # of the replica slot and the quota, or the records.
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
            await _record(job, gw, outcome, finish_reason, num_output_tokens, timing, error, reached_replica)


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


async def _record(
    job: Job,
    gw: GatewayState,
    outcome: Outcome,
    finish_reason: str | None,
    num_output_tokens: int,
    timing: Timing,
    error: str | None,
    reached_replica: bool,
) -> None:
    now = time.monotonic()
    num_prompt_tokens = len(job.prompt_token_ids)
    ttft_s = None if timing.first_token_s is None else timing.first_token_s - job.arrival_s
    gaps_ms = [g * 1000 for g in timing.gaps_s]
    record = TelemetryRecord(
        request_id=job.request_id,
        tenant_id=job.tenant.tenant_id,
        model=job.model,
        model_version=gw.engine.model_version,
        replica=gw.engine.replica,
        engine_client=gw.engine.kind,
        queue_ms=round(((timing.engine_start_s or now) - job.arrival_s) * 1000, 3),
        ttft_ms=None if ttft_s is None else round(ttft_s * 1000, 3),
        replica_ttft_ms=_ms_between(timing.engine_start_s, timing.first_token_s),
        prompt_tokens=num_prompt_tokens,
        output_tokens=num_output_tokens,
        inter_token_p50_ms=round(statistics.median(gaps_ms), 3) if gaps_ms else None,
        inter_token_max_ms=round(max(gaps_ms), 3) if gaps_ms else None,
        duration_ms=round((now - job.arrival_s) * 1000, 3),
        outcome=str(outcome),
        finish_reason=finish_reason,
        error=error,
    )
    try:
        gw.telemetry.write(record)
    except OSError:
        log.exception("telemetry record for %s was not written", job.request_id)
    metrics = gw.metrics
    if outcome is not Outcome.REFUSED:  # a refusal is counted where it becomes an HTTP error
        status_code = "500" if outcome is Outcome.FAILED else "200"
        metrics.requests.labels(job.route, status_code, str(outcome)).inc()
    metrics.prompt_tokens.inc(num_prompt_tokens)
    metrics.output_tokens.inc(num_output_tokens)
    if ttft_s is not None:
        metrics.ttft_s.observe(ttft_s)
    for gap_s in timing.gaps_s:
        metrics.inter_token_s.observe(gap_s)
    # Last: once the usage row is visible, the telemetry record and metrics are already written.
    if not reached_replica:
        return
    try:
        await gw.meter.record(
            UsageRecord(
                tenant_id=job.tenant.tenant_id,
                request_id=job.request_id,
                model=job.model,
                model_version=gw.engine.model_version,
                prompt_tokens=num_prompt_tokens,
                output_tokens=num_output_tokens,
                status=outcome,
                started_at=job.started_at,
                finished_at=datetime.now(UTC),
            )
        )
    except Exception:
        log.exception("usage record for %s was not written", job.request_id)


def _ms_between(start_s: float | None, end_s: float | None) -> float | None:
    return None if start_s is None or end_s is None else round((end_s - start_s) * 1000, 3)
