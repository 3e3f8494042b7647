"""``Idempotency-Key``: a retry with the same key from the same tenant never runs a finished request again,
and every attempt that ran is billed.

- Admission first looks the key up, read only (``lookup_attempt``): a finished result is replayed (as SSE if
  it streams, with the original response id) without generating, queueing or billing; while an attempt
  runs, 409 ``idempotency_key_in_progress``; the key with a different body, 422 ``idempotency_key_reused``.
- Only once the request passed every check that could refuse it (validation, the prompt screen, the quota)
  does ``begin_attempt`` write the key's record. A request refused before that leaves no trace, so it
  cannot fill the store or pin the key to a body that never ran. If ``begin`` finds a result or a running
  attempt after all (a race), the request answers as the lookup would and its quota grant goes back unused.
- The first attempt that finishes stores its result for ``SLUICE_IDEMPOTENCY_TTL_S`` (24 h). After an
  attempt failed or was cancelled, a retry starts over (not resumes) as the next attempt.
- Billing: every attempt is its own request, with its own request id and its own ledger row (carrying the
  key and the attempt number), billed for the tokens it produced; only a replay is free. So no sequence of
  cancels and retries lowers what a key costs, and a key reused after its record expired or was evicted
  is a new billed request whose row never collides with an old one.
- The store down (Redis unreachable, timing out, refusing writes): a request with a key gets 503
  ``idempotency_store_unavailable`` with Retry-After, as the guarantee cannot be kept; requests without a
  key never touch the store.

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
from sluice.stores.idempotency.base import Begin, BeginKind, IdempotencyStoreUnavailableError

log = logging.getLogger(__name__)

_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, as the header allows
_NOT_PART_OF_THE_REQUEST = ("stream", "stream_options")  # a replay serves either shape
_DELIVERED = (Outcome.FINISHED, Outcome.DEADLINE, Outcome.FILTERED)
# A running attempt's marker outlives its deadline by this much (a dead gateway does not block retries).
RUNNING_GRACE_S = 10.0
STORE_RETRY_AFTER_S = 1.0


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise OpenAIError(
            400,
            "Idempotency-Key must be 1-255 visible ASCII characters.",
            code="invalid_idempotency_key",
            param="Idempotency-Key",
        )
    return key


def fingerprint(route: str, body: msgspec.Struct) -> str:
    fields = {k: v for k, v in msgspec.to_builtins(body).items() if k not in _NOT_PART_OF_THE_REQUEST}
    canonical = json.dumps({"route": route, "body": fields}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def lookup_attempt(gw: GatewayState, job: Job) -> list[Event] | None:
    """Read only, before any other work: the stored result's events to replay, or None when this request
    may run. Raises 409 / 422, or 503 if the store cannot answer. Writes nothing."""
    assert job.idempotency_key is not None
    try:
        found = await gw.idempotency.peek(job.tenant.tenant_id, job.idempotency_key, job.fingerprint)
    except IdempotencyStoreUnavailableError as exc:
        raise _store_unavailable(gw, job, exc) from None
    return None if found is None else _answer(found, job)


async def begin_attempt(gw: GatewayState, job: Job) -> IdempotentAttempt | list[Event]:
    """This request's attempt (its record written now), or the events of a result stored since the lookup.
    Raises 409 / 422, or 503 if the store cannot answer."""
    assert job.idempotency_key is not None
    running_ttl_s = job.deadline_s - job.arrival_s + RUNNING_GRACE_S
    try:
        begun = await gw.idempotency.begin(
            job.tenant.tenant_id, job.idempotency_key, job.fingerprint, running_ttl_s
        )
    except IdempotencyStoreUnavailableError as exc:
        raise _store_unavailable(gw, job, exc) from None
    if begun.kind is BeginKind.NEW:
        return IdempotentAttempt(job.idempotency_key, begun.attempt, begun.superseded_output_tokens)
    return _answer(begun, job)


def _answer(found: Begin, job: Job) -> list[Event]:
    """A record that does not let this request run: a replay's events, else the refusal."""
    if found.kind is BeginKind.MISMATCH:
        raise OpenAIError(
            422,
            "This Idempotency-Key was already used with a different request body; use a new key.",
            code="idempotency_key_reused",
            param="Idempotency-Key",
        )
    if found.kind is BeginKind.IN_PROGRESS:
        raise OpenAIError(
            409,
            "A request with this Idempotency-Key is still running; retry after it ends to get its result.",
            code="idempotency_key_in_progress",
            param="Idempotency-Key",
        )
    assert found.kind is BeginKind.COMPLETED and found.result is not None
    return _replay(found.result, job)


def _store_unavailable(gw: GatewayState, job: Job, exc: IdempotencyStoreUnavailableError) -> OpenAIError:
    log.warning("idempotency store unavailable, refusing keyed request %s: %s", job.request_id, exc)
    gw.metrics.count_refused(job.model, "idempotency_store_unavailable")
    return OpenAIError(
        503,
        "The idempotency store is unavailable, so this Idempotency-Key cannot be honoured; retry later"
        " (or send the request without the key).",
        type="server_error",
        code="idempotency_store_unavailable",
        retry_after_s=STORE_RETRY_AFTER_S,
    )


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
                "id": job.request_id,  # a replay answers with this response's id
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
    except IdempotencyStoreUnavailableError as exc:  # the running marker expires; a retry then starts over
        log.warning("idempotency record of %s not settled: %s", job.request_id, exc)
    except Exception:
        log.exception("idempotency record of %s not settled", job.request_id)


def _replay(result: bytes, job: Job) -> list[Event]:
    stored = json.loads(result)
    # Results stored before ids were per attempt have none: theirs was derived from the key.
    job.answer_as(stored.get("id") or _legacy_request_id(job))
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


def _legacy_request_id(job: Job) -> str:
    assert job.idempotency_key is not None
    digest = hashlib.sha256(f"{job.tenant.tenant_id}\0{job.idempotency_key}".encode()).hexdigest()[:32]
    return f"{job.request_id.partition('-')[0]}-idem-{digest}"
