"""The telemetry record: one per request that reached generation (admitted, replayed, or refused at
admission), the same JSON object in every sink. Times are milliseconds, rounded to the microsecond.

``schema`` numbers the record's shape: it grows when a field is added (readers ignore fields they do not
know) and a field is never renamed or re-purposed under the same number.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# 2: request_class, inter_token_p95_ms, billed_tokens, wasted_tokens, batch_id, custom_id, schema.
TELEMETRY_SCHEMA = 2


@dataclass(frozen=True)
class TelemetryRecord:
    request_id: str
    tenant_id: str
    model: str
    model_version: str
    replica: str
    engine_client: str
    request_class: str  # the tenant class it ran at: "interactive" or "batch"
    # Queue wait: time in the gateway from arrival to the (last) engine call's start (admission, quota,
    # the model's queue); until the end when no engine call started.
    queue_ms: float
    ttft_ms: float | None  # arrival to first token, as the client's stream saw it; None when no token came
    # The prefill figure: from the (last) engine call's start to its first token, as the gateway saw it:
    # the replica's own queue, the prompt's prefill and one network round trip (inside ttft_ms).
    replica_ttft_ms: float | None
    prompt_tokens: int
    output_tokens: int
    # Over every token after the first: a token that came in the same delta as the one before it counts
    # a gap of 0, so a chunking engine's p50 can be 0 (what a reader of the stream waits per token).
    inter_token_p50_ms: float | None
    # Over the gaps between arrivals (the zero gaps left out), as the usage row's itl_p95_ms: one figure.
    inter_token_p95_ms: float | None
    inter_token_max_ms: float | None
    duration_ms: float
    outcome: str
    finish_reason: str | None
    # Prompt + output tokens on its usage row (what it is billed for); 0 when no replica ran it (refused,
    # replayed, or its replica could not be reached).
    billed_tokens: int
    # Output tokens generated that no client received, summed: the output of a request that failed or was
    # content-filtered (all of it: the client got an error, not a completion), the tokens a cancelled
    # request's replica had made that the gateway never read, and superseded_output_tokens (the previous
    # attempt of its Idempotency-Key, replaced by this one). 0 for a request that finished (stop or
    # length, a deadline's included). NOTE: a cancelled attempt that is then retried has its unread
    # tokens in its own record and again in the retry's superseded_output_tokens.
    wasted_tokens: int
    error: str | None = None
    attempt: int = 1  # with an Idempotency-Key: this attempt's number
    superseded_output_tokens: int = 0  # waste: what the abandoned previous attempt had generated
    idempotency_key: str | None = None  # the client's Idempotency-Key, as on the usage row
    # Prompt tokens the replica served from its prefix cache (its final response's num_cached_tokens);
    # None: it reported none (no final response, or an engine that does not count them).
    cached_tokens: int | None = None
    pool: str = ""  # the replica pool its version's queue was for: "general" or "long-prompt"
    # Failover: dispatches to a replica (0: never dispatched; more than 1: its replica failed before a
    # first token and it went to another); ``replica`` is the last one, the one that served or failed it.
    num_dispatches: int = 0
    failed_replicas: tuple[str, ...] = ()  # the replicas that could not be reached, in order
    # The fallbacks its overloaded model imposed, as the Sluice-Degraded header names them (e.g.
    # "max_tokens_cap=64, to_batch"); None: served as asked.
    degraded: str | None = None
    # A batch line's batch id and custom_id (None: not from a batch).
    batch_id: str | None = None
    custom_id: str | None = None
    schema: int = TELEMETRY_SCHEMA


def record_json(record: TelemetryRecord) -> str:
    """The record as one line of compact JSON (no newline): a file line, a stdout line, a stream entry."""
    return json.dumps(asdict(record), separators=(",", ":"))
