"""``Idempotency-Key``: a retry with the same key from the same tenant is never generated or billed twice.

- The first attempt that finishes stores its result (the text, the finish reason and the usage) for
  ``SLUICE_IDEMPOTENCY_TTL_S`` (24 h); a retry then gets it replayed (as SSE if it streams), without
  generating, queueing or billing again.
- While an attempt runs, a retry gets 409 ``idempotency_key_in_progress``.
- After an attempt failed or was cancelled, a retry starts over (not resumes) as the next attempt. The
  ledger keeps one row per (tenant, key): the request id is derived from the key, and the row of the
  highest attempt wins, so the billed tokens are the finishing (or last) attempt's, never a sum. What
  an abandoned attempt generated is reported as waste (telemetry ``superseded_output_tokens``).
- The same key with a different body gets 422 ``idempotency_key_reused``.

Results live in the idempotency store (Redis or this process's memory) until their TTL, never in the
ledger or on disk.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any

import msgspec

from gateway.errors import OpenAIError
from gateway.openai.job import Event, FinishEvent, IdempotentAttempt, Job, TextEvent
from gateway.state import GatewayState
from sluice.domain import Outcome
from sluice.idempotency.base import BeginKind

log = logging.getLogger(__name__)

_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, as the header allows
_NOT_PART_OF_THE_REQUEST = ("stream", "stream_options")  # a replay serves either shape
_DELIVERED = (Outcome.FINISHED, Outcome.DEADLINE, Outcome.FILTERED)
# A running attempt's marker outlives its deadline by this much (a dead gateway does not block retries).
RUNNING_GRACE_S = 10.0


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise OpenAIError(
            400,
            "Idempotency-Key must be 1-255 visible ASCII characters.",
            code="invalid_idempotency_key",
            param="Idempotency-Key",
        )
    return key


def request_id_for(id_prefix: str, tenant_id: str, key: str) -> str:
    """The same id for every attempt with this key: the ledger row's key and the response's id."""
    digest = hashlib.sha256(f"{tenant_id}\0{key}".encode()).hexdigest()[:32]
    return f"{id_prefix}-idem-{digest}"


def fingerprint(route: str, body: msgspec.Struct) -> str:
    fields = {k: v for k, v in msgspec.to_builtins(body).items() if k not in _NOT_PART_OF_THE_REQUEST}
    canonical = json.dumps({"route": route, "body": fields}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def begin_attempt(gw: GatewayState, job: Job) -> IdempotentAttempt | list[Event]:
    """This request's attempt, or the events of the stored result to replay. Raises 409 / 422."""
    assert job.idempotency_key is not None
    running_ttl_s = job.deadline_s - job.arrival_s + RUNNING_GRACE_S
    begun = await gw.idempotency.begin(
        job.tenant.tenant_id, job.idempotency_key, job.fingerprint, running_ttl_s
    )
    if begun.kind is BeginKind.MISMATCH:
        raise OpenAIError(
            422,
            "This Idempotency-Key was already used with a different request body; use a new key.",
            code="idempotency_key_reused",
            param="Idempotency-Key",
        )
    if begun.kind is BeginKind.IN_PROGRESS:
        raise OpenAIError(
            409,
            "A request with this Idempotency-Key is still running; retry after it ends to get its result.",
            code="idempotency_key_in_progress",
            param="Idempotency-Key",
        )
    if begun.kind is BeginKind.COMPLETED:
        assert begun.result is not None
        return _replay(begun.result)
    return IdempotentAttempt(job.idempotency_key, begun.attempt, begun.superseded_output_tokens)


async def settle_attempt(
    gw: GatewayState,
    job: Job,
    attempt: IdempotentAttempt,
    outcome: Outcome,
    finish_reason: str | None,
    text: str,
    num_output_tokens: int,
    filter_message: str | None,
) -> None:
    """From the request's ``finally``: store the result of an attempt the client received whole (finished,
    cut by its deadline, or stopped by the content filter), or let a retry start over (cancelled, failed)."""
    tenant_id = job.tenant.tenant_id
    try:
        if outcome in _DELIVERED and finish_reason is not None:
            result: dict[str, Any] = {
                "text": text,
                "finish_reason": finish_reason,
                "prompt_tokens": len(job.prompt_token_ids),
                "output_tokens": num_output_tokens,
                "filter_message": filter_message,
            }
            await gw.idempotency.complete(
                tenant_id,
                attempt.key,
                attempt.attempt,
                json.dumps(result).encode(),
                gw.settings.idempotency_ttl_s,
            )
        else:
            await gw.idempotency.release(tenant_id, attempt.key, attempt.attempt, num_output_tokens)
    except Exception:  # the running marker expires by itself; a retry then starts over
        log.exception("idempotency record of %s not settled", job.request_id)


def _replay(result: bytes) -> list[Event]:
    stored = json.loads(result)
    events: list[Event] = [TextEvent(stored["text"])] if stored["text"] else []
    events.append(
        FinishEvent(
            stored["finish_reason"],
            stored["prompt_tokens"],
            stored["output_tokens"],
            stored["filter_message"],
        )
    )
    return events
