"""Queue admission from deadline and drain rate; replica choice from KV, waiting count and ITL."""

from __future__ import annotations

import pytest

from sluice.domain import RequestClass
from sluice.policy.dispatch import DispatchConfig, ReplicaLoad, Standing, pick_replica, standing
from sluice.policy.queue_depth import QueueDepthConfig, check_queue
from sluice.policy.rate import RateMeter
from sluice.policy.share import over_fair_share

CONFIG = QueueDepthConfig(min_drain_rate_per_s=1.0, min_retry_after_s=1.0)


def test_admits_while_the_expected_wait_fits_before_the_deadline() -> None:
    # 100 ahead at 50/s: 2 s of waiting; 10 s deadline, 3 s of service → up to 7 s of waiting is fine.
    assert check_queue(100, 50.0, now_s=0.0, deadline_s=10.0, min_service_s=3.0, config=CONFIG) is None


def test_refuses_with_the_time_the_queue_needs_to_drain() -> None:
    refusal = check_queue(500, 50.0, now_s=0.0, deadline_s=10.0, min_service_s=3.0, config=CONFIG)
    assert refusal is not None
    assert refusal.expected_wait_s == pytest.approx(10.0) and refusal.max_wait_s == pytest.approx(7.0)
    assert refusal.retry_after_s == pytest.approx(3.0)


def test_a_request_that_cannot_make_its_deadline_at_all_is_refused() -> None:
    refusal = check_queue(0, 50.0, now_s=0.0, deadline_s=1.0, min_service_s=5.0, config=CONFIG)
    assert refusal is not None and refusal.retry_after_s >= CONFIG.min_retry_after_s


def test_an_unmeasured_drain_rate_uses_the_configured_floor() -> None:
    assert check_queue(6, None, 0.0, 10.0, 1.0, CONFIG) is None  # 6 s at 1/s fits in 9 s
    assert check_queue(0, None, 0.0, 0.5, 0.1, CONFIG) is None  # nothing ahead: no wait at all
    refusal = check_queue(21, None, 0.0, 10.0, 1.0, CONFIG)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(21 - 9)


def load(
    rid: str, free: int, *, total: int = 10_000, waiting: int = 0, running: int = 1, itl: float | None = 20.0
) -> ReplicaLoad:
    return ReplicaLoad(rid, free, total, waiting, running, itl)


DISPATCH = DispatchConfig(
    itl_target_ms=40.0,
    max_waiting_per_replica=1,
    yield_kv_reserve_fraction=0.2,
    batch_itl_fraction=0.9,
    over_share_itl_fraction=0.75,
)
FULL, BATCH, OVER = Standing.UNDER_SHARE, Standing.BATCH, Standing.OVER_SHARE


def test_picks_the_replica_with_the_most_free_kv() -> None:
    loads = [load("a", 3_000), load("b", 6_000), load("c", 5_000)]
    assert pick_replica(loads, 1_000, FULL, DISPATCH).replica_id == "b"  # type: ignore[union-attr]


def test_kv_headroom_waiting_and_latency_gate_dispatch() -> None:
    assert pick_replica([load("a", 999)], 1_000, FULL, DISPATCH) is None
    assert pick_replica([load("a", 9_000, waiting=1)], 1_000, FULL, DISPATCH) is None
    assert pick_replica([load("a", 9_000, itl=41.0)], 1_000, FULL, DISPATCH) is None
    # An idle replica's last ITL is stale: it takes work.
    idle = load("a", 9_000, itl=90.0, running=0)
    assert pick_replica([idle], 1_000, FULL, DISPATCH) is idle


def test_yielding_work_leaves_kv_and_latency_headroom() -> None:
    replica = load("a", 2_500)  # reserve = 20% of 10,000 = 2,000
    assert pick_replica([replica], 1_000, FULL, DISPATCH) is replica
    assert pick_replica([replica], 1_000, BATCH, DISPATCH) is None
    assert pick_replica([replica], 500, BATCH, DISPATCH) is replica
    busy = load("b", 9_000, itl=33.0)  # under 90% of the 40 ms target, over 75% of it
    assert pick_replica([busy], 500, FULL, DISPATCH) is busy
    assert pick_replica([busy], 500, BATCH, DISPATCH) is busy
    assert pick_replica([busy], 500, OVER, DISPATCH) is None
    busier = load("c", 9_000, itl=37.0)
    assert pick_replica([busier], 500, FULL, DISPATCH) is busier
    assert pick_replica([busier], 500, BATCH, DISPATCH) is None


def test_batch_and_tenants_over_their_share_yield() -> None:
    assert standing(RequestClass.BATCH, over_share=False) is BATCH
    assert standing(RequestClass.INTERACTIVE, over_share=True) is OVER
    assert standing(RequestClass.BATCH, over_share=True) is OVER
    assert standing(RequestClass.INTERACTIVE, over_share=False) is FULL


def test_fair_share_is_weighted_among_tenants_with_work_in_flight() -> None:
    assert not over_fair_share("a", 1.0, {}, {})  # alone: everything is its share
    assert not over_fair_share("a", 1.0, {"a": 50}, {"a": 1.0})
    in_flight = {"noisy": 60, "b": 10, "c": 10}
    assert over_fair_share("noisy", 1.0, in_flight, {})
    assert not over_fair_share("b", 1.0, in_flight, {})
    assert not over_fair_share("new", 1.0, in_flight, {})  # a newcomer is far under its share
    # Weight 4 against two tenants of weight 1: a share of 4/6 of 81 = 54, so 60 (+1) is within 25%.
    assert not over_fair_share("noisy", 4.0, in_flight, {"b": 1.0, "c": 1.0})


def test_bad_configs_fail() -> None:
    with pytest.raises(ValueError):
        DispatchConfig(max_waiting_per_replica=0)
    with pytest.raises(ValueError):
        DispatchConfig(over_share_itl_fraction=0)
    with pytest.raises(ValueError):
        QueueDepthConfig(min_drain_rate_per_s=0)


def test_rate_meter_measures_over_its_window() -> None:
    meter = RateMeter(window_s=10.0)
    assert meter.rate_per_s(0.0) is None
    meter.observe(0.0)
    assert meter.rate_per_s(0.0) == 1.0  # at least one second of span
    for n in range(1, 101):
        meter.observe(n * 0.1)  # 10 per second
    assert meter.rate_per_s(10.0) == pytest.approx(10.0, rel=0.02)
    assert meter.rate_per_s(25.0) == 0.0  # everything fell out of the window
