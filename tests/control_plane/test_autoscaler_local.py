"""The autoscaler's loop acting through the local actuator on real tritonservers (a real SQLite registry;
the signals from a fake source, as the gateways' metrics would say them): below the minimum it starts a
routed replica and fills the warm pool, each one verified and ready; on pressure the warm replica is
promoted (its pool becomes general, no restart); once calm it drains the newest routed replica and stops
its process, the other keeps serving. Two tritonservers, ~30-60 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from proc_table import processes_mentioning
from prometheus_client import CollectorRegistry

from control_plane.autoscaler.local import LocalActuator
from control_plane.autoscaler.loop import Autoscaler
from control_plane.autoscaler.metrics import AutoscalerMetrics
from control_plane.autoscaler.signals import VersionKey, WindowSignals
from replicas.health import ReplicaStates
from replicas.local_replicas import LocalReplicas
from sluice.policy.autoscale import AutoscaleConfig, Direction, Reason
from sluice.stores.registry.base import NotFound, Registry, ReplicaPool, ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

MODEL, VERSION = "sluice-tiny", "1"
KEY = (MODEL, VERSION)
CALM = WindowSignals(queue_depth=0, queue_wait_p95_s=0.01, ttft_p95_s=0.1)


class FakeSignalSource:
    def __init__(self) -> None:
        self.signals: dict[VersionKey, WindowSignals] = {KEY: CALM}

    async def read(self) -> dict[VersionKey, WindowSignals] | None:
        return self.signals

    async def close(self) -> None:
        pass


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.3)


async def states(registry: Registry) -> dict[str, tuple[ReplicaState, ReplicaPool]]:
    return {r.replica_id: (r.state, r.pool) for r in await registry.list_replicas(MODEL)}


def test_start_warm_promote_and_drain_real_replicas(tmp_path: Path, dev_checkpoint: Path) -> None:
    async def run() -> None:
        registry = SqliteRegistry(tmp_path / "sluice.db")
        await registry.open()
        await registry.create_model(MODEL, actor="test")
        digest = weights_digest(dev_checkpoint)
        await registry.add_version(
            MODEL, VERSION, artifact_uri=dev_checkpoint.as_uri(), weights_digest=digest, build_config={},
            actor="test",
        )  # fmt: skip
        await registry.set_version_state(MODEL, VERSION, VersionState.WARMING, actor="test")
        await registry.set_version_state(MODEL, VERSION, VersionState.SERVING, actor="test")
        await registry.set_route(MODEL, {VERSION: 10_000}, actor="test")
        local = LocalReplicas(ReplicaStates(registry), tmp_path / "state")
        await local.open()
        source, now_s = FakeSignalSource(), [0.0]
        config = AutoscaleConfig(
            min_replicas=1, max_replicas=2, warm_pool_replicas=1, scale_down_cooldown_s=0.0
        )
        scaler = Autoscaler(
            registry, source, LocalActuator(local, drain_timeout_s=10.0), config,
            AutoscalerMetrics(CollectorRegistry()), interval_s=1.0, clock=lambda: now_s[0],
        )  # fmt: skip
        try:
            await scenario(registry, scaler, source, now_s, tmp_path / "state" / "replicas")
        finally:
            await scaler.close()
            await local.close()
            await registry.close()

    asyncio.run(run())


async def scenario(
    registry: Registry, scaler: Autoscaler, source: FakeSignalSource, now_s: list[float], folders: Path
) -> None:
    first = (await scaler.run_once())[KEY]  # no replica: below the minimum
    assert first.reason_code is Reason.BELOW_MIN and (first.num_cold_start, first.num_warm_start) == (1, 1)
    started = await states(registry)
    assert sorted(pool for _, pool in started.values()) == [ReplicaPool.GENERAL, ReplicaPool.WARM]
    [routed_id] = [r for r, (_, pool) in started.items() if pool == ReplicaPool.GENERAL]
    [warm_id] = [r for r, (_, pool) in started.items() if pool == ReplicaPool.WARM]

    async def both_ready() -> bool:
        found = await states(registry)
        assert all(state != ReplicaState.FAILED for state, _ in found.values()), found
        return all(state == ReplicaState.READY for state, _ in found.values())

    await until(both_ready)  # loaded and verified by the actuator; the warm one routed nothing
    now_s[0] += 60.0
    settle = (await scaler.run_once())[KEY]  # the replica that turned ready starts a stabilization window
    assert settle.direction is Direction.HOLD and settle.num_warm_start == 0
    # Pressure: the warm replica is promoted by one registry write, no restart; no refill (pool size 0 now).
    scaler.config = replace(scaler.config, warm_pool_replicas=0)
    source.signals = {KEY: replace(CALM, ttft_p95_s=1.0)}
    now_s[0] += 60.0
    up = (await scaler.run_once())[KEY]
    assert up.direction is Direction.UP and up.num_promote == 1 and up.num_cold_start == 0
    assert await states(registry) == {
        routed_id: (ReplicaState.READY, ReplicaPool.GENERAL),
        warm_id: (ReplicaState.READY, ReplicaPool.GENERAL),
    }
    # Calm (cooldown 0): one replica, the newest, is drained, then its process stops and it leaves.
    source.signals = {KEY: CALM}
    now_s[0] += 60.0
    down = (await scaler.run_once())[KEY]
    assert down.direction is Direction.DOWN and down.num_drain == 1

    async def stopped() -> bool:
        try:
            await registry.get_replica(warm_id)
        except NotFound:
            return True
        return False

    await until(stopped, timeout_s=60.0)
    assert processes_mentioning(str(folders / warm_id)) == [] and not (folders / warm_id).exists()
    assert processes_mentioning(str(folders / routed_id)) != []  # the other one still serves
    assert await states(registry) == {routed_id: (ReplicaState.READY, ReplicaPool.GENERAL)}
    held = (await scaler.run_once())[KEY]  # at the minimum now
    assert held.direction is Direction.HOLD and "at the minimum 1" in held.reason
