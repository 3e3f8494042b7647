"""Pools by workload shape over real tritonservers: a gateway following the registry with
SLUICE_LONG_PROMPT_MIN_TOKENS=64, one version served by a general replica, a long-prompt replica and a
warm one, driven by the official openai client:

- a prompt of at least 64 tokens lands on the long-prompt replica, a shorter one on the general replica,
  and the telemetry names the pool;
- the warm replica gets nothing; promoted to general (one registry write) it takes short prompts as soon
  as the gateway routes by that write;
- with the long-prompt replica out of rotation, long prompts go to the general pool, counted.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from harness import MODEL, RunningGateway, start_gateway, wait_until
from metrics_text import read_metric, settled_count
from ports import free_ports

from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.stores.registry.base import Registry, ReplicaPool, ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

ACTOR = "test-release-manager"
THRESHOLD_TOKENS = 64
LONG_PROMPT = [7] * 100  # token ids: exactly 100 prompt tokens
SHORT_PROMPT = [7] * 8
POOLS = {"general": ReplicaPool.GENERAL, "long": ReplicaPool.LONG_PROMPT, "warm": ReplicaPool.WARM}
T = TypeVar("T")


@dataclass
class Fleet:
    gateway: RunningGateway
    registry: Registry
    loop: asyncio.AbstractEventLoop
    servers: dict[str, TritonServer]  # replica id -> its server

    def write(self, coro: Coroutine[Any, Any, T]) -> T:
        """A registry call on the registry's loop; returns once the gateway routes by its result."""
        result = asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)
        generation = asyncio.run_coroutine_threadsafe(self.registry.generation(), self.loop).result(10)
        follower = self.gateway.gw.follower
        assert follower is not None
        wait_until(lambda: follower.generation >= generation, 5.0, f"the gateway at generation {generation}")
        return result

    def complete(self, prompt: list[int]) -> dict[str, Any]:
        """One completion through the openai client; its telemetry record."""
        completion = self.gateway.client().completions.create(model=MODEL, prompt=prompt, max_tokens=1)
        self.gateway.gw.telemetry.flush()
        (record,) = [r for r in self.gateway.telemetry() if r["request_id"] == completion.id]
        return record

    def replica_of(self, record: dict[str, Any]) -> str:
        return next(rid for rid, s in self.servers.items() if s.grpc_url == record["replica"])


def _server(repo: Path, state_dir: Path, tag: str) -> TritonServer:
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        TritonServerConfig(
            model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics, state_dir=state_dir,
            shm_prefix=f"sluice_pools_{os.getpid()}_{tag}_", exit_timeout_s=1, stop_timeout_s=10,
        )
    )  # fmt: skip
    server.start()
    return server


@pytest.fixture(scope="module")
def fleet(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("long_prompt_pool")
    repo = root / "repo"
    render_model_repository(repo, CpuEngineModelSettings(checkpoint_dir=dev_checkpoint, num_kv_blocks=256))
    servers: dict[str, TritonServer] = {}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="registry-loop", daemon=True)
    thread.start()
    state_dir = root / "state"
    state_dir.mkdir()
    registry = SqliteRegistry(state_dir / "sluice.db")
    gateway = None
    try:
        for replica_id in POOLS:
            servers[replica_id] = _server(repo, root / "triton", replica_id)

        async def seed() -> None:
            await registry.open()
            await registry.create_model(MODEL, actor=ACTOR)
            digest = weights_digest(dev_checkpoint)
            await registry.add_version(
                MODEL, "1", artifact_uri=dev_checkpoint.as_uri(), weights_digest=digest, build_config={},
                actor=ACTOR,
            )  # fmt: skip
            await registry.set_version_state(MODEL, "1", VersionState.WARMING, actor=ACTOR)
            await registry.set_version_state(MODEL, "1", VersionState.SERVING, actor=ACTOR)
            for replica_id, pool in POOLS.items():
                await registry.register_replica(
                    replica_id, endpoint=servers[replica_id].grpc_url, model=MODEL, version="1", actor=ACTOR,
                    state=ReplicaState.READY, metrics_url=servers[replica_id].metrics_url, pool=pool,
                )  # fmt: skip
            await registry.set_route(MODEL, {"1": 10_000}, actor=ACTOR)

        asyncio.run_coroutine_threadsafe(seed(), loop).result(30)
        gateway = start_gateway(
            state_dir, dev_checkpoint, engine_client="triton", routing="registry",
            registry_poll_interval_s=1.0, long_prompt_min_tokens=THRESHOLD_TOKENS, router_placement="random",
        )  # fmt: skip
        wait_until(lambda: gateway.gw.router.pools.num_in_rotation == 2, 15.0, "general and long in rotation")
        yield Fleet(gateway, registry, loop, servers)
    finally:
        if gateway is not None:
            gateway.stop()
        asyncio.run_coroutine_threadsafe(registry.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        for server in servers.values():
            server.stop()


def _num_inferences(server: TritonServer) -> float:
    return read_metric(server.metrics_url, "nv_inference_request_success", model=MODEL)


def _fallbacks(gateway: RunningGateway) -> float:
    value = gateway.gw.metrics.registry.get_sample_value(
        "sluice_gateway_pool_fallbacks_total",
        {"model": MODEL, "version": "1", "wanted_pool": "long-prompt", "pool": "general"},
    )
    return value or 0.0


def test_prompts_land_by_length_and_a_warm_replica_waits_for_its_promotion(fleet: Fleet) -> None:
    for _ in range(3):
        lng, short = fleet.complete(LONG_PROMPT), fleet.complete(SHORT_PROMPT)
        assert (lng["pool"], lng["prompt_tokens"], fleet.replica_of(lng)) == ("long-prompt", 100, "long")
        assert (short["pool"], short["prompt_tokens"], fleet.replica_of(short)) == ("general", 8, "general")
    assert _num_inferences(fleet.servers["warm"]) == 0  # loaded and verified, routed nothing
    with fleet.gateway.http() as http:
        report = http.get("/readyz").json()["replicas"]
    assert {rid: r["pool"] for rid, r in report.items()} == {"general": "general", "long": "long-prompt"}

    began_s = time.monotonic()
    fleet.write(fleet.registry.set_replica_pool("warm", ReplicaPool.GENERAL, actor="autoscaler"))
    served_by = [fleet.replica_of(fleet.complete(SHORT_PROMPT)) for _ in range(24)]  # placement: random
    assert set(served_by) == {"general", "warm"}, served_by
    assert time.monotonic() - began_s < 30
    num_warm = served_by.count("warm")
    assert settled_count(lambda: _num_inferences(fleet.servers["warm"]), num_warm) == num_warm
    assert fleet.replica_of(fleet.complete(LONG_PROMPT)) == "long"  # the long pool is unchanged


def test_long_prompts_fall_back_to_the_general_pool_while_the_long_pool_is_out(fleet: Fleet) -> None:
    before = _fallbacks(fleet.gateway)
    fleet.write(fleet.registry.record_health("long", ReplicaState.FAILED, actor="health", detail="test"))
    try:
        record = fleet.complete(LONG_PROMPT)
        assert (fleet.replica_of(record) != "long", record["pool"]) == (True, "general")
        assert _fallbacks(fleet.gateway) == before + 1
    finally:
        fleet.write(fleet.registry.record_health("long", ReplicaState.READY, actor="health"))
    record = fleet.complete(LONG_PROMPT)
    assert (fleet.replica_of(record), record["pool"]) == ("long", "long-prompt")
    assert _fallbacks(fleet.gateway) == before + 1
