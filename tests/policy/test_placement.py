"""Replica choice among those the gate lets through: the weighted score, tenant-scoped prefix keys, the
affinity bonus and where it yields, and ties broken by replica id."""

from __future__ import annotations

import pytest

from sluice.domain import RequestClass
from sluice.policy.dispatch import DispatchConfig, ReplicaLoad, Standing, pick_replica
from sluice.policy.dispatch_pass import DispatchPass
from sluice.policy.fair_queue import FairQueue, QueueEntry, WaitingRequest
from sluice.policy.placement import ScoreWeights, prefix_key, saturated, score
from sluice.policy.share import InFlight

DISPATCH = DispatchConfig(itl_target_ms=50.0, max_waiting_per_replica=4)
FULL = Standing.UNDER_SHARE
WEIGHTS = ScoreWeights()  # 2, 2, 1, 3
PROMPT = list(range(100, 164))  # four full 16-token blocks


def load(
    rid: str, free: int, *, total: int = 10_000, waiting: int = 0, itl: float | None = 10.0
) -> ReplicaLoad:
    return ReplicaLoad(rid, free, total, waiting, num_running=1, itl_ms=itl)


# ----- prefix keys -----
def test_the_prefix_key_is_stable_across_processes() -> None:
    """A literal: BLAKE2b, not Python's per-process salted hash, so every gateway agrees on a key."""
    assert prefix_key("acme", list(range(64))) == 12624748595919067173
    assert prefix_key("acme", list(range(16)), num_blocks=1) == 2672203839780852737


def test_two_tenants_with_the_same_prompt_get_different_keys() -> None:
    assert prefix_key("acme", PROMPT) != prefix_key("globex", PROMPT)
    # The tenant's length is hashed: moving characters across the boundary is a different key.
    assert prefix_key("ab", [0] * 16) != prefix_key("a", [0] * 16)


def test_the_key_covers_only_the_leading_full_blocks() -> None:
    key = prefix_key("acme", PROMPT)
    assert key is not None
    assert prefix_key("acme", [*PROMPT, 7, 8, 9]) == key  # a partial fifth block does not count
    assert prefix_key("acme", PROMPT + list(range(32))) == key  # beyond num_blocks: not hashed
    assert prefix_key("acme", [1, *PROMPT[1:]]) != key  # the first token differs
    assert prefix_key("acme", [*PROMPT[:63], 0]) != key  # the last token of the fourth block differs
    assert prefix_key("acme", PROMPT[:20]) == prefix_key("acme", PROMPT[:16])  # one full block each
    assert prefix_key("acme", PROMPT, num_blocks=2) == prefix_key("acme", PROMPT[:32])


def test_a_prompt_without_a_full_block_has_no_key() -> None:
    assert prefix_key("acme", PROMPT[:15]) is None
    assert prefix_key("acme", []) is None
    assert prefix_key("acme", PROMPT[:8], block_size_tokens=8) is not None


def test_bad_block_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="block_size_tokens"):
        prefix_key("acme", PROMPT, block_size_tokens=0)
    with pytest.raises(ValueError, match="num_blocks"):
        prefix_key("acme", PROMPT, num_blocks=0)


# ----- the score -----
def test_each_term_is_normalised_and_weighted() -> None:
    idle = ReplicaLoad("r", 0, 0, 0, 0, None)  # nothing read, nothing measured: every load term is 1
    assert score(idle, False, WEIGHTS, 50.0, 4) == pytest.approx(2 + 2 + 1)
    assert score(idle, True, WEIGHTS, 50.0, 4) == pytest.approx(2 + 2 + 1 + 3)
    # KV 25% free, 1 of 4 waiting places used, ITL at 20 of 50 ms.
    busy = load("r", 2_500, waiting=1, itl=20.0)
    assert score(busy, False, WEIGHTS, 50.0, 4) == pytest.approx(2 * 0.25 + 2 * 0.75 + 1 * 0.6)
    # Past the target and past the waiting limit, a term is 0, never negative.
    worst = load("r", 0, waiting=9, itl=500.0)
    assert score(worst, False, WEIGHTS, 50.0, 4) == 0.0
    only_kv = ScoreWeights(kv_headroom=1.0, waiting=0.0, itl=0.0, prefix=0.0)
    assert score(busy, True, only_kv, 50.0, 4) == pytest.approx(0.25)


def test_negative_or_infinite_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="waiting"):
        ScoreWeights(waiting=-1.0)
    with pytest.raises(ValueError, match="prefix"):
        ScoreWeights(prefix=float("inf"))
    with pytest.raises(ValueError, match="saturation_kv_used_fraction"):
        DispatchConfig(saturation_kv_used_fraction=0.0)


def test_load_terms_decide_without_affinity() -> None:
    # b has less KV free than a but a has a deep queue inside: 2*0.5+2*1 beats 2*0.7+2*0.25.
    a, b = load("a", 7_000, waiting=3), load("b", 5_000)
    assert pick_replica([a, b], 100, FULL, DISPATCH) is b
    fast, slow = load("fast", 6_000, itl=5.0), load("slow", 6_000, itl=45.0)
    assert pick_replica([slow, fast], 100, FULL, DISPATCH) is fast


# ----- affinity -----
def test_the_replica_the_prefix_was_last_sent_to_is_preferred() -> None:
    key = prefix_key("acme", PROMPT)
    assert key is not None
    a, b = load("a", 4_000), load("b", 9_000)
    assert pick_replica([a, b], 100, FULL, DISPATCH) is b
    assert pick_replica([a, b], 100, FULL, DISPATCH, prefix_key=key, affinity={key: "a"}) is a
    # Another tenant's key for the same prompt is not in the memory: no bonus.
    other = prefix_key("globex", PROMPT)
    assert pick_replica([a, b], 100, FULL, DISPATCH, prefix_key=other, affinity={key: "a"}) is b
    # A remembered replica that is no longer among the loads (drained) is simply not there.
    assert pick_replica([b], 100, FULL, DISPATCH, prefix_key=key, affinity={key: "gone"}) is b


def test_affinity_yields_when_its_replica_is_saturated() -> None:
    key = 42
    nearly_full = load("a", 1_000)  # 90% of its KV used: saturated, although it still accepts
    assert saturated(nearly_full, DISPATCH.saturation_kv_used_fraction, DISPATCH.max_waiting_per_replica)
    other = load("b", 3_000)
    assert (
        pick_replica([nearly_full, other], 100, FULL, DISPATCH, prefix_key=key, affinity={key: "a"}) is other
    )
    below = load("a", 1_100)  # 89% used: not saturated, affinity holds over more free KV elsewhere
    assert not saturated(below, DISPATCH.saturation_kv_used_fraction, DISPATCH.max_waiting_per_replica)
    assert pick_replica([below, other], 100, FULL, DISPATCH, prefix_key=key, affinity={key: "a"}) is below
    # Its waiting places full: saturated too (and the gate takes it out anyway).
    assert saturated(load("a", 9_000, waiting=4), 0.9, 4)
    assert not saturated(ReplicaLoad("a", 0, 0, 0, 0, None), 0.9, 4)  # not read yet: nothing known used


def test_a_zero_prefix_weight_turns_affinity_off() -> None:
    config = DispatchConfig(itl_target_ms=50.0, max_waiting_per_replica=4, weights=ScoreWeights(prefix=0.0))
    a, b = load("a", 4_000), load("b", 9_000)
    assert pick_replica([a, b], 100, FULL, config, prefix_key=1, affinity={1: "a"}) is b


def test_ties_go_to_the_smallest_replica_id_whatever_the_order() -> None:
    loads = [load("c", 5_000), load("a", 5_000), load("b", 5_000)]
    for order in (loads, loads[::-1], loads[1:] + loads[:1]):
        assert pick_replica(order, 100, FULL, DISPATCH).replica_id == "a"  # type: ignore[union-attr]
    # Equal in exact arithmetic (0.1 + 0.2 vs 0.2 + 0.1), unequal in binary floating point: still a tie.
    weights = ScoreWeights(kv_headroom=1.0, waiting=1.0, itl=0.0, prefix=0.0)
    config = DispatchConfig(itl_target_ms=50.0, max_waiting_per_replica=10, weights=weights)
    a, b = load("a", 1_000, waiting=8), load("b", 2_000, waiting=9)
    assert 1_000 / 10_000 + (1 - 8 / 10) != 2_000 / 10_000 + (1 - 9 / 10)  # the noise is real
    assert score(a, False, weights, 50.0, 10) == score(b, False, weights, 50.0, 10)
    assert pick_replica([b, a], 100, FULL, config) is a


# ----- the pass carries the request's key -----
def test_the_dispatch_pass_places_by_the_heads_prefix_key() -> None:
    queue: FairQueue[None] = FairQueue()
    key = prefix_key("acme", PROMPT)
    queue.push(
        QueueEntry(WaitingRequest("r1", "acme", 1.0, RequestClass.INTERACTIVE, 64, 16, 0.0, 1e9), None, key)
    )
    queue.push(
        QueueEntry(
            WaitingRequest("r2", "globex", 1.0, RequestClass.INTERACTIVE, 64, 16, 0.0, 1e9), None, None
        )
    )
    assert key is not None
    loads = [load("a", 4_000), load("b", 9_000)]
    dispatch = DispatchPass(queue, 0.0, DISPATCH, lambda e: 0.0, 0.25, affinity={key: "a"})
    placed = {}
    while (p := dispatch.next(loads, InFlight(), {})) is not None:
        queue.take(p.entry, 0.0)
        placed[p.entry.request_id] = p.replica.replica_id
    assert placed == {"r1": "a", "r2": "b"}
