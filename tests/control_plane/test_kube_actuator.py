"""The Kubernetes actuator (control_plane/autoscaler/kube.py) through the official ``kubernetes`` client
against a FAKE API server (tests/control_plane/fake_kube_api.py: no cluster runs here), with a real SQLite
registry: a start raises the version's Deployment through the scale subresource; a retirement drains the
replica first, waits while it holds requests, then marks its pod first to go, lowers the count by one and
removes the replica; the drain bound; a pod that cannot be marked leaves the count alone; a missing
Deployment is a clear error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_kube_api import FakeKubeApi
from kubernetes import client as kube

from control_plane.autoscaler.kube import DELETION_COST, KubeActuator, KubeError, deployment_name
from replicas.health import ReplicaStates
from sluice.stores.registry.base import NotFound, ReplicaPool, ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry

MODEL, VERSION, NS = "sluice-tiny", "1", "serving"
DEPLOYMENT = "sluice-sluice-tiny-1"
SCALE_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{DEPLOYMENT}/scale"
ACTOR = "test"


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi()
    fake.deployments[(NS, DEPLOYMENT)] = 2
    fake.pods[(NS, "pod-a")] = {}
    fake.pods[(NS, "pod-b")] = {}
    yield fake
    fake.close()


@pytest.fixture
def registry(tmp_path: Path, api: FakeKubeApi) -> Iterator[SqliteRegistry]:
    registry = SqliteRegistry(tmp_path / "sluice.db")

    async def setup() -> None:
        await registry.open()
        await registry.create_model(MODEL, actor=ACTOR)
        await registry.add_version(
            MODEL, VERSION, artifact_uri="s3://w/1", weights_digest="sha256:" + "1" * 64, build_config={},
            actor=ACTOR,
        )  # fmt: skip
        await registry.set_version_state(MODEL, VERSION, VersionState.WARMING, actor=ACTOR)
        for pod in ("pod-a", "pod-b", "pod-gone"):  # a replica's id is its pod's name
            await registry.register_replica(
                pod, endpoint=f"{pod}:8001", model=MODEL, version=VERSION, actor=ACTOR,
                state=ReplicaState.READY, metrics_url=api.replica_metrics_url(pod),
            )  # fmt: skip

    asyncio.run(setup())
    yield registry
    asyncio.run(registry.close())


def actuator(api: FakeKubeApi, registry: SqliteRegistry, drain_timeout_s: float = 30.0) -> KubeActuator:
    config = kube.Configuration(host=api.url)
    return KubeActuator(
        kube.ApiClient(config), ReplicaStates(registry), namespace=NS,
        deployment_template="sluice-{model}-{version}", drain_timeout_s=drain_timeout_s, idle_poll_s=0.05,
    )  # fmt: skip


async def wait_until(check: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_deployment_names_are_dns_1123() -> None:
    assert (
        deployment_name("sluice-{model}-{version}", "Org/Llama_3.1:8b", "v2") == "sluice-org-llama-3-1-8b-v2"
    )
    assert len(deployment_name("{model}", "m" * 100, "1")) == 63


def test_start_raises_the_deployment_through_the_scale_subresource(
    api: FakeKubeApi, registry: SqliteRegistry
) -> None:
    async def run() -> None:
        ids = await actuator(api, registry).start(MODEL, VERSION, 3, pool=ReplicaPool.GENERAL)
        assert ids == []  # the pods register themselves

    asyncio.run(run())
    assert api.deployments[(NS, DEPLOYMENT)] == 5
    assert [(m, p) for m, p, _ in api.calls] == [("GET", SCALE_PATH), ("PATCH", SCALE_PATH)]
    assert api.calls[1][2] == {"spec": {"replicas": 5}}


def test_retire_drains_first_and_lowers_the_count_only_once_the_replica_is_idle(
    api: FakeKubeApi, registry: SqliteRegistry
) -> None:
    api.in_flight["pod-b"] = 2

    async def run() -> None:
        act = actuator(api, registry)
        await act.retire(await registry.get_replica("pod-b"))
        assert (await registry.get_replica("pod-b")).state == ReplicaState.DRAINING  # at once
        await asyncio.sleep(1.5)  # past the gateways' propagation: it still holds 2 requests
        assert api.deployments[(NS, DEPLOYMENT)] == 2 and api.pods[(NS, "pod-b")] == {}
        api.in_flight["pod-b"] = 0

        async def removed() -> bool:
            try:
                await registry.get_replica("pod-b")
            except NotFound:
                return True
            return False

        await wait_until(removed)
        await act.close()

    asyncio.run(run())
    assert api.pods[(NS, "pod-b")] == {DELETION_COST: "-1000"} and api.pods[(NS, "pod-a")] == {}
    assert api.deployments[(NS, DEPLOYMENT)] == 1
    order = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in api.calls]
    assert order == [("PATCH", "pod-b"), ("GET", "scale"), ("PATCH", "scale")]  # marked before the count


def test_retire_stops_waiting_at_the_drain_bound(api: FakeKubeApi, registry: SqliteRegistry) -> None:
    api.in_flight["pod-a"] = 1  # never finishes

    async def run() -> None:
        act = actuator(api, registry, drain_timeout_s=0.5)
        await act.retire(await registry.get_replica("pod-a"))
        await wait_until(lambda: _scaled_to(api, 1))
        await act.close()

    asyncio.run(run())
    assert api.pods[(NS, "pod-a")] == {DELETION_COST: "-1000"}


async def _scaled_to(api: FakeKubeApi, replicas: int) -> bool:
    return api.deployments[(NS, DEPLOYMENT)] == replicas


def test_a_pod_that_cannot_be_marked_leaves_the_count_and_the_replica_draining(
    api: FakeKubeApi, registry: SqliteRegistry
) -> None:
    async def run() -> None:
        act = actuator(api, registry, drain_timeout_s=0.5)
        await act.retire(await registry.get_replica("pod-gone"))  # no such pod: 404

        async def tried() -> bool:
            return any(p.endswith("/pods/pod-gone") for _, p, _ in api.calls)

        await wait_until(tried)
        await asyncio.sleep(0.3)
        assert (await registry.get_replica("pod-gone")).state == ReplicaState.DRAINING
        await act.close()

    asyncio.run(run())
    assert api.deployments[(NS, DEPLOYMENT)] == 2
    assert not any(m == "PATCH" and p == SCALE_PATH for m, p, _ in api.calls)


def test_a_missing_deployment_is_a_clear_error(api: FakeKubeApi, registry: SqliteRegistry) -> None:
    async def run() -> None:
        with pytest.raises(KubeError, match=f"deployment {NS}/sluice-sluice-tiny-9: 404"):
            await actuator(api, registry).start(MODEL, "9", 1, pool=ReplicaPool.WARM)

    asyncio.run(run())
