"""The simulated fleet's autoscaler: the control plane's policy (``sluice.policy.autoscale.decide``, the same
code) on simulated time, and each replica's lifecycle as the actions move it.

Every ``interval_s`` the fleet hands over the queue depth; the window's queue waits and TTFTs (interactive,
observed by the fleet as they happen) give exact p95s (the control plane reads them from histogram buckets
instead). The decision moves replicas between lifecycle states:

- promote: ``warm`` -> ``promoting`` (routable after ``promote_s``: one registry write and the gateways
  seeing it), then ``ready``;
- cold start: a new replica ``cold`` -> ``ready`` after ``cold_start_s`` (weights, engine, verification);
- warm start: a new replica ``warm_loading`` -> ``warm`` after ``cold_start_s``;
- drain: the newest ``ready`` -> ``draining`` (takes nothing new) -> ``stopped`` once it holds nothing;
- demote: the newest ``ready`` -> ``warm`` (takes nothing new, finishes what it holds, stays loaded);
- warm retire: ``warm`` -> ``stopped``.

Only ``ready`` replicas are routable. Every replica not ``stopped`` is paid for (cost per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from sluice.policy.autoscale import AutoscaleConfig, Decision, ScaleState, VersionSignals, decide


class Life(StrEnum):
    COLD = "cold"  # cold start: loading, routed once ready
    WARM_LOADING = "warm_loading"  # loading into the warm pool
    WARM = "warm"  # loaded, verified, unrouted
    PROMOTING = "promoting"  # warm -> routed, within promote_s
    READY = "ready"  # routed
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True)
class SimAutoscale:
    policy: AutoscaleConfig
    interval_s: float = 10.0
    cold_start_s: float = 120.0
    promote_s: float = 5.0


@dataclass(frozen=True)
class ScalingSample:
    """The fleet at one sample, for the plot: routed (ready), warm pool, starting (cold, promoting, warm
    loading), draining; and every replica paid for."""

    t_s: float
    num_routed: int
    num_warm: int
    num_starting: int
    num_draining: int
    num_provisioned: int


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


class FleetScaler:
    """Each replica's lifecycle (by the fleet's replica index) and the policy's memory; owned by the fleet."""

    def __init__(self, config: SimAutoscale, num_ready: int, first_tick_s: float) -> None:
        self.config = config
        self.first_tick_s = first_tick_s
        self._observe_from_s = first_tick_s - config.interval_s  # the first window, like every other
        self.lives = [Life.READY] * num_ready + [Life.WARM] * config.policy.warm_pool_replicas
        self.state = ScaleState()
        self.decisions: list[tuple[float, Decision]] = []
        self.samples: list[ScalingSample] = []
        self._waits_s: list[float] = []
        self._ttfts_s: list[float] = []

    def routable(self, index: int) -> bool:
        return self.lives[index] is Life.READY

    def observe_wait(self, now_s: float, wait_s: float) -> None:
        if now_s >= self._observe_from_s:
            self._waits_s.append(wait_s)

    def observe_ttft(self, now_s: float, ttft_s: float) -> None:
        if now_s >= self._observe_from_s:
            self._ttfts_s.append(ttft_s)

    def _indices(self, life: Life) -> list[int]:
        return [i for i, current in enumerate(self.lives) if current is life]

    def signals(self, queue_depth: int) -> VersionSignals:
        count = {life: 0 for life in Life}
        for life in self.lives:
            count[life] += 1
        return VersionSignals(
            queue_depth=queue_depth,
            queue_wait_p95_s=_p95(self._waits_s),
            ttft_p95_s=_p95(self._ttfts_s),
            num_ready=count[Life.READY],
            num_starting=count[Life.COLD] + count[Life.PROMOTING],
            num_draining=count[Life.DRAINING],
            num_warm_ready=count[Life.WARM],
            num_warm_starting=count[Life.WARM_LOADING],
        )

    def tick(self, now_s: float, queue_depth: int) -> list[tuple[int, float]]:
        """Decide and move the replicas; returns (index, when its transition completes) for each replica
        that started one (indices past the current end are new replicas the fleet must create)."""
        decision = decide(self.signals(queue_depth), self.state, self.config.policy, now_s)
        self.state = decision.state
        self.decisions.append((now_s, decision))
        self._waits_s.clear()
        self._ttfts_s.clear()
        due: list[tuple[int, float]] = []
        warm = self._indices(Life.WARM)
        for i in warm[: decision.num_promote]:
            self.lives[i] = Life.PROMOTING
            due.append((i, now_s + self.config.promote_s))
        starts = ((Life.COLD, decision.num_cold_start), (Life.WARM_LOADING, decision.num_warm_start))
        for life, count in starts:
            for _ in range(count):
                self.lives.append(life)
                due.append((len(self.lives) - 1, now_s + self.config.cold_start_s))
        ready = self._indices(Life.READY)
        if ready and decision.num_drain:
            self.lives[ready[-1]] = Life.DRAINING
        if ready and decision.num_demote:
            self.lives[ready[-1]] = Life.WARM
        still_warm = warm[decision.num_promote :]
        for i in still_warm[len(still_warm) - decision.num_warm_retire :] if decision.num_warm_retire else []:
            self.lives[i] = Life.STOPPED
        return due

    def complete(self, index: int) -> None:
        """A transition's time is up: loaded or promoted."""
        life = self.lives[index]
        if life in (Life.COLD, Life.PROMOTING):
            self.lives[index] = Life.READY
        elif life is Life.WARM_LOADING:
            self.lives[index] = Life.WARM

    def idle(self, index: int) -> None:
        """The replica holds nothing now: a draining one stops."""
        if self.lives[index] is Life.DRAINING:
            self.lives[index] = Life.STOPPED

    def sample(self, now_s: float) -> None:
        count = {life: 0 for life in Life}
        for life in self.lives:
            count[life] += 1
        self.samples.append(
            ScalingSample(
                now_s,
                count[Life.READY],
                count[Life.WARM],
                count[Life.COLD] + count[Life.PROMOTING] + count[Life.WARM_LOADING],
                count[Life.DRAINING],
                len(self.lives) - count[Life.STOPPED],
            )
        )
