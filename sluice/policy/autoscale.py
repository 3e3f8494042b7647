"""How many replicas a model version should have, and what to do about it now: the autoscaler's pure policy,
run by the control plane's loop (control_plane/autoscaler) and by the simulator's ``doubling`` scenario.

Signals, never GPU utilisation (busy under batching says nothing about waiting users): the gateways' queue
depth, the queue wait p95 and the time-to-first-token p95 of interactive requests over the last window,
and the version's replicas by state and pool. One number sums the pressure: the largest of TTFT p95 / SLO,
queue wait p95 / its target, and queue depth / (depth per replica x ready replicas).

- **Up at once** when the pressure is over 1: to ``ceil(ready x pressure)`` replicas (at most
  ``max_scale_up_ratio`` x ready per decision, so a queue built during a cold start does not order a
  fleet), counting the ones still starting. Warm replicas are promoted first (one registry write each:
  seconds), cold starts make up the rest (minutes). Below ``min_replicas``: up to it, whatever the load.
  For ``scale_up_stabilization_s`` after a step up, or after more replicas turned ready, only the queue
  depth (a gauge: now) may order more: the latency p95s are windows, and the window after new capacity
  arrived still holds the waits from before it.
- **Down one replica at a time**, only after ``scale_down_cooldown_s`` of calm (every signal under
  ``calm_fraction`` of its target, the queue measured against one replica fewer), only while nothing
  starts or drains, and never below ``min_replicas``. The replica leaves by draining (or by moving to the
  warm pool when that is short: it stops taking work the same way and stays loaded). Between calm and
  pressure (the hysteresis band) nothing moves, and the calm clock restarts.
- **Warm pool**: ``warm_pool_replicas`` loaded, verified, unrouted replicas, on top of ``max_replicas``;
  refilled by cold starts into the pool after each promotion; an excess (the setting lowered) is retired.

State and ``now_s`` in, a ``Decision`` out (with the next ``ScaleState``); every decision says why in
``reason`` (a sentence for the log) and ``reason_code`` (a bounded label for metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"


class Reason(StrEnum):
    BELOW_MIN = "below_min"
    ABOVE_MAX = "above_max"
    TTFT = "ttft_over_slo"
    QUEUE_WAIT = "queue_wait_over_target"
    QUEUE_DEPTH = "queue_depth_over_target"
    STARTING = "pressure_waiting_for_starts"  # pressure, but enough replicas are starting already
    SETTLING = "settling_after_step_up"  # latencies over target, but from before the last step up
    AT_MAX = "pressure_at_max"
    CALM = "calm_after_cooldown"
    COOLDOWN = "calm_in_cooldown"
    STEADY = "steady"  # between calm and pressure: the hysteresis band


@dataclass(frozen=True)
class AutoscaleConfig:
    min_replicas: int = 1  # routed replicas (ready + starting), the warm pool not counted
    max_replicas: int = 8
    warm_pool_replicas: int = 1  # loaded, unrouted, on top of max_replicas
    ttft_slo_s: float = 0.5  # interactive TTFT p95 target
    queue_wait_target_s: float = 0.25  # interactive queue wait p95 target
    queue_depth_per_replica: float = 4.0  # waiting interactive requests per ready replica
    calm_fraction: float = 0.5  # every signal under this fraction of its target: calm
    scale_down_cooldown_s: float = 300.0  # calm this long (and this long since the last step down)
    scale_up_stabilization_s: float = 30.0  # after a step up, only the queue depth may order another
    max_scale_up_ratio: float = 2.0  # one decision asks for at most this x the ready replicas

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas, max >= 1: {self}")
        if self.warm_pool_replicas < 0:
            raise ValueError("warm_pool_replicas must be >= 0")
        if min(self.ttft_slo_s, self.queue_wait_target_s, self.queue_depth_per_replica) <= 0:
            raise ValueError("the SLO and targets must be > 0")
        if not 0 < self.calm_fraction < 1:
            raise ValueError("calm_fraction must be in (0, 1): below 1 is the hysteresis band")
        if min(self.scale_down_cooldown_s, self.scale_up_stabilization_s) < 0 or self.max_scale_up_ratio <= 1:
            raise ValueError("cooldown and stabilization must be >= 0, max_scale_up_ratio > 1")


@dataclass(frozen=True)
class VersionSignals:
    """One model version, now. Latencies are p95 over the last window; None: nothing measured in it."""

    queue_depth: float  # interactive requests waiting at the gateways
    queue_wait_p95_s: float | None
    ttft_p95_s: float | None
    num_ready: int  # routed (general pool) and ready
    num_starting: int  # routed once ready (cold starts under way)
    num_draining: int
    num_warm_ready: int  # the warm pool: loaded, verified, unrouted
    num_warm_starting: int  # loading into the warm pool


@dataclass(frozen=True)
class ScaleState:
    """What the policy remembers between decisions for one version (owned by its caller)."""

    calm_since_s: float | None = None
    last_scale_down_s: float | None = None
    capacity_changed_s: float | None = None  # the last step up, or the last rise in ready replicas
    num_ready_seen: int | None = None  # ready replicas at the previous decision


@dataclass(frozen=True)
class Decision:
    desired_replicas: int  # routed replicas wanted (ready + starting after these actions)
    direction: Direction
    reason_code: Reason
    reason: str
    num_promote: int = 0  # warm -> general (one registry write each)
    num_cold_start: int = 0  # new routed replicas
    num_drain: int = 0  # routed replicas to drain then stop (0 or 1)
    num_demote: int = 0  # routed replicas moved into the warm pool instead (0 or 1)
    num_warm_start: int = 0  # new replicas into the warm pool
    num_warm_retire: int = 0  # warm replicas beyond the pool's size, to stop (they hold no request)
    state: ScaleState = ScaleState()


def pressure(signals: VersionSignals, config: AutoscaleConfig) -> tuple[float, Reason]:
    """The largest signal / target ratio and which signal it is (1.0 = at target)."""
    ratios = [
        (
            signals.queue_depth / (config.queue_depth_per_replica * max(1, signals.num_ready)),
            Reason.QUEUE_DEPTH,
        )
    ]
    if signals.queue_wait_p95_s is not None:
        ratios.append((signals.queue_wait_p95_s / config.queue_wait_target_s, Reason.QUEUE_WAIT))
    if signals.ttft_p95_s is not None:
        ratios.append((signals.ttft_p95_s / config.ttft_slo_s, Reason.TTFT))
    return max(ratios, key=lambda pair: pair[0])


def is_calm(signals: VersionSignals, config: AutoscaleConfig) -> bool:
    """Every signal under ``calm_fraction`` of its target, the queue against one ready replica fewer."""
    f = config.calm_fraction
    fewer = max(0, signals.num_ready - 1)
    return (
        signals.queue_depth <= f * config.queue_depth_per_replica * fewer
        and (signals.queue_wait_p95_s is None or signals.queue_wait_p95_s <= f * config.queue_wait_target_s)
        and (signals.ttft_p95_s is None or signals.ttft_p95_s <= f * config.ttft_slo_s)
    )


def decide(signals: VersionSignals, state: ScaleState, config: AutoscaleConfig, now_s: float) -> Decision:
    """The decision for one version now (see the module docstring), warm pool refill included."""
    return _with_warm_pool(_scale(signals, state, config, now_s), signals, config)


def _describe(signals: VersionSignals, config: AutoscaleConfig) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    return (
        f"TTFT p95 {ms(signals.ttft_p95_s)} (SLO {config.ttft_slo_s * 1000:.0f} ms), queue wait p95 "
        f"{ms(signals.queue_wait_p95_s)} (target {config.queue_wait_target_s * 1000:.0f} ms), queue "
        f"{signals.queue_depth:g}; replicas {signals.num_ready} ready, {signals.num_starting} starting, "
        f"{signals.num_draining} draining"
    )


def _scale(signals: VersionSignals, state: ScaleState, config: AutoscaleConfig, now_s: float) -> Decision:
    if state.num_ready_seen is not None and signals.num_ready > state.num_ready_seen:
        state = replace(state, capacity_changed_s=now_s)  # capacity arrived: the windows are from before
    state = replace(state, num_ready_seen=signals.num_ready)
    why = _describe(signals, config)
    return (
        _bounds(signals, state, config, now_s, why)
        or _under_pressure(signals, state, config, now_s, why)
        or _calm(signals, state, config, now_s, why)
    )


def _bounds(
    signals: VersionSignals, state: ScaleState, config: AutoscaleConfig, now_s: float, why: str
) -> Decision | None:
    """Below the minimum: up at once; above the maximum: down one at a time (no cooldown)."""
    serving = signals.num_ready + signals.num_starting
    no_calm = replace(state, calm_since_s=None)
    if serving < config.min_replicas:
        reason = f"{serving} routed replicas, below the minimum {config.min_replicas}; {why}"
        stepped_up = replace(no_calm, capacity_changed_s=now_s)
        return _up(config.min_replicas - serving, serving, signals, Reason.BELOW_MIN, reason, stepped_up)
    if serving <= config.max_replicas:
        return None
    if signals.num_draining or signals.num_ready == 0:
        reason = f"above the maximum {config.max_replicas}, waiting for the drain; {why}"
        return Decision(serving, Direction.HOLD, Reason.ABOVE_MAX, reason, state=no_calm)
    reason = f"above the maximum {config.max_replicas}; {why}"
    return _down(
        serving, signals, config, Reason.ABOVE_MAX, reason, replace(no_calm, last_scale_down_s=now_s)
    )


def _under_pressure(
    signals: VersionSignals, state: ScaleState, config: AutoscaleConfig, now_s: float, why: str
) -> Decision | None:
    """Pressure over 1: up to ready x pressure (capped), unless settling after new capacity."""
    serving = signals.num_ready + signals.num_starting
    ratio, signal = pressure(signals, config)
    if ratio <= 1.0:
        return None
    no_calm = replace(state, calm_since_s=None)
    settling = (
        state.capacity_changed_s is not None
        and now_s - state.capacity_changed_s < config.scale_up_stabilization_s
    )
    if settling and signal is not Reason.QUEUE_DEPTH:
        depth_ratio = pressure(replace(signals, queue_wait_p95_s=None, ttft_p95_s=None), config)[0]
        if depth_ratio <= 1.0:
            reason = (
                f"pressure {ratio:.2f}x from latencies measured before the step up, queue "
                f"{depth_ratio:.2f}x; {why}"
            )
            return Decision(serving, Direction.HOLD, Reason.SETTLING, reason, state=no_calm)
        ratio, signal = depth_ratio, Reason.QUEUE_DEPTH
    wanted = math.ceil(max(1, signals.num_ready) * min(ratio, config.max_scale_up_ratio) - 1e-9)
    target = min(config.max_replicas, wanted)
    if target > serving:
        stepped_up = replace(no_calm, capacity_changed_s=now_s)
        return _up(target - serving, serving, signals, signal, f"pressure {ratio:.2f}x; {why}", stepped_up)
    code = Reason.AT_MAX if target >= config.max_replicas else Reason.STARTING
    reason = f"pressure {ratio:.2f}x, {serving} routed; {why}"
    return Decision(serving, Direction.HOLD, code, reason, state=no_calm)


def _calm(
    signals: VersionSignals, state: ScaleState, config: AutoscaleConfig, now_s: float, why: str
) -> Decision:
    """No pressure: hold in the band; when calm, one replica down once the cooldown allows."""
    serving = signals.num_ready + signals.num_starting
    if not is_calm(signals, config):
        reason = f"within targets; {why}"
        return Decision(
            serving, Direction.HOLD, Reason.STEADY, reason, state=replace(state, calm_since_s=None)
        )
    calm_since_s = state.calm_since_s if state.calm_since_s is not None else now_s
    waited_s = now_s - calm_since_s
    if state.last_scale_down_s is not None:
        waited_s = min(waited_s, now_s - state.last_scale_down_s)
    if waited_s < config.scale_down_cooldown_s:
        wait = f"{config.scale_down_cooldown_s - waited_s:.0f} s of cooldown left"
    elif serving <= config.min_replicas or signals.num_ready == 0:
        wait = f"at the minimum {config.min_replicas}"
    elif signals.num_starting or signals.num_draining:
        wait = "one step at a time: waiting for the replicas starting or draining"
    else:
        reason = f"calm for {now_s - calm_since_s:.0f} s; {why}"
        after = replace(state, calm_since_s=now_s, last_scale_down_s=now_s)
        return _down(serving, signals, config, Reason.CALM, reason, after)
    calm = replace(state, calm_since_s=calm_since_s)
    return Decision(serving, Direction.HOLD, Reason.COOLDOWN, f"calm; {wait}; {why}", state=calm)


def _up(
    num: int, serving: int, signals: VersionSignals, code: Reason, reason: str, state: ScaleState
) -> Decision:
    promote = min(num, signals.num_warm_ready)
    return Decision(
        serving + num,
        Direction.UP,
        code,
        f"up {serving} -> {serving + num} ({promote} from the warm pool, {num - promote} cold): {reason}",
        num_promote=promote,
        num_cold_start=num - promote,
        state=state,
    )


def _down(
    serving: int,
    signals: VersionSignals,
    config: AutoscaleConfig,
    code: Reason,
    reason: str,
    state: ScaleState,
) -> Decision:
    warm_short = signals.num_warm_ready + signals.num_warm_starting < config.warm_pool_replicas
    how = "into the warm pool" if warm_short else "draining one"
    return Decision(
        serving - 1,
        Direction.DOWN,
        code,
        f"down {serving} -> {serving - 1} ({how}): {reason}",
        num_drain=0 if warm_short else 1,
        num_demote=1 if warm_short else 0,
        state=state,
    )


def _with_warm_pool(decision: Decision, signals: VersionSignals, config: AutoscaleConfig) -> Decision:
    """Refill the warm pool after the promotions (a demotion counts), or retire its excess."""
    num_warm = signals.num_warm_ready - decision.num_promote + signals.num_warm_starting + decision.num_demote
    size = config.warm_pool_replicas
    if num_warm < size:
        refill = size - num_warm
        reason = f"{decision.reason}; warm pool {num_warm} of {size}: starting {refill}"
        return replace(decision, num_warm_start=refill, reason=reason)
    excess = min(num_warm - size, signals.num_warm_ready - decision.num_promote)
    if excess > 0:
        reason = f"{decision.reason}; warm pool {num_warm} of {size}: retiring {excess}"
        return replace(decision, num_warm_retire=excess, reason=reason)
    return decision
