"""Domain types shared by the gateway, the control plane and the storage adapters. Imports nothing upward."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class Outcome(StrEnum):
    """How a request ended; for one that reached a replica, the ledger's ``status``."""

    FINISHED = "finished"  # stop token, EOS or max_tokens
    CANCELLED = "cancelled"  # the client went away
    DEADLINE = "deadline"  # the hard deadline passed mid-generation
    FAILED = "failed"  # the replica or the engine failed
    FILTERED = "filtered"  # a safety classifier stopped the output mid-stream
    REPLAYED = "replayed"  # an Idempotency-Key retry answered from the stored result: no ledger row
    REFUSED = "refused"  # never reached a replica (quota, full queue, deadline): no ledger row
    # The gateway died mid-request (killed, crashed, host lost): billed at its next start from the usage
    # outbox, with the output tokens of the request's last checkpoint (gateway.metering).
    GATEWAY_LOST = "gateway_lost"
    # A batch line cut before it finished because it runs again (its runner stopped or lost the batch's
    # lease): no ledger row; the run whose result the batch reports is the line's one row.
    INTERRUPTED = "interrupted"


class RequestClass(StrEnum):
    """A request's service class: interactive has a tight time-to-first-token objective; batch soaks up
    what interactive leaves, with a guaranteed floor share so it is never starved."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


ALL_CLASSES: frozenset[RequestClass] = frozenset(RequestClass)


@dataclass(frozen=True)
class Tenant:
    tenant_id: str  # stable id, e.g. "acme"
    name: str
    allowed_models: frozenset[str] = field(default_factory=frozenset)  # empty = every model
    weight: float = 1.0  # share under contention (weighted fair queueing between tenants); > 0
    tokens_per_minute: int | None = None  # prompt + output tokens reserved per minute; None = unlimited
    max_concurrent_requests: int | None = None  # admitted and not yet finished; None = unlimited
    allowed_classes: frozenset[RequestClass] = ALL_CLASSES
    safety_policy: str = "default"  # which safety classifiers screen its prompts and output (sluice.safety)


@dataclass(frozen=True)
class UsageRecord:
    """One row of the usage ledger: what one request cost. Never holds prompt or output text."""

    tenant_id: str
    request_id: str
    model: str
    model_version: str
    prompt_tokens: int
    output_tokens: int
    status: Outcome
    started_at: datetime  # timezone-aware UTC
    finished_at: datetime
    # Which try under one Idempotency-Key (1, 2, ...); every attempt is its own request and its own row.
    attempt: int = 1
    idempotency_key: str | None = None  # the client's Idempotency-Key, if it sent one
    # Latencies as the gateway saw them, for comparing model versions (None: not measured, e.g. no token
    # came, the row opened at dispatch, or a row written before these existed). Never any text.
    ttft_ms: float | None = None  # arrival to first token
    itl_p95_ms: float | None = None  # this request's own inter-token p95 (gaps between deltas)
    # The class it ran at: batch lines and ``service_tier: "flex"`` requests are batch, which usage reports
    # may price at a discount (sluice.pricing). Rows written before this existed are interactive.
    request_class: RequestClass = RequestClass.INTERACTIVE


@dataclass(frozen=True)
class UsageGroup:
    """The rows of one (model, request class) in a report's filter, summed: what a price applies to."""

    model: str
    request_class: RequestClass
    num_requests: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class UsageTotals:
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    # The same rows by (model, request class), sorted by both; they add up to the counts above.
    groups: tuple[UsageGroup, ...] = ()


@dataclass(frozen=True)
class UsageReport:
    totals: UsageTotals
    rows: list[UsageRecord]
