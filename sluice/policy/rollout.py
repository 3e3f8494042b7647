"""Which version of a model serves a request, and how a rollout moves (the seed: "routing sends a small
share of traffic to the new version, keyed so a conversation stays on one version"; "the share is
increased in steps"; "routing flips back in one registry write").

Pure: a route's split and a request's identity in, a version out; stats in, a guard's decision out.

Stickiness. A request's conversation key is its ``X-Conversation-Id`` header, else the OpenAI ``user``
field, else its request id (a lone request). (tenant, key) hashes into one of ``NUM_BUCKETS`` fixed
buckets, and a bucket picks its version by weighted rendezvous hashing: each version draws a fixed
uniform number ``u`` from (bucket, version), scores ``-ln(u) / weight``, and the lowest score wins. So:
- each version receives its weight's share of buckets (in expectation; exactly the same buckets on every
  gateway, since the hash is SHA-256, not Python's salted ``hash``);
- growing one version's weight while the others shrink never moves a bucket off the growing version
  (its score only falls, theirs only rise): a canary grown from 10% to 50% keeps every conversation it
  had, whatever order the split lists its versions in;
- a version at weight 0 gets nothing, so a rollback (the old version at 100%) is one route write.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NUM_BUCKETS = 10_000
WEIGHT_TOTAL_PCT = 100.0


def conversation_key(conversation_id: str | None, user: str | None, request_id: str) -> str:
    """What keeps a conversation on one version: the ``X-Conversation-Id`` header, else the OpenAI
    ``user`` field, else the request id. Each kind is namespaced, so a header equal to some user's name
    does not share that user's bucket."""
    if conversation_id:
        return f"conversation:{conversation_id}"
    if user:
        return f"user:{user}"
    return f"request:{request_id}"


def _uniform64(*parts: str) -> int:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def bucket_of(tenant_id: str, key: str) -> int:
    """The fixed bucket of a (tenant, conversation key): the same on every gateway and every restart."""
    return _uniform64("bucket", tenant_id, key) % NUM_BUCKETS


def check_split(split: Mapping[str, float]) -> None:
    """A split names at least one version, weights are finite and non-negative, and they sum to 100."""
    if not split:
        raise ValueError("a split names at least one version")
    for version, weight in split.items():
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight of version {version!r} must be a finite number >= 0, got {weight}")
    if not math.isclose(sum(split.values()), WEIGHT_TOTAL_PCT, abs_tol=1e-6):
        raise ValueError(f"weights must sum to 100, got {sum(split.values())}")


def version_for_bucket(split: Mapping[str, float], bucket: int) -> str:
    """The version that serves ``bucket`` under ``split`` (version -> weight in percent, summing to 100):
    weighted rendezvous hashing over the versions with a positive weight."""
    check_split(split)
    if not 0 <= bucket < NUM_BUCKETS:
        raise ValueError(f"bucket must be in [0, {NUM_BUCKETS}), got {bucket}")
    best_version, best_score = "", math.inf
    for version in sorted(split):  # NOTE: sorted, so equal scores (never seen) resolve the same everywhere
        weight = split[version]
        if weight <= 0:
            continue
        # u in (0, 1): never 0, so -ln(u) is finite and positive.
        u = (_uniform64("version", str(bucket), version) + 0.5) / 2.0**64
        score = -math.log(u) / weight
        if score < best_score:
            best_version, best_score = version, score
    return best_version


def choose_version(split: Mapping[str, float], tenant_id: str, key: str) -> str:
    """The version that serves a request of ``tenant_id`` with conversation ``key``."""
    return version_for_bucket(split, bucket_of(tenant_id, key))


# ---- a rollout's steps ----


@dataclass(frozen=True)
class RolloutSteps:
    """The canary's share at each step, in percent: strictly increasing, each in (0, 100], ending at 100
    (``sluice rollout start MODEL VERSION --steps 1,10,50,100``)."""

    steps_pct: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.steps_pct:
            raise ValueError("a rollout needs at least one step")
        if any(not 0 < s <= WEIGHT_TOTAL_PCT for s in self.steps_pct):
            raise ValueError(f"every step must be in (0, 100], got {list(self.steps_pct)}")
        if any(b <= a for a, b in zip(self.steps_pct, self.steps_pct[1:], strict=False)):
            raise ValueError(f"steps must increase, got {list(self.steps_pct)}")
        if self.steps_pct[-1] != WEIGHT_TOTAL_PCT:
            raise ValueError(f"the last step must be 100, got {self.steps_pct[-1]}")

    @classmethod
    def parse(cls, text: str) -> RolloutSteps:
        try:
            return cls(tuple(float(part) for part in text.split(",")))
        except ValueError as exc:
            raise ValueError(f"--steps: {exc} (expected e.g. 1,10,50,100)") from None

    def next_index(self, index: int) -> int | None:
        """The step after ``index``; None when ``index`` is the last (the rollout is complete)."""
        return index + 1 if index + 1 < len(self.steps_pct) else None


def rollout_split(stable_version: str, canary_version: str, canary_pct: float) -> dict[str, float]:
    """The route while ``canary_version`` takes ``canary_pct`` of conversations from ``stable_version``."""
    if stable_version == canary_version:
        raise ValueError("the canary must differ from the stable version")
    if not 0 <= canary_pct <= WEIGHT_TOTAL_PCT:
        raise ValueError(f"canary_pct must be in [0, 100], got {canary_pct}")
    split = {stable_version: WEIGHT_TOTAL_PCT - canary_pct, canary_version: canary_pct}
    return {v: w for v, w in split.items() if w > 0}


# ---- the optional guard ----


@dataclass(frozen=True)
class VersionStats:
    """One version's live traffic over the comparison window."""

    num_requests: int
    num_errors: int
    ttft_p95_ms: float
    itl_p95_ms: float

    @property
    def error_rate(self) -> float:
        return self.num_errors / self.num_requests if self.num_requests else 0.0


@dataclass(frozen=True)
class GuardBounds:
    """How much worse the canary may be than the stable version before the guard rolls it back, and how
    much traffic it must have seen before the guard judges it at all."""

    min_requests: int = 100
    max_error_rate_increase: float = 0.01  # absolute: 0.01 is one more failed request in a hundred
    max_ttft_p95_ratio: float = 1.5
    max_itl_p95_ratio: float = 1.5


class GuardAction(enum.StrEnum):
    HOLD = "hold"  # not enough traffic to judge yet
    ADVANCE = "advance"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class GuardDecision:
    action: GuardAction
    reason: str


def guard_decision(stable: VersionStats, canary: VersionStats, bounds: GuardBounds) -> GuardDecision:
    """Roll back on the first bound the canary breaks, hold while either side has too few requests to
    judge, else advance."""
    fewest = min(canary.num_requests, stable.num_requests)
    if fewest < bounds.min_requests:
        return GuardDecision(GuardAction.HOLD, f"{fewest} requests, {bounds.min_requests} needed to judge")
    error_increase = canary.error_rate - stable.error_rate
    if error_increase > bounds.max_error_rate_increase:
        return GuardDecision(
            GuardAction.ROLLBACK,
            f"error rate {canary.error_rate:.2%} against {stable.error_rate:.2%} "
            f"(at most +{bounds.max_error_rate_increase:.2%})",
        )
    checks: Sequence[tuple[str, float, float, float]] = (
        ("TTFT p95", canary.ttft_p95_ms, stable.ttft_p95_ms, bounds.max_ttft_p95_ratio),
        ("inter-token p95", canary.itl_p95_ms, stable.itl_p95_ms, bounds.max_itl_p95_ratio),
    )
    for name, canary_ms, stable_ms, max_ratio in checks:
        if stable_ms > 0 and canary_ms / stable_ms > max_ratio:
            return GuardDecision(
                GuardAction.ROLLBACK,
                f"{name} {canary_ms:.0f} ms against {stable_ms:.0f} ms (at most {max_ratio:.2f}x)",
            )
    return GuardDecision(GuardAction.ADVANCE, "within every bound")
