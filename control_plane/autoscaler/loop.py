"""The autoscaler's loop in the control plane: every ``interval_s``, for each model version the registry's
routes give traffic, it reads the signals (the gateways' metrics), counts the version's replicas by state
and pool, asks the pure policy (``sluice.policy.autoscale.decide``) and carries the decision out:

- promote: a warm replica's pool becomes general (one registry write; gateways route to it from there);
- cold start / warm start: ``Actuator.start`` into the general or the warm pool;
- drain (scale-down): the newest ready routed replica is retired through the actuator (drained first);
- demote: that replica's pool becomes warm instead (it stops taking work, stays loaded);
- warm retire: warm replicas beyond the pool's size are retired.

Each decision is one log line (``autoscaler <model>/<version>: <direction> [<reason>] <sentence>``; a hold
that repeats the previous decision's reason goes to DEBUG) and counted in the metrics. A round in which no
gateway answered decides nothing (the signals are unknown, and unknown is not calm). An action that fails
is logged and counted; the next round decides again from what the registry then says. The policy's
memory (``ScaleState``) per version is this loop's own state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from control_plane.autoscaler.actuator import Actuator
from control_plane.autoscaler.metrics import AutoscalerMetrics
from control_plane.autoscaler.signals import VersionKey, WindowSignals
from sluice.policy.autoscale import (
    AutoscaleConfig,
    Decision,
    Direction,
    ScaleState,
    VersionSignals,
    decide,
    pressure,
)
from sluice.stores.registry.base import Registry, RegistrySnapshot, Replica, ReplicaPool, ReplicaState

log = logging.getLogger("sluice.control_plane.autoscaler")

ACTOR = "control-plane/autoscaler"


class SignalSource(Protocol):
    async def read(self) -> dict[VersionKey, WindowSignals] | None:
        """Signals per version since the last read; None when nothing could be read."""
        ...

    async def close(self) -> None: ...


@dataclass
class VersionReplicas:
    """A version's replicas as the policy counts them (the long-prompt pool is not scaled here)."""

    ready: list[Replica] = field(default_factory=list)  # general pool
    starting: list[Replica] = field(default_factory=list)  # general pool
    draining: list[Replica] = field(default_factory=list)  # any pool
    warm_ready: list[Replica] = field(default_factory=list)
    warm_starting: list[Replica] = field(default_factory=list)


def routed_versions(snapshot: RegistrySnapshot) -> list[VersionKey]:
    """The versions a route gives a positive weight: the ones traffic can reach."""
    return sorted((r.model, e.version) for r in snapshot.routes for e in r.entries if e.weight_bp > 0)


def count_replicas(snapshot: RegistrySnapshot, model: str, version: str) -> VersionReplicas:
    counted = VersionReplicas()
    for replica in sorted(
        snapshot.replicas_of(model, version), key=lambda r: (r.registered_at, r.replica_id)
    ):
        if replica.state == ReplicaState.DRAINING:
            counted.draining.append(replica)
        elif replica.pool == ReplicaPool.GENERAL and replica.state == ReplicaState.READY:
            counted.ready.append(replica)
        elif replica.pool == ReplicaPool.GENERAL and replica.state == ReplicaState.STARTING:
            counted.starting.append(replica)
        elif replica.pool == ReplicaPool.WARM and replica.state == ReplicaState.READY:
            counted.warm_ready.append(replica)
        elif replica.pool == ReplicaPool.WARM and replica.state == ReplicaState.STARTING:
            counted.warm_starting.append(replica)
    return counted


def version_signals(window: WindowSignals, replicas: VersionReplicas) -> VersionSignals:
    return VersionSignals(
        queue_depth=window.queue_depth,
        queue_wait_p95_s=window.queue_wait_p95_s,
        ttft_p95_s=window.ttft_p95_s,
        num_ready=len(replicas.ready),
        num_starting=len(replicas.starting),
        num_draining=len(replicas.draining),
        num_warm_ready=len(replicas.warm_ready),
        num_warm_starting=len(replicas.warm_starting),
    )


class Autoscaler:
    def __init__(
        self,
        registry: Registry,
        source: SignalSource,
        actuator: Actuator,
        config: AutoscaleConfig,
        metrics: AutoscalerMetrics,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._source = source
        self.actuator = actuator
        self.config = config
        self._metrics = metrics
        self._interval_s = interval_s
        self._clock = clock
        self._states: dict[VersionKey, ScaleState] = {}
        self._last: dict[VersionKey, Decision] = {}
        # Warm replicas asked of a platform whose pods register themselves: the next new general
        # replicas of that version to appear are moved into the warm pool.
        self._owed_warm: dict[VersionKey, int] = {}
        self._seen: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._blind = False  # no gateway answered the last round (logged once per outage)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="autoscaler")
        log.info(
            "autoscaler on: every %.0f s, actuator %s, replicas %d..%d, warm pool %d, TTFT SLO %.0f ms, "
            "scale-down cooldown %.0f s",
            self._interval_s, self.actuator.name, self.config.min_replicas, self.config.max_replicas,
            self.config.warm_pool_replicas, self.config.ttft_slo_s * 1000, self.config.scale_down_cooldown_s,
        )  # fmt: skip

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.actuator.close()
        await self._source.close()

    async def _run(self) -> None:
        while True:
            started_s = self._clock()
            try:
                await self.run_once()
            except Exception:  # a registry outage, a bug: the next round tries again
                log.exception("autoscaler round failed")
            await asyncio.sleep(max(0.0, self._interval_s - (self._clock() - started_s)))

    async def run_once(self) -> dict[VersionKey, Decision]:
        """One round (see the module docstring); the decisions taken, by version."""
        signals = await self._source.read()
        if signals is None:
            if not self._blind:
                log.warning("autoscaler: no gateway metrics could be read: deciding nothing until they can")
            self._blind = True
            return {}
        self._blind = False
        snapshot = await self._registry.snapshot()
        self._seen &= {r.replica_id for r in snapshot.replicas}  # forget the replicas that left
        now_s = self._clock()
        decisions = {}
        keys = routed_versions(snapshot)
        for key in keys:
            decisions[key] = await self._scale(key, snapshot, signals.get(key, WindowSignals()), now_s)
        for gone in set(self._states) - set(keys):  # no longer routed: forget it
            self._states.pop(gone, None)
            self._last.pop(gone, None)
        return decisions

    async def _scale(
        self, key: VersionKey, snapshot: RegistrySnapshot, window: WindowSignals, now_s: float
    ) -> Decision:
        model, version = key
        if await self._claim_warm(key, snapshot):
            snapshot = await self._registry.snapshot()
        replicas = count_replicas(snapshot, model, version)
        signals = version_signals(window, replicas)
        decision = decide(signals, self._states.get(key, ScaleState()), self.config, now_s)
        self._states[key] = decision.state
        self._log(key, decision)
        num_warm = len(replicas.warm_ready) + len(replicas.warm_starting)
        self._metrics.observe(model, version, decision, num_warm, pressure(signals, self.config)[0])
        await self._act(key, decision, replicas)
        return decision

    def _log(self, key: VersionKey, decision: Decision) -> None:
        last = self._last.get(key)
        self._last[key] = decision
        repeated = (
            decision.direction is Direction.HOLD
            and last is not None
            and (last.direction, last.reason_code) == (decision.direction, decision.reason_code)
        )
        log.log(
            logging.DEBUG if repeated else logging.INFO,
            "autoscaler %s/%s: %s [%s] %s",
            *key,
            decision.direction.value,
            decision.reason_code.value,
            decision.reason,
        )

    async def _act(self, key: VersionKey, decision: Decision, replicas: VersionReplicas) -> None:
        for replica in replicas.warm_ready[: decision.num_promote]:
            await self._attempt(key, "promote", self._set_pool(replica, ReplicaPool.GENERAL))
        if decision.num_cold_start:
            await self._attempt(key, "start", self._start(key, decision.num_cold_start, ReplicaPool.GENERAL))
        if decision.num_warm_start:
            await self._attempt(
                key, "warm_start", self._start(key, decision.num_warm_start, ReplicaPool.WARM)
            )
        victim = replicas.ready[-1] if replicas.ready else None  # the newest routed replica
        if decision.num_drain and victim is not None:
            await self._attempt(key, "drain", self.actuator.retire(victim))
        if decision.num_demote and victim is not None:
            await self._attempt(key, "demote", self._set_pool(victim, ReplicaPool.WARM))
        if decision.num_warm_retire:
            for replica in replicas.warm_ready[len(replicas.warm_ready) - decision.num_warm_retire :]:
                await self._attempt(key, "warm_retire", self.actuator.retire(replica))

    async def _attempt(self, key: VersionKey, action: str, work: Awaitable[object]) -> None:
        try:
            await work
        except Exception as exc:
            self._metrics.action_failures.labels(*key, action).inc()
            log.warning("autoscaler %s/%s: %s failed: %s", *key, action, exc)

    async def _start(self, key: VersionKey, count: int, pool: ReplicaPool) -> None:
        started = await self.actuator.start(*key, count, pool=pool)
        self._seen.update(started)
        if pool == ReplicaPool.WARM and len(started) < count:
            self._owed_warm[key] = self._owed_warm.get(key, 0) + count - len(started)

    async def _set_pool(self, replica: Replica, pool: ReplicaPool) -> None:
        await self._registry.set_replica_pool(replica.replica_id, pool, actor=ACTOR)
        log.info("autoscaler: replica %s moved to the %s pool", replica.replica_id, pool.value)

    async def _claim_warm(self, key: VersionKey, snapshot: RegistrySnapshot) -> bool:
        """New general replicas of a version owed warm ones go to the warm pool (before they take work);
        True when one moved."""
        moved = False
        new = [r for r in snapshot.replicas_of(*key) if r.replica_id not in self._seen]
        self._seen.update(r.replica_id for r in new)
        for replica in new:
            owed = self._owed_warm.get(key, 0)
            if owed and replica.pool == ReplicaPool.GENERAL and replica.state == ReplicaState.STARTING:
                self._owed_warm[key] = owed - 1
                await self._attempt(key, "warm_claim", self._set_pool(replica, ReplicaPool.WARM))
                moved = True
        return moved
