"""The idempotency store's one interface; every backend passes the same contract tests
(tests/core/test_idempotency.py).

A request carrying an ``Idempotency-Key`` may ``peek`` first (read only: answer a replay, 409 or 422
before any other work), and calls ``begin`` (the first write) only once it passed every check that could
refuse it. Only a NEW answer generates; its one ``finally`` then calls ``complete`` (finished: the result
is replayed to retries) or ``release`` (failed or cancelled: a retry starts over, not resumes). One record
per (tenant, key):

  fingerprint     the first request's body hash; a different body under the same key is a MISMATCH
  attempt         1, 2, ...: the latest attempt's number
  state           running / completed / released
  running deadline  a running attempt older than this is presumed dead (its gateway died): a retry is NEW
  output tokens   the released attempt's, reported to the next attempt (it was billed on its own row;
                  to the tenant it is work thrown away)
  result          completed only; opaque bytes

Record lifetime: ``ttl_s`` after ``complete``; while running or released, ``max(running_ttl_s,
ATTEMPT_RECORD_TTL_S)`` from the last ``begin`` / ``release``, so the attempt count and the fingerprint
outlive any retry a client would still make.

Bound: each tenant keeps at most ``max_records_per_tenant`` records; past it, that tenant's least
recently written record is forgotten (a retry of its key is then a new request), never another
tenant's. Forgetting early is the price of the bound; it never makes a generation free, because every
attempt is billed on its own ledger row.

Failures: a backend that cannot answer (Redis unreachable, timing out, out of memory, read-only, loading)
raises ``IdempotencyStoreUnavailableError``; the guarantee cannot be kept, so the caller refuses keyed
requests (503) rather than run them unprotected.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum

# How long a running or released record is kept (unless running_ttl_s is longer): a day, as long as the
# default replay window, so "attempt 3" is not mistaken for "attempt 1" by a client retrying all day.
ATTEMPT_RECORD_TTL_S = 24 * 3600.0
DEFAULT_MAX_RECORDS_PER_TENANT = 10_000


class IdempotencyStoreUnavailableError(Exception):
    """The store could not answer (the message says why); nothing is known about the key's state."""


class BeginKind(StrEnum):
    NEW = "new"  # this caller owns a new attempt: generate, then complete() or release()
    IN_PROGRESS = "in_progress"  # another attempt is running (409)
    COMPLETED = "completed"  # replay ``result``; generate and bill nothing
    MISMATCH = "mismatch"  # the key was first used with another body (422)


class AttemptState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    RELEASED = "released"  # failed or cancelled: the next begin() starts over


@dataclass(frozen=True)
class Begin:
    kind: BeginKind
    attempt: int  # NEW: this attempt's number (1, 2, ...); else the latest attempt's
    result: bytes | None = None  # COMPLETED: what complete() stored (opaque to the store)
    # NEW with attempt > 1: output tokens the released previous attempt generated (waste); 0 when that
    # attempt's marker expired instead (its gateway died before it could say).
    superseded_output_tokens: int = 0


class IdempotencyStore(ABC):
    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def peek(self, tenant_id: str, key: str, fingerprint: str) -> Begin | None:
        """Read only: what ``begin`` would answer now if it would not start a new attempt (MISMATCH,
        IN_PROGRESS or COMPLETED, as ``begin`` defines them), else None. Changes nothing (not even the
        record's recency): a request may be refused after it, and then must leave no trace.
        """

    @abstractmethod
    async def begin(self, tenant_id: str, key: str, fingerprint: str, running_ttl_s: float) -> Begin:
        """Atomically: no record → NEW attempt 1 (a running marker expiring after ``running_ttl_s``, so a
        dead gateway's attempt does not block retries forever). Record with a different fingerprint (the
        request body's hash) → MISMATCH, whatever its state. Running (not expired) → IN_PROGRESS. Completed →
        COMPLETED with its result. Released, or running but expired → NEW with attempt = previous + 1.
        A new record past the tenant's bound forgets that tenant's least recently written one.
        """

    @abstractmethod
    async def complete(self, tenant_id: str, key: str, attempt: int, result: bytes, ttl_s: float) -> bool:
        """The attempt finished: keep its result for ``ttl_s``. False (and no change) if ``attempt`` is not
        the latest (a newer attempt started after this one's marker expired) or was released. Completing an
        attempt twice is True again and keeps the first result (a retried call is harmless).
        """

    @abstractmethod
    async def release(self, tenant_id: str, key: str, attempt: int, output_tokens: int) -> None:
        """The attempt failed or was cancelled: a retry starts over (NEW, attempt + 1) and is told
        ``output_tokens`` as superseded waste. No-op if ``attempt`` is not the latest, completed, or was
        released already.
        """


def key_digest(key: str) -> str:
    """The Idempotency-Key as stored: sha256 hex, so a client's raw key never lands in a key name."""
    return hashlib.sha256(key.encode()).hexdigest()


def record_ttl_s(running_ttl_s: float) -> float:
    """How long a running or released record is kept."""
    return max(running_ttl_s, ATTEMPT_RECORD_TTL_S)


def check_max_records(max_records_per_tenant: int) -> None:
    if max_records_per_tenant < 1:
        raise ValueError(f"max_records_per_tenant must be >= 1, got {max_records_per_tenant}")


def check_begin_args(running_ttl_s: float) -> None:
    if not running_ttl_s > 0:
        raise ValueError(f"running_ttl_s must be > 0, got {running_ttl_s}")


def check_complete_args(attempt: int, ttl_s: float) -> None:
    check_attempt(attempt)
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")


def check_release_args(attempt: int, output_tokens: int) -> None:
    check_attempt(attempt)
    if output_tokens < 0:
        raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")


def check_attempt(attempt: int) -> None:
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
