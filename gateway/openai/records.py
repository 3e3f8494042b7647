"""What a request leaves behind: at dispatch, the usage record it would cost if the gateway died
(``usage_record``, opened in the durable meter); once from the generation's ``finally``, the telemetry
line, the metrics, and (if it reached a replica) its usage record, which closes the open one."""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.metering.pipeline import OpenUsage
from gateway.openai.job import IdempotentAttempt, Job, Timing
from gateway.state import GatewayState
from gateway.telemetry import TelemetryRecord
from sluice.domain import Outcome, UsageRecord
from sluice.engine_client import EngineClient
from sluice.stores.ledger.base import ROWLESS_OUTCOMES, p95

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ended:
    outcome: Outcome
    finish_reason: str | None
    num_output_tokens: int
    error: str | None
    reached_replica: bool
    engine: EngineClient | None = None  # the replica it was dispatched to last; None: never dispatched
    num_cached_tokens: int | None = None  # prompt tokens the replica's prefix cache served; None: unknown
    num_dispatches: int = 0  # to a replica: 1 + its re-dispatches after a replica failed before any output
    failed_replicas: tuple[str, ...] = ()  # replicas that could not be reached, in order
    # The client left: output tokens its replica had made that the gateway never read (in num_output_tokens).
    num_unread_tokens: int = 0


def usage_record(
    job: Job,
    gw: GatewayState,
    attempt: IdempotentAttempt | None,
    ended: Ended | None = None,
    timing: Timing | None = None,
) -> UsageRecord:
    """The request's usage row: as it ended, with the latencies ``timing`` saw (None: none); or (``ended``
    None) as opened at dispatch: its prompt, no output yet, status ``gateway_lost`` (what it is billed if
    the gateway dies before it ends)."""
    return UsageRecord(
        tenant_id=job.tenant.tenant_id,
        request_id=job.request_id,
        model=job.model,
        model_version=job.model_version,
        prompt_tokens=len(job.prompt_token_ids),
        output_tokens=0 if ended is None else ended.num_output_tokens,
        status=Outcome.GATEWAY_LOST if ended is None else ended.outcome,
        started_at=job.started_at,
        finished_at=datetime.now(UTC),
        attempt=attempt.attempt if attempt else 1,
        idempotency_key=attempt.key if attempt else None,
        ttft_ms=None if timing is None else _ttft_ms(job, timing),
        itl_p95_ms=None if timing is None else _itl_p95_ms(timing),
        request_class=job.request_class,
    )


def _ttft_ms(job: Job, timing: Timing) -> float | None:
    """Arrival to first token as the gateway saw it (the telemetry line's and the usage row's)."""
    if timing.first_token_s is None:
        return None
    return round((timing.first_token_s - job.arrival_s) * 1000, 3)


def _itl_p95_ms(timing: Timing) -> float | None:
    """The request's own inter-token p95, over the gaps between deltas. NOTE: the zero gaps are left out:
    ``Timing`` gives each token after the first of a delta a gap of 0 (they arrived together), so with
    them a version that streams in bigger chunks would look faster while its client waits as long between
    chunks; what a reader sees is the time between arrivals."""
    p95_s = p95(gap_s for gap_s in timing.gaps_s if gap_s > 0)
    return None if p95_s is None else round(p95_s * 1000, 3)


async def record_request(
    job: Job,
    gw: GatewayState,
    ended: Ended,
    timing: Timing,
    attempt: IdempotentAttempt | None,
    usage: OpenUsage | None = None,
) -> None:
    """Telemetry, metrics, then the usage record (closing ``usage``, the request's open one)."""
    now = time.monotonic()
    num_prompt_tokens = len(job.prompt_token_ids)
    ttft_s = None if timing.first_token_s is None else timing.first_token_s - job.arrival_s
    gaps_ms = [g * 1000 for g in timing.gaps_s]
    record = TelemetryRecord(
        request_id=job.request_id,
        tenant_id=job.tenant.tenant_id,
        model=job.model,
        model_version=job.model_version,
        replica=ended.engine.replica if ended.engine is not None else "",
        engine_client=ended.engine.kind if ended.engine is not None else "",
        request_class=str(job.request_class),
        queue_ms=round(((timing.engine_start_s or now) - job.arrival_s) * 1000, 3),
        ttft_ms=_ttft_ms(job, timing),
        replica_ttft_ms=_ms_between(timing.engine_start_s, timing.first_token_s),
        prompt_tokens=num_prompt_tokens,
        output_tokens=ended.num_output_tokens,
        inter_token_p50_ms=round(statistics.median(gaps_ms), 3) if gaps_ms else None,
        inter_token_p95_ms=_itl_p95_ms(timing),
        inter_token_max_ms=round(max(gaps_ms), 3) if gaps_ms else None,
        duration_ms=round((now - job.arrival_s) * 1000, 3),
        outcome=str(ended.outcome),
        finish_reason=ended.finish_reason,
        billed_tokens=num_prompt_tokens + ended.num_output_tokens if _billed(ended) else 0,
        wasted_tokens=_wasted_tokens(ended, attempt),
        error=ended.error,
        attempt=attempt.attempt if attempt else 1,
        superseded_output_tokens=attempt.superseded_output_tokens if attempt else 0,
        idempotency_key=job.idempotency_key,
        cached_tokens=ended.num_cached_tokens,
        num_dispatches=ended.num_dispatches,
        pool=str(job.target.pool),
        failed_replicas=ended.failed_replicas,
        degraded=job.degraded or None,
        batch_id=job.batch_id,
        custom_id=job.custom_id,
    )
    try:
        gw.telemetry.write(record)
    except OSError:
        log.exception("telemetry record for %s was not written", job.request_id)
    metrics = gw.metrics
    if ended.outcome is not Outcome.REFUSED:  # a refusal is counted where it becomes an HTTP error
        status_code = "500" if ended.outcome is Outcome.FAILED else "200"
        metrics.requests.labels(job.route, status_code, str(ended.outcome)).inc()
    labels = (job.model, job.model_version, job.request_class)
    metrics.outcomes.labels(*labels, str(ended.outcome)).inc()
    metrics.prompt_tokens.labels(*labels).inc(num_prompt_tokens if ended.reached_replica else 0)
    metrics.output_tokens.labels(*labels).inc(ended.num_output_tokens)
    if attempt is not None and attempt.superseded_output_tokens:
        metrics.wasted_output_tokens.inc(attempt.superseded_output_tokens)
    if ttft_s is not None:
        metrics.ttft_s.labels(*labels).observe(ttft_s)
    inter_token_s = metrics.inter_token_s.labels(*labels)
    for gap_s in timing.gaps_s:
        inter_token_s.observe(gap_s)
    # Last: once the usage row is visible, the metrics are counted and the telemetry record is queued
    # (the writer thread appends it; tests flush it before reading).
    if not _billed(ended):
        if usage is not None:
            gw.meter.discard(usage)  # no replica ran it, or it runs again: nothing to bill
        return
    try:
        await gw.meter.record(usage_record(job, gw, attempt, ended, timing), usage)
    except Exception:
        log.exception("usage record for %s was not written", job.request_id)


def _billed(ended: Ended) -> bool:
    """Whether the request writes a usage row: it ran on a replica, and its outcome is one the ledger
    takes (not ``ROWLESS_OUTCOMES``: e.g. a batch line's run cut to run again, ``Outcome.INTERRUPTED``)."""
    return ended.reached_replica and ended.outcome not in ROWLESS_OUTCOMES


def _wasted_tokens(ended: Ended, attempt: IdempotentAttempt | None) -> int:
    """Output tokens generated that no client received (``TelemetryRecord.wasted_tokens`` defines it):
    all of a failed, filtered or interrupted request's, a cancelled one's unread ones, and the superseded
    attempt's."""
    if ended.outcome in (Outcome.FAILED, Outcome.FILTERED, Outcome.INTERRUPTED):
        own_tokens = ended.num_output_tokens
    elif ended.outcome is Outcome.CANCELLED:
        own_tokens = ended.num_unread_tokens
    else:  # finished, deadline (a complete, if cut, response), refused and replayed (none generated)
        own_tokens = 0
    return own_tokens + (attempt.superseded_output_tokens if attempt else 0)


def _ms_between(start_s: float | None, end_s: float | None) -> float | None:
    return None if start_s is None or end_s is None else round((end_s - start_s) * 1000, 3)
