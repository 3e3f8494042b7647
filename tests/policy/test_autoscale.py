"""The autoscaler's pure policy (sluice/policy/autoscale.py): bounds, pressure, warm-first scale-up,
cooldown, one-at-a-time scale-down, hysteresis and the warm pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluice.policy.autoscale import (
    AutoscaleConfig,
    Decision,
    Direction,
    Reason,
    ScaleState,
    VersionSignals,
    decide,
    is_calm,
    pressure,
)

CONFIG = AutoscaleConfig(
    min_replicas=1,
    max_replicas=10,
    warm_pool_replicas=2,
    ttft_slo_s=0.5,
    queue_wait_target_s=0.25,
    queue_depth_per_replica=4.0,
    calm_fraction=0.5,
    scale_down_cooldown_s=300.0,
    max_scale_up_ratio=2.0,
)
IDLE = VersionSignals(
    queue_depth=0,
    queue_wait_p95_s=None,
    ttft_p95_s=None,
    num_ready=4,
    num_starting=0,
    num_draining=0,
    num_warm_ready=2,
    num_warm_starting=0,
)
# Inside the hysteresis band: under every target, over half of it.
BAND = replace(IDLE, ttft_p95_s=0.4, queue_wait_p95_s=0.05, queue_depth=2)


def test_config_refuses_bounds_that_cannot_hold() -> None:
    with pytest.raises(ValueError):
        AutoscaleConfig(min_replicas=5, max_replicas=4)
    with pytest.raises(ValueError):
        AutoscaleConfig(calm_fraction=1.0)  # no hysteresis band
    with pytest.raises(ValueError):
        AutoscaleConfig(ttft_slo_s=0)
    with pytest.raises(ValueError):
        AutoscaleConfig(warm_pool_replicas=-1)


def test_pressure_is_the_largest_ratio_and_names_it() -> None:
    signals = replace(IDLE, ttft_p95_s=0.75, queue_wait_p95_s=0.25, queue_depth=8)
    assert pressure(signals, CONFIG) == (1.5, Reason.TTFT)
    signals = replace(IDLE, ttft_p95_s=0.3, queue_wait_p95_s=0.75, queue_depth=8)
    assert pressure(signals, CONFIG) == (3.0, Reason.QUEUE_WAIT)
    signals = replace(IDLE, queue_depth=32)  # 32 / (4 x 4 ready)
    assert pressure(signals, CONFIG) == (2.0, Reason.QUEUE_DEPTH)


def test_ttft_over_slo_scales_up_at_once_promoting_warm_replicas_first() -> None:
    signals = replace(IDLE, ttft_p95_s=0.75)  # 1.5x: 4 ready -> 6
    decision = decide(signals, ScaleState(), CONFIG, now_s=10.0)
    assert decision.direction is Direction.UP and decision.reason_code is Reason.TTFT
    assert decision.desired_replicas == 6
    assert (decision.num_promote, decision.num_cold_start) == (2, 0)  # both warm ones, no cold start
    assert decision.num_warm_start == 2  # and the pool is refilled behind them
    assert "up 4 -> 6" in decision.reason and "2 from the warm pool" in decision.reason


def test_a_bigger_step_than_the_warm_pool_adds_cold_starts_behind_it() -> None:
    signals = replace(IDLE, queue_depth=28, queue_wait_p95_s=0.2)  # 28 / 16 = 1.75x: 4 -> 7
    decision = decide(signals, ScaleState(), CONFIG, now_s=0.0)
    assert decision.reason_code is Reason.QUEUE_DEPTH
    assert (decision.desired_replicas, decision.num_promote, decision.num_cold_start) == (7, 2, 1)
    assert decision.num_warm_start == 2


def test_one_decision_at_most_doubles_the_ready_replicas_and_counts_those_starting() -> None:
    signals = replace(IDLE, ttft_p95_s=5.0, num_warm_ready=0)  # 10x over the SLO
    first = decide(signals, ScaleState(), CONFIG, now_s=0.0)
    assert first.desired_replicas == 8 and first.num_cold_start == 4
    # Later: the 4 are still starting, the pressure is the same: nothing more is ordered.
    second = decide(replace(signals, num_starting=4), first.state, CONFIG, now_s=45.0)
    assert second.direction is Direction.HOLD and second.reason_code is Reason.STARTING
    assert second.num_cold_start == second.num_promote == 0


def test_after_a_step_up_only_the_queue_depth_may_order_another_until_it_settles() -> None:
    first = decide(replace(IDLE, ttft_p95_s=1.0), ScaleState(), CONFIG, now_s=0.0)  # 4 -> 8: all 2 warm + 2
    assert first.direction is Direction.UP and first.state.capacity_changed_s == 0.0
    # 10 s later the promoted replicas are ready; the window's TTFT still holds the waits from before.
    after = replace(IDLE, num_ready=6, num_starting=2, num_warm_ready=0, num_warm_starting=2, ttft_p95_s=1.0)
    settling = decide(after, first.state, CONFIG, now_s=10.0)
    assert settling.direction is Direction.HOLD and settling.reason_code is Reason.SETTLING
    # The queue (a gauge, now) still over its target: it may order more at once.
    deep = decide(replace(after, queue_depth=36), first.state, CONFIG, now_s=10.0)  # 36 / (4 x 6) = 1.5x
    assert deep.direction is Direction.UP and deep.reason_code is Reason.QUEUE_DEPTH
    assert deep.desired_replicas == 9
    # 30 s after the replicas turned ready (at 10 s) the latencies count again.
    assert decide(after, settling.state, CONFIG, now_s=39.0).reason_code is Reason.SETTLING
    later = decide(after, settling.state, CONFIG, now_s=40.0)
    assert later.direction is Direction.UP and later.reason_code is Reason.TTFT


def test_replicas_turning_ready_restart_the_stabilization() -> None:
    slow = replace(IDLE, ttft_p95_s=1.0, num_warm_ready=0)
    state = decide(replace(slow, num_ready=2, num_starting=2), ScaleState(), CONFIG, now_s=0.0).state
    # 100 s later the 2 cold starts are ready: this window's TTFT was measured before they were.
    arrived = decide(slow, state, CONFIG, now_s=100.0)
    assert arrived.direction is Direction.HOLD and arrived.reason_code is Reason.SETTLING
    assert decide(slow, arrived.state, CONFIG, now_s=130.0).direction is Direction.UP


def test_max_bounds_the_scale_up() -> None:
    signals = replace(IDLE, num_ready=8, ttft_p95_s=5.0, num_warm_ready=0)
    decision = decide(signals, ScaleState(), CONFIG, now_s=0.0)
    assert decision.desired_replicas == 10 and decision.num_cold_start == 2
    at_max = decide(replace(signals, num_ready=10), ScaleState(), CONFIG, now_s=0.0)
    assert at_max.direction is Direction.HOLD and at_max.reason_code is Reason.AT_MAX


def test_below_min_scales_up_even_without_load() -> None:
    config = replace(CONFIG, min_replicas=3)
    decision = decide(replace(IDLE, num_ready=1), ScaleState(), config, now_s=0.0)
    assert decision.reason_code is Reason.BELOW_MIN and decision.desired_replicas == 3
    assert decision.num_promote == 2 and decision.num_cold_start == 0


def test_a_failed_replica_is_replaced_from_the_warm_pool() -> None:
    config = replace(CONFIG, min_replicas=4)
    decision = decide(replace(IDLE, num_ready=3), ScaleState(), config, now_s=0.0)  # one of 4 failed
    assert (decision.num_promote, decision.num_cold_start, decision.num_warm_start) == (1, 0, 1)


def test_above_max_steps_down_one_at_a_time_without_cooldown() -> None:
    config = replace(CONFIG, max_replicas=2)
    decision = decide(replace(IDLE, ttft_p95_s=5.0), ScaleState(), config, now_s=0.0)
    assert decision.direction is Direction.DOWN and decision.reason_code is Reason.ABOVE_MAX
    assert decision.num_drain == 1 and decision.desired_replicas == 3
    waiting = decide(replace(IDLE, num_ready=3, num_draining=1), decision.state, config, now_s=1.0)
    assert waiting.direction is Direction.HOLD and waiting.num_drain == 0


def _run(signals: VersionSignals, start_s: float, end_s: float, step_s: float, state: ScaleState) -> list:
    decisions: list[tuple[float, Decision]] = []
    t = start_s
    while t <= end_s:
        decision = decide(signals, state, CONFIG, now_s=t)
        decisions.append((t, decision))
        state = decision.state
        t += step_s
    return decisions


def test_scale_down_waits_for_the_cooldown_then_drains_one_replica() -> None:
    decisions = _run(IDLE, 0.0, 290.0, 10.0, ScaleState())
    assert all(d.direction is Direction.HOLD and d.reason_code is Reason.COOLDOWN for _, d in decisions)
    assert "10 s of cooldown left" in decisions[-1][1].reason
    down = decide(IDLE, decisions[-1][1].state, CONFIG, now_s=300.0)
    assert down.direction is Direction.DOWN and down.reason_code is Reason.CALM
    assert (down.num_drain, down.num_demote, down.desired_replicas) == (1, 0, 3)  # the warm pool is full


def test_after_one_step_down_the_next_needs_another_full_cooldown() -> None:
    state = ScaleState(calm_since_s=0.0)
    down = decide(IDLE, state, CONFIG, now_s=300.0)
    assert down.direction is Direction.DOWN
    fewer = replace(IDLE, num_ready=3)
    for t in (310.0, 450.0, 599.0):
        held = decide(fewer, down.state, CONFIG, now_s=t)
        assert held.direction is Direction.HOLD and held.num_drain == 0
    assert decide(fewer, down.state, CONFIG, now_s=600.0).num_drain == 1


def test_no_scale_down_while_a_replica_drains_or_starts() -> None:
    state = ScaleState(calm_since_s=0.0)
    for signals in (replace(IDLE, num_draining=1), replace(IDLE, num_starting=1)):
        decision = decide(signals, state, CONFIG, now_s=1_000.0)
        assert decision.direction is Direction.HOLD and decision.num_drain == decision.num_demote == 0
        assert "one step at a time" in decision.reason


def test_never_below_min() -> None:
    config = replace(CONFIG, min_replicas=4)
    decision = decide(IDLE, ScaleState(calm_since_s=0.0), config, now_s=10_000.0)
    assert decision.direction is Direction.HOLD and decision.desired_replicas == 4
    assert "at the minimum 4" in decision.reason


def test_hysteresis_the_band_between_calm_and_pressure_holds_and_restarts_the_calm_clock() -> None:
    assert not is_calm(BAND, CONFIG) and pressure(BAND, CONFIG)[0] <= 1.0
    state = ScaleState(calm_since_s=0.0)
    held = decide(BAND, state, CONFIG, now_s=1_000.0)
    assert held.direction is Direction.HOLD and held.reason_code is Reason.STEADY
    assert held.state.calm_since_s is None
    # Calm again: the cooldown counts from now, not from the earlier calm.
    again = decide(IDLE, held.state, CONFIG, now_s=1_010.0)
    assert again.direction is Direction.HOLD and again.state.calm_since_s == 1_010.0
    assert decide(IDLE, again.state, CONFIG, now_s=1_309.0).direction is Direction.HOLD
    assert decide(IDLE, again.state, CONFIG, now_s=1_310.0).direction is Direction.DOWN


def test_pressure_resets_the_calm_clock() -> None:
    decision = decide(replace(IDLE, ttft_p95_s=0.6), ScaleState(calm_since_s=0.0), CONFIG, now_s=200.0)
    assert decision.direction is Direction.UP and decision.state.calm_since_s is None


def test_calm_judges_the_queue_against_one_replica_fewer() -> None:
    assert is_calm(replace(IDLE, queue_depth=6), CONFIG)  # 6 <= 0.5 x 4 x 3
    assert not is_calm(replace(IDLE, queue_depth=7), CONFIG)


def test_scale_down_moves_a_replica_into_a_short_warm_pool_instead_of_draining_it() -> None:
    signals = replace(IDLE, num_warm_ready=1)
    decision = decide(signals, ScaleState(calm_since_s=0.0), CONFIG, now_s=300.0)
    assert decision.direction is Direction.DOWN
    assert (decision.num_demote, decision.num_drain, decision.num_warm_start) == (1, 0, 0)


def test_warm_pool_is_refilled_counting_those_loading_and_its_excess_retired() -> None:
    short = decide(replace(IDLE, num_warm_ready=0, num_warm_starting=1), ScaleState(), CONFIG, 0.0)
    assert short.num_warm_start == 1 and "warm pool 1 of 2: starting 1" in short.reason
    full = decide(replace(IDLE, num_warm_ready=1, num_warm_starting=1), ScaleState(), CONFIG, 0.0)
    assert full.num_warm_start == 0 and full.num_warm_retire == 0
    excess = decide(replace(IDLE, num_warm_ready=5), ScaleState(), CONFIG, 0.0)
    assert excess.num_warm_retire == 3
    none = decide(IDLE, ScaleState(), replace(CONFIG, warm_pool_replicas=0), 0.0)
    assert none.num_warm_retire == 2


def test_every_decision_carries_a_reason_with_the_signals() -> None:
    for signals in (IDLE, BAND, replace(IDLE, ttft_p95_s=0.9)):
        decision = decide(signals, ScaleState(), CONFIG, now_s=0.0)
        assert decision.reason and decision.reason_code in Reason
        assert "TTFT p95" in decision.reason and "queue" in decision.reason


def test_no_traffic_at_all_is_calm() -> None:
    assert is_calm(IDLE, CONFIG)
    decision = decide(
        replace(IDLE, num_ready=0, num_starting=0), ScaleState(), replace(CONFIG, min_replicas=0), 0.0
    )
    assert decision.direction is Direction.HOLD and decision.desired_replicas == 0
