"""The registry follower when the registry fails: the gateway keeps routing by the last snapshot it read,
counts the failures, and catches up once the registry answers again. The registry is a named fake here
(its real backends have their own contract suite, and tests/gateway/test_registry_routing.py runs the
follower over the real SQLite one)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from gateway.metrics import GatewayMetrics
from gateway.routing.follower import RegistryFollower
from gateway.routing.table import RoutingTable
from sluice.stores.registry.base import (
    Model,
    ModelVersion,
    Registry,
    RegistrySnapshot,
    RegistryUnavailable,
    Route,
    RouteEntry,
    VersionState,
)

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _snapshot(generation: int, weights_bp: dict[str, int]) -> RegistrySnapshot:
    versions = tuple(
        ModelVersion("m", v, f"file:///ckpt/{v}", "sha256:" + v * 64, {}, VersionState.SERVING, NOW, NOW)
        for v in sorted(weights_bp)
    )
    route = Route("m", tuple(RouteEntry(v, w) for v, w in sorted(weights_bp.items())))
    return RegistrySnapshot(generation, (Model("m", "", NOW),), versions, (), (route,))


class FakeRegistry:
    """A registry whose snapshots the test sets, and which can be made to fail like a database gone."""

    def __init__(self, snapshot: RegistrySnapshot) -> None:
        self.current = snapshot
        self.down = False
        self.changed = asyncio.Event()

    def set(self, snapshot: RegistrySnapshot) -> None:
        self.current = snapshot
        self.changed.set()

    async def snapshot(self) -> RegistrySnapshot:
        if self.down:
            raise RegistryUnavailable("the database is down (fake)")
        return self.current

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        if self.down:
            raise RegistryUnavailable("the database is down (fake)")
        if self.current.generation <= after_generation:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout_s)
        return self.current.generation


class RecordingRouter:
    """Stands in for the router: remembers every table it was given."""

    def __init__(self) -> None:
        self.tables: list[RoutingTable] = []

    async def apply(self, table: RoutingTable) -> None:
        self.tables.append(table)


async def _until(cond: Any, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def test_the_last_snapshot_keeps_routing_while_the_registry_is_down() -> None:
    registry, router, metrics = FakeRegistry(_snapshot(3, {"1": 10_000})), RecordingRouter(), GatewayMetrics()
    follower = RegistryFollower(cast(Registry, registry), cast(Any, router), metrics, poll_interval_s=0.05)
    await follower.start()
    try:
        assert follower.generation == 3 and router.tables[-1].models["m"].split_pct == {"1": 100.0}
        registry.set(_snapshot(4, {"1": 9_000, "2": 1_000}))
        await _until(lambda: follower.generation == 4)
        registry.down = True
        failures = "sluice_gateway_registry_read_failures_total"
        await _until(lambda: (metrics.registry.get_sample_value(failures) or 0) >= 1)
        assert follower.generation == 4  # still routing by what it read last
        assert router.tables[-1].models["m"].split_pct == {"1": 90.0, "2": 10.0}
        registry.down = False
        registry.set(_snapshot(5, {"2": 10_000}))
        await _until(lambda: follower.generation == 5, timeout_s=5.0)  # after the backoff
        assert router.tables[-1].generation == 5
        assert follower.report()["registry_generation"] == 5
    finally:
        await follower.close()


async def test_a_gateway_starting_while_the_registry_is_down_routes_once_it_answers() -> None:
    registry, router, metrics = FakeRegistry(_snapshot(1, {"1": 10_000})), RecordingRouter(), GatewayMetrics()
    registry.down = True
    follower = RegistryFollower(cast(Registry, registry), cast(Any, router), metrics, poll_interval_s=0.05)
    await follower.start()  # does not fail: routes nothing yet
    try:
        assert follower.generation == -1 and router.tables == []
        registry.down = False
        await _until(lambda: follower.generation == 1, timeout_s=5.0)
    finally:
        await follower.close()
