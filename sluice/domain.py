"""Domain types shared by the gateway, the control plane and the storage adapters. Imports nothing upward."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class Outcome(StrEnum):
    """How a request that reached a replica ended (the ledger's ``status``)."""

    FINISHED = "finished"  # stop token, EOS or max_tokens
    CANCELLED = "cancelled"  # the client went away
    DEADLINE = "deadline"  # the hard deadline passed mid-generation
    FAILED = "failed"  # the replica or the engine failed


@dataclass(frozen=True)
class Tenant:
    tenant_id: str  # stable id, e.g. "acme"
    name: str
    allowed_models: frozenset[str] = field(default_factory=frozenset)  # empty = every model


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


@dataclass(frozen=True)
class UsageTotals:
    num_requests: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class UsageReport:
    totals: UsageTotals
    rows: list[UsageRecord]
