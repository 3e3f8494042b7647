"""The placement switch (``SLUICE_ROUTER_PLACEMENT``): the ``least_loaded`` and ``random`` baselines that
the prefix-affinity score is measured against are honoured by ``pick_replica`` and the dispatch pass, take
only replicas the gate lets through, ignore affinity, and are deterministic."""

from __future__ import annotations

from collections import Counter

import pytest

from sluice.domain import RequestClass
from sluice.policy.dispatch import DispatchConfig, PlacementRule, ReplicaLoad, Standing, pick_replica
from sluice.policy.dispatch_pass import DispatchPass
from sluice.policy.fair_queue import FairQueue, QueueEntry, WaitingRequest
from sluice.policy.placement import hashed, least_loaded
from sluice.policy.share import InFlight
from sluice.settings import SettingsError, load_settings

FULL = Standing.UNDER_SHARE


def config(placement: PlacementRule) -> DispatchConfig:
    return DispatchConfig(itl_target_ms=50.0, max_waiting_per_replica=4, placement=placement)


def load(rid: str, free: int, *, running: int = 1, waiting: int = 0, itl: float = 10.0) -> ReplicaLoad:
    return ReplicaLoad(rid, free, 10_000, waiting, num_running=running, itl_ms=itl)


# ----- least loaded -----
def test_least_loaded_takes_the_most_free_kv_then_the_fewest_running_then_the_smallest_id() -> None:
    assert least_loaded([load("a", 4_000), load("b", 6_000)]).replica_id == "b"  # type: ignore[union-attr]
    busy, idle = load("a", 5_000, running=3), load("b", 5_000, running=1)
    assert least_loaded([busy, idle]) is idle
    twins = [load("b", 5_000), load("a", 5_000)]
    assert least_loaded(twins).replica_id == "a"  # type: ignore[union-attr]
    assert least_loaded([]) is None


def test_least_loaded_ignores_affinity_that_the_score_follows() -> None:
    hot, roomy = load("a", 6_000), load("b", 8_000)
    affinity = {7: "a"}
    scored = pick_replica(
        [hot, roomy], 100, FULL, config(PlacementRule.SCORE), prefix_key=7, affinity=affinity
    )
    assert scored is hot  # the prefix bonus outweighs the KV difference
    plain = config(PlacementRule.LEAST_LOADED)
    assert pick_replica([hot, roomy], 100, FULL, plain, prefix_key=7, affinity=affinity) is roomy


def test_least_loaded_takes_only_replicas_the_gate_lets_through() -> None:
    plain = config(PlacementRule.LEAST_LOADED)
    full_queue, slow = load("a", 9_000, waiting=4), load("b", 8_000, itl=80.0)
    small = load("c", 1_000)
    assert pick_replica([full_queue, slow, small], 100, FULL, plain) is small
    assert pick_replica([full_queue, slow, small], 1_001, FULL, plain) is None  # small lacks the KV


# ----- random: a hash of the request id -----
def test_random_is_deterministic_per_request_and_blind_to_load_and_order() -> None:
    rand = config(PlacementRule.RANDOM)
    loads = [load("a", 1_000), load("b", 9_000), load("c", 5_000)]
    first = pick_replica(loads, 100, FULL, rand, request_id="req-1")
    assert first is not None
    for _ in range(3):
        assert pick_replica(list(reversed(loads)), 100, FULL, rand, request_id="req-1") is first
    assert hashed(loads, "req-1") is first
    # Over many requests each replica gets about a third, whatever its load.
    counts = Counter(
        pick_replica(loads, 100, FULL, rand, request_id=f"req-{i}").replica_id  # type: ignore[union-attr]
        for i in range(900)
    )
    assert set(counts) == {"a", "b", "c"} and all(240 <= n <= 360 for n in counts.values()), counts


def test_random_takes_only_replicas_the_gate_lets_through_and_ignores_affinity() -> None:
    rand = config(PlacementRule.RANDOM)
    ok, closed = load("a", 5_000), load("b", 9_000, waiting=4)
    chosen = {
        pick_replica([ok, closed], 100, FULL, rand, request_id=f"r{i}", prefix_key=1, affinity={1: "b"})
        for i in range(50)
    }
    assert chosen == {ok}
    assert pick_replica([closed], 100, FULL, rand, request_id="r0") is None


def test_random_without_a_request_id_is_refused() -> None:
    with pytest.raises(ValueError, match="request_id"):
        pick_replica([load("a", 5_000)], 100, FULL, config(PlacementRule.RANDOM))


def test_the_dispatch_pass_hands_the_heads_request_id_to_the_random_rule() -> None:
    loads = [load("a", 9_000), load("b", 9_000), load("c", 9_000)]
    ids = [f"req-{i}" for i in range(12)]
    queue: FairQueue[None] = FairQueue()
    for request_id in ids:
        queue.push(
            QueueEntry(
                WaitingRequest(request_id, "acme", 1.0, RequestClass.INTERACTIVE, 64, 16, 0.0, 1e9),
                None,
                None,
            )
        )
    dispatch = DispatchPass(queue, 0.0, config(PlacementRule.RANDOM), lambda e: 0.0, 0.25)
    placed = {}
    while (p := dispatch.next(loads, InFlight(), {})) is not None:
        queue.take(p.entry, 0.0)
        placed[p.entry.request_id] = p.replica.replica_id
    assert placed == {r: hashed(loads, r).replica_id for r in ids}  # type: ignore[union-attr]
    assert len(set(placed.values())) > 1


# ----- the setting -----
def test_the_setting_names_one_of_the_rules_and_defaults_to_the_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLUICE_ROUTER_PLACEMENT", raising=False)
    assert PlacementRule(load_settings().router_placement) is PlacementRule.SCORE
    for rule in PlacementRule:
        monkeypatch.setenv("SLUICE_ROUTER_PLACEMENT", rule.value)
        assert PlacementRule(load_settings().router_placement) is rule
    monkeypatch.setenv("SLUICE_ROUTER_PLACEMENT", "round_robin")
    with pytest.raises(SettingsError, match="SLUICE_ROUTER_PLACEMENT"):
        load_settings()
