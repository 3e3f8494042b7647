"""The autoscaler's loop (control_plane/autoscaler/loop.py) over a real SQLite registry, with a fake signal
source (what the gateways' metrics would say) and a fake actuator (a platform that registers the replicas it
starts): promotion from the warm pool, cold and warm starts, the cooldown then one drain of the newest
replica, a round without gateway metrics, the decision's log line and metrics, and warm replicas claimed
when a platform's pods register themselves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from control_plane.autoscaler.actuator import Actuator
from control_plane.autoscaler.loop import Autoscaler, count_replicas
from control_plane.autoscaler.metrics import AutoscalerMetrics
from control_plane.autoscaler.signals import VersionKey, WindowSignals
from sluice.policy.autoscale import AutoscaleConfig, Direction, Reason
from sluice.stores.registry.base import Registry, Replica, ReplicaPool, ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry

MODEL, VERSION = "sluice-tiny", "1"
KEY = (MODEL, VERSION)
DIGEST = "sha256:" + "1" * 64
ACTOR = "test"
CONFIG = AutoscaleConfig(
    min_replicas=1, max_replicas=6, warm_pool_replicas=1, ttft_slo_s=0.5, scale_down_cooldown_s=60.0
)
CALM = WindowSignals(queue_depth=0, queue_wait_p95_s=0.01, ttft_p95_s=0.1)


class FakeSignalSource:
    """What the gateways' metrics would say: set ``signals`` (None: no gateway answered)."""

    def __init__(self) -> None:
        self.signals: dict[VersionKey, WindowSignals] | None = {KEY: CALM}

    async def read(self) -> dict[VersionKey, WindowSignals] | None:
        return self.signals

    async def close(self) -> None:
        pass


class FakeActuator(Actuator):
    """A platform in memory: ``start`` registers replicas starting in the pool (or, with
    ``registers_later``, registers nothing: its pods would); ``retire`` sets the replica draining."""

    name = "fake"

    def __init__(self, registry: Registry, *, registers_later: bool = False) -> None:
        self.registry = registry
        self.registers_later = registers_later
        self.started: list[tuple[str, int, ReplicaPool]] = []
        self.retired: list[str] = []
        self._num = 0

    async def start(self, model: str, version: str, count: int, *, pool: ReplicaPool) -> list[str]:
        self.started.append((version, count, pool))
        if self.registers_later:
            return []
        ids = []
        for _ in range(count):
            self._num += 1
            ids.append(await register(self.registry, f"new-{self._num}", ReplicaState.STARTING, pool))
        return ids

    async def retire(self, replica: Replica) -> None:
        self.retired.append(replica.replica_id)
        await self.registry.record_health(replica.replica_id, ReplicaState.DRAINING, actor=ACTOR)

    async def close(self) -> None:
        pass


async def register(registry: Registry, replica_id: str, state: ReplicaState, pool: ReplicaPool) -> str:
    await registry.register_replica(
        replica_id, endpoint=f"{replica_id}:8001", model=MODEL, version=VERSION, actor=ACTOR, state=state,
        pool=pool,
    )  # fmt: skip
    return replica_id


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SqliteRegistry]:
    registry = SqliteRegistry(tmp_path / "sluice.db")

    async def setup() -> None:
        await registry.open()
        await registry.create_model(MODEL, actor=ACTOR)
        await registry.add_version(
            MODEL, VERSION, artifact_uri="file:///x", weights_digest=DIGEST, build_config={}, actor=ACTOR
        )
        await registry.set_version_state(MODEL, VERSION, VersionState.WARMING, actor=ACTOR)
        await registry.set_version_state(MODEL, VERSION, VersionState.SERVING, actor=ACTOR)
        await registry.set_route(MODEL, {VERSION: 10_000}, actor=ACTOR)
        await register(registry, "a-ready", ReplicaState.READY, ReplicaPool.GENERAL)
        await register(registry, "b-ready", ReplicaState.READY, ReplicaPool.GENERAL)
        await register(registry, "w-warm", ReplicaState.READY, ReplicaPool.WARM)

    asyncio.run(setup())
    yield registry
    asyncio.run(registry.close())


def build(
    registry: Registry, actuator: Actuator
) -> tuple[Autoscaler, FakeSignalSource, Clock, CollectorRegistry]:
    source, clock, metrics = FakeSignalSource(), Clock(), CollectorRegistry()
    scaler = Autoscaler(
        registry, source, actuator, CONFIG, AutoscalerMetrics(metrics), interval_s=1.0, clock=clock
    )
    return scaler, source, clock, metrics


async def pools(registry: Registry) -> dict[str, tuple[ReplicaState, ReplicaPool]]:
    return {r.replica_id: (r.state, r.pool) for r in await registry.list_replicas(MODEL)}


def test_pressure_promotes_the_warm_replica_then_cold_starts_and_refills_the_pool(
    registry: SqliteRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    actuator = FakeActuator(registry)
    scaler, source, _, metrics = build(registry, actuator)
    source.signals = {KEY: replace(CALM, ttft_p95_s=1.0)}  # 2x the SLO: 2 ready -> 4

    async def run() -> None:
        with caplog.at_level(logging.INFO, logger="sluice.control_plane.autoscaler"):
            decision = (await scaler.run_once())[KEY]
        assert decision.direction is Direction.UP and decision.reason_code is Reason.TTFT
        assert decision.desired_replicas == 4
        after = await pools(registry)
        assert after["w-warm"] == (ReplicaState.READY, ReplicaPool.GENERAL)  # promoted: one registry write
        assert actuator.started == [(VERSION, 1, ReplicaPool.GENERAL), (VERSION, 1, ReplicaPool.WARM)]
        assert after["new-1"] == (ReplicaState.STARTING, ReplicaPool.GENERAL)
        assert after["new-2"] == (ReplicaState.STARTING, ReplicaPool.WARM)

    asyncio.run(run())
    assert any("autoscaler sluice-tiny/1: up [ttft_over_slo] up 2 -> 4" in m for m in caplog.messages)
    labels = {"model": MODEL, "version": VERSION}
    assert metrics.get_sample_value("sluice_control_plane_autoscaler_desired_replicas", labels) == 4
    up = {**labels, "direction": "up", "reason": "ttft_over_slo"}
    assert metrics.get_sample_value("sluice_control_plane_autoscaler_decisions_total", up) == 1
    assert metrics.get_sample_value("sluice_control_plane_autoscaler_pressure", labels) == 2.0


def test_calm_drains_one_newest_replica_only_after_the_cooldown(registry: SqliteRegistry) -> None:
    actuator = FakeActuator(registry)
    scaler, _, clock, metrics = build(registry, actuator)

    async def run() -> None:
        for _ in range(6):  # 50 s of calm: within the 60 s cooldown
            decision = (await scaler.run_once())[KEY]
            assert decision.direction is Direction.HOLD and decision.reason_code is Reason.COOLDOWN
            clock.now_s += 10.0
        assert actuator.retired == []
        decision = (await scaler.run_once())[KEY]  # 60 s
        assert decision.direction is Direction.DOWN and decision.num_drain == 1
        assert actuator.retired == ["b-ready"]  # the newest routed replica; the warm pool is full
        clock.now_s += 10.0
        held = (await scaler.run_once())[KEY]  # one at a time: b is draining, and a new cooldown runs
        assert held.direction is Direction.HOLD and actuator.retired == ["b-ready"]

    asyncio.run(run())
    hold = {"model": MODEL, "version": VERSION, "direction": "hold", "reason": "calm_in_cooldown"}
    assert metrics.get_sample_value("sluice_control_plane_autoscaler_decisions_total", hold) == 7


def test_a_round_without_gateway_metrics_decides_nothing(
    registry: SqliteRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    actuator = FakeActuator(registry)
    scaler, source, clock, _ = build(registry, actuator)
    source.signals = None

    async def run() -> None:
        before = await pools(registry)
        for _ in range(10):
            assert await scaler.run_once() == {}
            clock.now_s += 100.0  # far past the cooldown: unknown is not calm
        assert await pools(registry) == before and actuator.retired == actuator.started == []

    with caplog.at_level(logging.INFO, logger="sluice.control_plane.autoscaler"):
        asyncio.run(run())
    assert sum("no gateway metrics could be read" in m for m in caplog.messages) == 1  # once per outage


def test_warm_replicas_a_platform_registers_later_are_claimed_for_the_pool(registry: SqliteRegistry) -> None:
    actuator = FakeActuator(registry, registers_later=True)
    scaler, _, _, _ = build(registry, actuator)

    async def run() -> None:
        await registry.remove_replica("w-warm", actor=ACTOR)  # the pool is empty
        decision = (await scaler.run_once())[KEY]
        assert decision.num_warm_start == 1 and actuator.started == [(VERSION, 1, ReplicaPool.WARM)]
        await register(registry, "pod-x", ReplicaState.STARTING, ReplicaPool.GENERAL)  # the pod registers
        decision = (await scaler.run_once())[KEY]
        assert (await pools(registry))["pod-x"] == (ReplicaState.STARTING, ReplicaPool.WARM)
        assert decision.num_warm_start == 0  # counted as the warm pool now, nothing more started
        await register(registry, "pod-y", ReplicaState.STARTING, ReplicaPool.GENERAL)  # owed none
        await scaler.run_once()
        assert (await pools(registry))["pod-y"] == (ReplicaState.STARTING, ReplicaPool.GENERAL)

    asyncio.run(run())


def test_counts_leave_out_failed_and_long_prompt_replicas(registry: SqliteRegistry) -> None:
    async def run() -> None:
        await register(registry, "f-failed", ReplicaState.FAILED, ReplicaPool.GENERAL)
        await register(registry, "l-long", ReplicaState.READY, ReplicaPool.LONG_PROMPT)
        counted = count_replicas(await registry.snapshot(), MODEL, VERSION)
        assert [r.replica_id for r in counted.ready] == ["a-ready", "b-ready"]
        assert [r.replica_id for r in counted.warm_ready] == ["w-warm"]
        assert counted.starting == counted.draining == counted.warm_starting == []

    asyncio.run(run())
