"""Prefix affinity in one version's scheduler over two replicas: a tenant's repeated prompt prefix goes
back to the replica it was sent to while that replica is not saturated, even when the other replica is
less loaded; another tenant's same prompt is not steered by it; a saturated replica lets it go."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fakes import ScriptedFakeEngine

from gateway.metrics import GatewayMetrics
from gateway.scheduling.scheduler import ModelScheduler, Slot
from sluice.domain import RequestClass
from sluice.engine_client import ReplicaStats
from sluice.policy.fair_queue import WaitingRequest
from sluice.settings import Settings

pytestmark = pytest.mark.anyio

PROMPT = list(range(1, 65))  # four full KV blocks
OTHER_PROMPT = list(range(101, 165))


def _engine(name: str) -> ScriptedFakeEngine:
    engine = ScriptedFakeEngine(token_id=5, interval_s=0.001)
    engine.replica = name  # an instance attribute: each fake is its own replica
    return engine


async def _dispatch(scheduler: ModelScheduler, request_id: str, tenant_id: str, prompt: list[int]) -> Slot:
    now = time.monotonic()
    queued = WaitingRequest(
        request_id, tenant_id, 1.0, RequestClass.INTERACTIVE, len(prompt), 8, now, now + 30
    )
    return await scheduler.wait_for_dispatch(queued, prefix_key=scheduler.prefix_key(tenant_id, prompt))


async def test_a_tenants_repeated_prefix_goes_back_to_its_replica_while_not_saturated(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    scheduler = ModelScheduler("m", (), settings, GatewayMetrics(), version="1")
    await scheduler.add_replica(_engine("a"), "a#1")
    await scheduler.add_replica(_engine("b"), "b#1")
    # Nothing streams (no first tokens), so each request held counts as waiting on its replica: without
    # affinity every new request would go to the replica holding fewer.
    first = await _dispatch(scheduler, "r1", "acme", PROMPT)
    home = first.replica_key
    repeats = [await _dispatch(scheduler, f"r{i}", "acme", PROMPT) for i in range(2, 5)]
    assert [s.replica_key for s in repeats] == [home] * 3  # 4 waiting there, 0 on the other
    elsewhere = {"a#1", "b#1"} - {home}
    # The same prompt from another tenant, and another prompt from acme: no affinity, the idle replica.
    assert (await _dispatch(scheduler, "g1", "globex", PROMPT)).replica_key in elsewhere
    assert (await _dispatch(scheduler, "r5", "acme", OTHER_PROMPT)).replica_key in elsewhere
    await scheduler.close()


async def test_affinity_yields_once_its_replica_is_saturated(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path, replica_poll_interval_ms=10)
    scheduler = ModelScheduler("m", (), settings, GatewayMetrics(), version="1")
    a, b = _engine("a"), _engine("b")
    a.stats = b.stats = ReplicaStats(
        num_kv_tokens_total=10_000, num_kv_tokens_free=10_000, num_waiting=0, num_running=0
    )
    await scheduler.add_replica(a, "a#1")
    await scheduler.add_replica(b, "b#1")
    await scheduler.start()
    try:
        first = await _dispatch(scheduler, "r1", "acme", PROMPT)
        assert first.replica_key == "a#1"  # a tie: the smallest key
        second = await _dispatch(scheduler, "r2", "acme", PROMPT)
        assert second.replica_key == "a#1"
        # Replica a reports 95% of its KV used (other gateways' work): past the saturation threshold.
        a.stats = ReplicaStats(
            num_kv_tokens_total=10_000, num_kv_tokens_free=500, num_waiting=0, num_running=9
        )
        await asyncio.sleep(0.2)  # a few metric reads
        assert (await _dispatch(scheduler, "r3", "acme", PROMPT)).replica_key == "b#1"
        # a recovers and its requests end, so it is now the less loaded replica; the prefix was last
        # sent to b, which is not saturated: it stays there.
        scheduler.release(first)
        scheduler.release(second)
        a.stats = b.stats
        await asyncio.sleep(0.2)
        assert (await _dispatch(scheduler, "r4", "acme", PROMPT)).replica_key == "b#1"
        assert (await _dispatch(scheduler, "g1", "globex", PROMPT)).replica_key == "a#1"
    finally:
        await scheduler.close()
