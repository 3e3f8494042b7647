"""The rollout policy: sticky version choice per conversation, the steps, the guard."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.rollout import (
    NUM_BUCKETS,
    GuardAction,
    GuardBounds,
    RolloutSteps,
    VersionStats,
    bucket_of,
    check_split,
    choose_version,
    conversation_key,
    guard_decision,
    rollout_split,
    version_for_bucket,
)

CONVERSATIONS = [f"conv-{i}" for i in range(1_000)]


def test_the_conversation_key_prefers_the_header_then_the_user_then_the_request() -> None:
    assert conversation_key("c1", "alice", "req-1") == "conversation:c1"
    assert conversation_key(None, "alice", "req-1") == "user:alice"
    assert conversation_key("", None, "req-1") == "request:req-1"
    # Namespaced: a header that equals a user's name is a different conversation.
    assert conversation_key("alice", None, "r") != conversation_key(None, "alice", "r")


def test_buckets_are_stable_and_scoped_to_the_tenant() -> None:
    assert bucket_of("acme", "conversation:c1") == bucket_of("acme", "conversation:c1")
    assert 0 <= bucket_of("acme", "x") < NUM_BUCKETS
    # Across 1,000 keys, two tenants' buckets are not the same mapping.
    assert sum(bucket_of("acme", k) == bucket_of("globex", k) for k in CONVERSATIONS) < 10


def test_a_ten_percent_canary_gets_ten_percent_of_a_thousand_conversations() -> None:
    split = rollout_split("v1", "v2", 10)
    counts = Counter(choose_version(split, "acme", c) for c in CONVERSATIONS)
    assert 70 <= counts["v2"] <= 130  # the 10 +- 3%
    assert counts["v1"] + counts["v2"] == 1_000


def test_the_bucket_shares_follow_the_weights() -> None:
    split = {"a": 20.0, "b": 30.0, "c": 50.0}
    counts = Counter(version_for_bucket(split, b) for b in range(NUM_BUCKETS))
    for version, weight in split.items():
        assert abs(counts[version] / NUM_BUCKETS * 100 - weight) < 2.0


def test_growing_the_canary_keeps_every_conversation_it_had() -> None:
    steps = [1, 10, 50, 100]
    previous: set[str] = set()
    for pct in steps:
        on_canary = {
            c for c in CONVERSATIONS if choose_version(rollout_split("v1", "v2", pct), "acme", c) == "v2"
        }
        assert previous <= on_canary, f"growing to {pct}% moved conversations off the canary"
        previous = on_canary
    assert previous == set(CONVERSATIONS)


@given(
    st.lists(st.floats(min_value=0.5, max_value=50), min_size=2, max_size=4),
    st.integers(min_value=0, max_value=NUM_BUCKETS - 1),
    st.floats(min_value=1.01, max_value=5),
)
def test_a_version_whose_weight_grows_while_others_shrink_keeps_its_buckets(
    raw_weights: list[float], bucket: int, growth: float
) -> None:
    versions = [f"v{i}" for i in range(len(raw_weights))]
    before = dict(zip(versions, (w * 100 / sum(raw_weights) for w in raw_weights), strict=True))
    winner = version_for_bucket(before, bucket)
    grown = min(before[winner] * growth, 100.0)
    rest = 100.0 - before[winner]
    after = {v: (grown if v == winner else w * (100.0 - grown) / rest) for v, w in before.items()}
    assert version_for_bucket(after, bucket) == winner


def test_the_order_a_split_lists_its_versions_in_does_not_matter() -> None:
    forward, backward = {"v1": 90.0, "v2": 10.0}, {"v2": 10.0, "v1": 90.0}
    assert all(version_for_bucket(forward, b) == version_for_bucket(backward, b) for b in range(2_000))


def test_a_rollback_is_one_split_and_sends_everyone_to_the_old_version() -> None:
    split = rollout_split("v2", "v1", 100)  # v1 takes everything back
    assert split == {"v1": 100.0}
    assert {choose_version(split, "acme", c) for c in CONVERSATIONS} == {"v1"}
    assert rollout_split("v1", "v2", 0) == {"v1": 100.0}


@pytest.mark.parametrize(
    "split",
    [
        {},
        {"v1": 50.0},
        {"v1": 120.0, "v2": -20.0},
        {"v1": float("nan"), "v2": 100.0},
        {"v1": 99.0, "v2": 0.5},
    ],
)
def test_a_bad_split_is_refused(split: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        check_split(split)


def test_rollout_steps_parse_and_advance() -> None:
    steps = RolloutSteps.parse("1,10,50,100")
    assert steps.steps_pct == (1.0, 10.0, 50.0, 100.0)
    assert steps.next_index(0) == 1 and steps.next_index(3) is None


@pytest.mark.parametrize("text", ["", "10,5,100", "0,100", "10,50", "1,x,100", "50,150"])
def test_bad_steps_are_refused_with_the_reason(text: str) -> None:
    with pytest.raises(ValueError):
        RolloutSteps.parse(text)


def _stats(
    num_requests: int, num_errors: int = 0, ttft_ms: float = 100.0, itl_ms: float = 20.0
) -> VersionStats:
    return VersionStats(num_requests, num_errors, ttft_ms, itl_ms)


def test_the_guard_holds_then_advances_or_rolls_back_on_the_first_broken_bound() -> None:
    bounds = GuardBounds(min_requests=100)
    assert guard_decision(_stats(500), _stats(20), bounds).action is GuardAction.HOLD
    assert guard_decision(_stats(500), _stats(200), bounds).action is GuardAction.ADVANCE
    assert guard_decision(_stats(500, 5), _stats(200, 10), bounds).action is GuardAction.ROLLBACK  # 5% vs 1%
    slow = guard_decision(_stats(500), _stats(200, ttft_ms=160), bounds)
    assert slow.action is GuardAction.ROLLBACK and "TTFT p95" in slow.reason
    stutter = guard_decision(_stats(500), _stats(200, itl_ms=31), bounds)
    assert stutter.action is GuardAction.ROLLBACK and "inter-token" in stutter.reason
