"""A tenant's token bucket as pure arithmetic: state and ``now`` in, new state out. No I/O, no clock reads.

The bucket holds ``level_tokens`` as of ``last_s``. It refills at ``rate_tokens_per_s`` (a tenant's
``tokens_per_minute / 60``) up to ``capacity_tokens`` (``tokens_per_minute``); a new tenant starts full.
A settle that used more than it reserved takes the difference anyway, so the level may go negative (debt)
and later requests wait for it to refill.

NOTE: the Redis store's Lua scripts (sluice/stores/quota/redis.py) mirror these functions operation for
operation, in the same order, on the same doubles, so both stores decide alike (tests/core/test_quota.py
checks it). Change one, change the other.
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True)
class BucketState:
    level_tokens: float
    last_s: float


@dataclass(frozen=True)
class TakeResult:
    granted: bool
    state: BucketState  # after the take; the refilled (unchanged) state on a denial
    retry_after_s: float  # 0.0 when granted; else (tokens - level) / rate


def rate_tokens_per_s(tokens_per_minute: int) -> float:
    return tokens_per_minute / SECONDS_PER_MINUTE


def full(capacity_tokens: float, now_s: float) -> BucketState:
    """A tenant's bucket the first time it is seen (or after its Redis key expired, which it does only
    once it would have refilled to full anyway)."""
    return BucketState(float(capacity_tokens), now_s)


def refill(
    level_tokens: float, last_s: float, now_s: float, capacity_tokens: float, rate_tokens_per_s: float
) -> BucketState:
    """The level at ``now_s``. A clock that went backwards adds nothing and keeps ``last_s``."""
    if now_s <= last_s:
        return BucketState(level_tokens, last_s)
    return BucketState(min(capacity_tokens, level_tokens + (now_s - last_s) * rate_tokens_per_s), now_s)


def try_take(
    level_tokens: float,
    last_s: float,
    now_s: float,
    capacity_tokens: float,
    rate_tokens_per_s: float,
    tokens: int,
) -> TakeResult:
    """Refill, then take ``tokens`` only if the level covers them all."""
    state = refill(level_tokens, last_s, now_s, capacity_tokens, rate_tokens_per_s)
    if state.level_tokens < tokens:
        return TakeResult(False, state, (tokens - state.level_tokens) / rate_tokens_per_s)
    return TakeResult(True, BucketState(state.level_tokens - tokens, state.last_s), 0.0)


def give_back(
    level_tokens: float,
    last_s: float,
    now_s: float,
    capacity_tokens: float,
    rate_tokens_per_s: float,
    refund_tokens: int,
) -> BucketState:
    """Refill, then add ``refund_tokens`` (reserved - used; negative takes more), never above capacity."""
    state = refill(level_tokens, last_s, now_s, capacity_tokens, rate_tokens_per_s)
    return BucketState(min(capacity_tokens, state.level_tokens + refund_tokens), state.last_s)


def seconds_until_full(level_tokens: float, capacity_tokens: float, rate_tokens_per_s: float) -> float:
    """How long until the bucket is full again; after that its state is the same as a new tenant's."""
    return max(0.0, (capacity_tokens - level_tokens) / rate_tokens_per_s)
