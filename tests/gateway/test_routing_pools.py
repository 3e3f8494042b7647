"""Pools by workload shape, without real replicas: the routing table carries each routable replica's pool
and never routes a warm one; ``choose_pool`` sends a prompt by its length and falls back to the other pool
when its own has no replica in rotation; ``Router.for_prompt`` queues it on that pool's scheduler and
counts each fallback; ``ReplicaPools`` keeps one scheduler per pool in step with the table (over fake
engine clients: the real-replica test is test_long_prompt_pool.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest
from fakes import ScriptedFakeEngine

from gateway.errors import OpenAIError
from gateway.metrics import GatewayMetrics
from gateway.routing.pools import ReplicaPools
from gateway.routing.router import Router, Target
from gateway.routing.table import PoolChoice, ReplicaTarget, RoutingTable, choose_pool
from gateway.scheduling.scheduler import ModelScheduler
from replicas.verify import Verification
from sluice.domain import RequestClass
from sluice.engine_client import EngineClient, ReplicaStats
from sluice.policy.fair_queue import WaitingRequest
from sluice.settings import Settings
from sluice.stores.registry.base import (
    Model,
    ModelVersion,
    RegistrySnapshot,
    Replica,
    ReplicaPool,
    ReplicaState,
    Route,
    RouteEntry,
    VersionState,
)
from sluice.text import TextCodec

NOW = datetime(2026, 12, 1, tzinfo=UTC)
DIGEST = "sha256:" + "1" * 64
GENERAL, LONG, WARM = ReplicaPool.GENERAL, ReplicaPool.LONG_PROMPT, ReplicaPool.WARM


def _replica(replica_id: str, pool: ReplicaPool, state: ReplicaState = ReplicaState.READY) -> Replica:
    return Replica(
        replica_id, f"{replica_id}:8001", "m", "1", state, "", NOW, NOW, NOW, metrics_url="", pool=pool
    )


def _table(*replicas: Replica) -> RoutingTable:
    version = ModelVersion("m", "1", "file:///ckpt/1", DIGEST, {}, VersionState.SERVING, NOW, NOW)
    snapshot = RegistrySnapshot(
        3, (Model("m", "", NOW),), (version,), replicas, (Route("m", (RouteEntry("1", 10_000),)),)
    )
    return RoutingTable.from_snapshot(snapshot)


def test_the_table_carries_each_replicas_pool_and_never_routes_a_warm_one() -> None:
    table = _table(
        _replica("g", GENERAL),
        _replica("l", LONG),
        _replica("w", WARM),
        _replica("l-failed", LONG, ReplicaState.FAILED),
    )
    version = table.models["m"].versions["1"]
    assert {r.replica_id: r.pool for r in version.replicas} == {"g": GENERAL, "l": LONG}
    assert version.pools() == {GENERAL, LONG} and set(table.replicas()) == {"g", "l"}
    # A version whose only ready replica is warm has none to route to.
    assert _table(_replica("w", WARM)).choose("m", "acme", "c") is None
    # Promoted (its pool now general): routable, and a changed pool is a changed target (drained and
    # admitted again into the other pool's queue by gateway.routing.pools).
    promoted = _table(_replica("w", GENERAL)).replicas()["w"]
    assert promoted.pool is GENERAL and promoted != dataclasses.replace(promoted, pool=LONG)


@pytest.mark.parametrize(
    ("num_prompt_tokens", "threshold", "in_rotation", "expected"),
    [
        (5_000, None, {GENERAL, LONG}, PoolChoice(GENERAL, GENERAL)),  # off: every prompt is short
        (699, 700, {GENERAL, LONG}, PoolChoice(GENERAL, GENERAL)),
        (700, 700, {GENERAL, LONG}, PoolChoice(LONG, LONG)),  # "at least" the threshold
        (700, 700, {GENERAL}, PoolChoice(GENERAL, LONG)),  # no long-prompt replica: general takes it
        (10, 700, {LONG}, PoolChoice(LONG, GENERAL)),  # no general replica: degraded, the long pool
        (10, None, {LONG}, PoolChoice(LONG, GENERAL)),
        (10, 700, set(), None),
    ],
)
def test_a_prompt_goes_to_its_pool_by_length_or_falls_back(
    num_prompt_tokens: int, threshold: int | None, in_rotation: set[ReplicaPool], expected: PoolChoice | None
) -> None:
    choice = choose_pool(num_prompt_tokens, threshold, in_rotation)
    assert choice == expected
    assert choice is None or choice.is_fallback == (choice.pool != choice.wanted)


def _router(tmp_path: Path, threshold: int | None) -> tuple[Router, GatewayMetrics]:
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path, long_prompt_min_tokens=threshold)
    metrics = GatewayMetrics()
    return Router(ReplicaPools(settings, metrics, _no_client, _no_verify), metrics), metrics


def _target(pools: dict[ReplicaPool, str]) -> Target:
    """A target whose pools' schedulers are stand-ins named by strings (never called here)."""
    schedulers = {pool: cast(ModelScheduler, name) for pool, name in pools.items()}
    first = GENERAL if GENERAL in schedulers else LONG
    return Target("m", "1", schedulers[first], cast(TextCodec, None), True, first, schedulers)


def _fallbacks(metrics: GatewayMetrics, wanted: ReplicaPool, pool: ReplicaPool) -> float:
    value = metrics.registry.get_sample_value(
        "sluice_gateway_pool_fallbacks_total",
        {"model": "m", "version": "1", "wanted_pool": str(wanted), "pool": str(pool)},
    )
    return value or 0.0


def test_for_prompt_queues_on_the_pools_scheduler_and_counts_fallbacks(tmp_path: Path) -> None:
    router, metrics = _router(tmp_path, threshold=700)
    both = _target({GENERAL: "general-queue", LONG: "long-queue"})
    long_ = router.for_prompt(both, 900)
    assert (long_.pool, long_.scheduler, long_.version) == (LONG, "long-queue", "1")
    short = router.for_prompt(both, 20)
    assert (short.pool, short.scheduler) == (GENERAL, "general-queue")
    assert _fallbacks(metrics, LONG, GENERAL) == _fallbacks(metrics, GENERAL, LONG) == 0

    general_only = _target({GENERAL: "general-queue"})
    assert router.for_prompt(general_only, 900).scheduler == "general-queue"
    assert router.for_prompt(general_only, 900).scheduler == "general-queue"
    assert _fallbacks(metrics, LONG, GENERAL) == 2
    long_only = _target({LONG: "long-queue"})
    assert router.for_prompt(long_only, 20).pool is LONG
    assert _fallbacks(metrics, GENERAL, LONG) == 1
    # Static routing (no pools known): the target as it is.
    static = Target("m", "1", cast(ModelScheduler, "static"), cast(TextCodec, None), True)
    assert router.for_prompt(static, 900) is static


def test_without_a_threshold_long_prompts_stay_general(tmp_path: Path) -> None:
    router, metrics = _router(tmp_path, threshold=None)
    both = _target({GENERAL: "general-queue", LONG: "long-queue"})
    assert router.for_prompt(both, 100_000).pool is GENERAL
    assert _fallbacks(metrics, LONG, GENERAL) == 0


def _no_client(target: ReplicaTarget) -> EngineClient:
    raise AssertionError("no replica is contacted here")


async def _no_verify(target: ReplicaTarget) -> Verification:
    raise AssertionError("no replica is contacted here")


def _fake_client(target: ReplicaTarget) -> EngineClient:
    engine = ScriptedFakeEngine(token_id=5, interval_s=0.001)
    engine.replica = target.endpoint
    return engine


async def _verified(target: ReplicaTarget) -> Verification:
    return Verification(True, "")


def test_each_pool_has_its_scheduler_and_a_pool_change_moves_the_replica(tmp_path: Path) -> None:
    async def run() -> None:
        settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
        pools = ReplicaPools(settings, GatewayMetrics(), _fake_client, _verified)
        try:
            await pools.apply(_table(_replica("g", GENERAL), _replica("l", LONG), _replica("w", WARM)))
            in_rotation = pools.schedulers_of("m", "1")
            assert set(in_rotation) == {GENERAL, LONG} and pools.num_in_rotation == 2
            assert in_rotation[GENERAL].replica_ids != in_rotation[LONG].replica_ids
            report = pools.report()["replicas"]
            assert isinstance(report, dict)
            assert {rid: (r["pool"], r["in_rotation"]) for rid, r in report.items()} == {
                "g": ("general", True),
                "l": ("long-prompt", True),
            }
            long_scheduler = in_rotation[LONG]
            # The long-prompt replica fails: its pool has no replica in rotation, its scheduler stays (what
            # waits there still expires by its deadline).
            await pools.apply(_table(_replica("g", GENERAL), _replica("l", LONG, ReplicaState.FAILED)))
            assert set(pools.schedulers_of("m", "1")) == {GENERAL}
            assert pools.scheduler("m", "1", LONG) is long_scheduler
            # Moved to the general pool: it leaves the long pool's queue and joins the general one.
            await pools.apply(_table(_replica("g", GENERAL), _replica("l", GENERAL)))
            assert len(pools.schedulers_of("m", "1")[GENERAL].replica_ids) == 2
            assert long_scheduler.replica_ids == []
        finally:
            await pools.close()

    asyncio.run(run())


def test_what_waits_for_a_version_that_leaves_routing_is_refused_to_retry(tmp_path: Path) -> None:
    """A request queued for a version (its replica full) when a rollback drains that version would wait
    out its deadline: no replica of it takes anything new. It is refused at once with a retryable 503."""

    def full_client(target: ReplicaTarget) -> EngineClient:
        engine = ScriptedFakeEngine(token_id=5, interval_s=0.001)
        engine.replica = target.endpoint
        engine.stats = ReplicaStats(
            num_kv_tokens_total=1000, num_kv_tokens_free=0, num_waiting=0, num_running=4
        )
        return engine

    async def run() -> None:
        settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
        pools = ReplicaPools(settings, GatewayMetrics(), full_client, _verified)
        try:
            await pools.apply(_table(_replica("g", GENERAL)))
            scheduler = pools.scheduler("m", "1")
            assert scheduler is not None
            now = time.monotonic()
            queued = WaitingRequest("r1", "acme", 1.0, RequestClass.INTERACTIVE, 8, 8, now, now + 60)
            waiting = asyncio.create_task(scheduler.wait_for_dispatch(queued))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # no free KV: it waits in the queue
            await pools.apply(_table(_replica("g", GENERAL, ReplicaState.DRAINING)))  # the version drains
            with pytest.raises(OpenAIError) as refused:
                await asyncio.wait_for(waiting, 1.0)
            assert refused.value.status_code == 503 and refused.value.code == "model_unavailable"
        finally:
            await pools.close()

    asyncio.run(run())
