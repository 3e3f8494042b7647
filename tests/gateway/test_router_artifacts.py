"""The router reads each routed version's tokenizer from its artifact without holding back the routing
table: a read slower than ``TOKENIZER_WAIT_S`` goes on in the background (its version listed in /readyz
as still being fetched, then routed once it lands, without another registry read); a table read while
it is in flight does not wait for it again; a read that fails is reported with its reason and retried
at the next table. ``read_tokenizer`` is replaced by a named fake that blocks on an event (the store
itself is tested in tests/core/test_artifacts.py and end to end in tests/control_plane)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

import gateway.routing.router as router_module
from gateway.metrics import GatewayMetrics
from gateway.routing.pools import ReplicaPools
from gateway.routing.router import Router
from gateway.routing.table import ReplicaTarget, RoutingTable
from replicas.verify import Verification
from sluice.artifacts import ArtifactUnavailable, StoreFactory
from sluice.engine_client import EngineClient
from sluice.settings import Settings
from sluice.stores.registry.base import Model, ModelVersion, RegistrySnapshot, Route, RouteEntry, VersionState
from sluice.text import TextCodec

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 12, 1, tzinfo=UTC)
DIGEST = "sha256:" + "1" * 64
URI = "s3://weights/engines/m/1"


class SlowFakeTokenizerRead:
    """A fake ``read_tokenizer``: blocks until ``release`` is set, then fails or returns the dev codec."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.release = threading.Event()
        self.fail_with: Exception | None = None
        self.num_calls = 0

    def __call__(self, artifact_uri: str, weights_digest: str, store: StoreFactory) -> TextCodec:
        self.num_calls += 1
        assert (artifact_uri, weights_digest) == (URI, DIGEST)
        assert self.release.wait(30)
        if self.fail_with is not None:
            raise self.fail_with
        return self.codec


def _table(generation: int) -> RoutingTable:
    version = ModelVersion("m", "1", URI, DIGEST, {}, VersionState.SERVING, NOW, NOW)
    snapshot = RegistrySnapshot(
        generation, (Model("m", "", NOW),), (version,), (), (Route("m", (RouteEntry("1", 10_000),)),)
    )
    return RoutingTable.from_snapshot(snapshot)


def _no_client(target: ReplicaTarget) -> EngineClient:
    raise AssertionError("no replica is contacted here")


async def _no_verify(target: ReplicaTarget) -> Verification:
    raise AssertionError("no replica is contacted here")


@pytest.fixture
def fake_read(monkeypatch: pytest.MonkeyPatch, dev_checkpoint: Path) -> SlowFakeTokenizerRead:
    fake = SlowFakeTokenizerRead(TextCodec.from_checkpoint(dev_checkpoint))
    monkeypatch.setattr(router_module, "read_tokenizer", fake)
    monkeypatch.setattr(router_module, "TOKENIZER_WAIT_S", 0.2)
    return fake


def _router(tmp_path: Path) -> Router:
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    metrics = GatewayMetrics()
    return Router(ReplicaPools(settings, metrics, _no_client, _no_verify), metrics)


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def test_a_slow_tokenizer_read_goes_on_in_the_background(
    fake_read: SlowFakeTokenizerRead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = _router(tmp_path)
    await router.apply(_table(1))  # waits TOKENIZER_WAIT_S, then applies the table without the version
    assert router.table.generation == 1
    assert router.report()["unroutable_versions"] == {
        "m 1": f"its tokenizer is still being fetched from {URI}"
    }
    # Another table while the read is in flight: applied without waiting for it again.
    monkeypatch.setattr(router_module, "TOKENIZER_WAIT_S", 60.0)
    await asyncio.wait_for(router.apply(_table(2)), 5.0)
    assert router.table.generation == 2 and fake_read.num_calls == 1
    fake_read.release.set()
    await _until(lambda: "unroutable_versions" not in router.report())  # routed once it lands
    assert router._codec("m", "1") is fake_read.codec


async def test_a_failed_read_says_why_and_is_retried_at_the_next_table(
    fake_read: SlowFakeTokenizerRead, tmp_path: Path
) -> None:
    router = _router(tmp_path)
    fake_read.fail_with = ArtifactUnavailable(f"artifact {URI} not fetched: no manifest.json")
    fake_read.release.set()
    await router.apply(_table(1))
    why = router.report()["unroutable_versions"]
    assert why == {"m 1": f"tokenizer of {URI} unreadable: artifact {URI} not fetched: no manifest.json"}
    fake_read.fail_with = None
    await router.apply(_table(2))
    assert fake_read.num_calls == 2 and "unroutable_versions" not in router.report()
