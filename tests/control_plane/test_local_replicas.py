"""The local actuator through the admin API (the app's real lifespan, a fresh SQLite registry, real
tritonservers): start replicas of a version from its checkpoint, each registered starting and then ready
once verified; drain one, stop it (no process left, no registry row); the service's shutdown stops the
rest. And what it refuses, with the reason: versions Triton cannot serve, weights that are not the
version's, replicas it did not start; external replicas registered and checked at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import tritonclient.grpc.aio as grpcclient
from litestar.testing import TestClient
from proc_table import processes_mentioning

from control_plane.service.app import create_app
from replicas.launcher import TritonServer
from replicas.verify import verify_replica
from sluice.settings import Settings, load_settings
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.admin_tokens.store import SqliteAdminTokenStore
from sluice.stores.registry.base import ReplicaState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.triton.client import GenerateStream, request_tensors
from sluice.triton.metrics import replica_stats_from_metrics
from sluice.weights_digest import weights_digest

T = TypeVar("T")
Aio = Callable[[Coroutine[Any, Any, T]], T]
MODEL = "sluice-tiny"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def settings(clean_env: Path) -> Settings:
    return load_settings()


@pytest.fixture
def tokens(settings: Settings) -> dict[Role, str]:
    async def run() -> dict[Role, str]:
        store = SqliteAdminTokenStore(settings.sqlite_path)
        await store.open()
        try:
            return {role: await store.create(str(role), role) for role in Role}
        finally:
            await store.close()

    return asyncio.run(run())


def register_versions(settings: Settings, checkpoint: Path, **versions: str) -> None:
    """``sluice-tiny`` with ``{version: artifact_uri}``, each with the checkpoint's digest."""

    async def run() -> None:
        registry = SqliteRegistry(settings.sqlite_path)
        await registry.open()
        try:
            await registry.create_model(MODEL, actor="test")
            for version, uri in versions.items():
                await registry.add_version(
                    MODEL, version, artifact_uri=uri, weights_digest=weights_digest(checkpoint),
                    build_config={}, actor="test",
                )  # fmt: skip
        finally:
            await registry.close()

    asyncio.run(run())


@contextmanager
def service(settings: Settings, token: str) -> Iterator[TestClient[Any]]:
    """The control plane (health rounds every 0.5 s), called as ``token``."""
    with TestClient(create_app(settings, health_interval_s=0.5)) as client:
        client.headers.update(bearer(token))
        yield client


@pytest.fixture
def client(settings: Settings, tokens: dict[Role, str], dev_checkpoint: Path) -> Iterator[TestClient[Any]]:
    register_versions(
        settings, dev_checkpoint, **{"1": dev_checkpoint.as_uri(), "2": "s3://bucket/sluice-tiny/2"}
    )
    with service(settings, tokens[Role.RELEASE_MANAGER]) as client:
        yield client


def replicas(client: TestClient[Any]) -> dict[str, dict[str, Any]]:
    resp = client.get("/admin/v1/replicas")
    assert resp.status_code == 200, resp.text
    return {r["replica_id"]: r for r in resp.json()["replicas"]}


def wait_state(
    client: TestClient[Any], replica_id: str, state: str, timeout_s: float = 120
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (found := replicas(client).get(replica_id)) is None or found["state"] != state:
        assert found is None or found["state"] != "failed", found
        assert time.monotonic() < deadline, found
        time.sleep(0.3)
    return found


def test_start_verify_drain_stop_and_the_service_stopping_its_replicas(
    settings: Settings, tokens: dict[Role, str], dev_checkpoint: Path, aio: Aio[Any]
) -> None:
    register_versions(settings, dev_checkpoint, **{"1": dev_checkpoint.as_uri()})
    with service(settings, tokens[Role.RELEASE_MANAGER]) as client:
        folders = start_drain_and_stop_one(client, settings, dev_checkpoint, aio)
    # The service stopped: its other replica stopped with it, and left the registry.
    assert processes_mentioning(str(folders[1])) == [] and not folders[1].exists()

    async def rows() -> list[Any]:
        registry = SqliteRegistry(settings.sqlite_path)
        await registry.open()
        try:
            return await registry.list_replicas()
        finally:
            await registry.close()

    assert asyncio.run(rows()) == []


def start_drain_and_stop_one(
    client: TestClient[Any], settings: Settings, dev_checkpoint: Path, aio: Aio[Any]
) -> list[Path]:
    """Start 2 replicas, wait until both are ready and verified, drain and stop the first; their folders."""
    resp = client.post("/admin/v1/replicas", json={"model": MODEL, "version": "1", "count": 2})
    assert resp.status_code == 202, resp.text
    started = resp.json()["replicas"]
    assert [r["state"] for r in started] == ["starting", "starting"] and all(r["local"] for r in started)
    ids = [r["replica_id"] for r in started]
    folders = [settings.state_dir / "replicas" / replica_id for replica_id in ids]
    for replica_id in ids:
        ready = wait_state(client, replica_id, "ready")
        assert ready["health_detail"] == "" and ready["endpoint"].startswith("127.0.0.1:")
        # Registered with its own Triton's metrics URL, where gateways read its load (with their parser).
        assert ready["metrics_url"].startswith("http://127.0.0.1:") and ready["metrics_url"].endswith(
            "/metrics"
        )
        assert replica_stats_from_metrics(httpx.get(ready["metrics_url"]).text, MODEL) is not None
        # What a gateway checks before its first request: this version, these weights.
        assert aio(verify_replica(ready["endpoint"], MODEL, "1", weights_digest(dev_checkpoint))).ok
    assert all(processes_mentioning(str(folder)) for folder in folders)

    drained = client.post(f"/admin/v1/replicas/{ids[0]}/drain")
    assert drained.status_code == 200 and drained.json()["state"] == "draining"
    time.sleep(1.2)  # health rounds: a draining replica stays draining
    assert replicas(client)[ids[0]]["state"] == "draining"

    # A request a gateway dispatched before it saw the drain: the stop waits for it to finish.
    in_flight = InFlight(aio, replicas(client)[ids[0]]["endpoint"])
    stopped = client.post(f"/admin/v1/replicas/{ids[0]}/stop", json={"timeout_s": 60})
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["state"] == "stopped" and stopped.json()["num_in_flight_left"] == 0
    in_flight.thread.join(10)
    assert in_flight.num_tokens == IN_FLIGHT_TOKENS and in_flight.finish_reason == "length"
    assert ids[0] not in replicas(client) and not folders[0].exists()
    assert processes_mentioning(str(folders[0])) == []
    assert client.post(f"/admin/v1/replicas/{ids[0]}/stop").status_code == 404
    return folders


IN_FLIGHT_TOKENS = 1900  # ~1.5 s here on one core: longer than a gateway takes to see a drain


class InFlight:
    """A long generation on ``endpoint``, started in a thread; returns once its first tokens came."""

    def __init__(self, aio: Aio[Any], endpoint: str) -> None:
        self.num_tokens = 0
        self.finish_reason: str | None = None
        started = threading.Event()

        async def generate() -> None:
            client = grpcclient.InferenceServerClient(endpoint)
            tensors = request_tensors(list(range(5, 45)), IN_FLIGHT_TOKENS, ignore_eos=True, cache_scope="t")
            try:
                async with GenerateStream(client, MODEL, tensors, timeout_s=120) as stream:
                    async for chunk in stream:
                        self.num_tokens += len(chunk.token_ids)
                        self.finish_reason = chunk.finish_reason or self.finish_reason
                        started.set()
            finally:
                started.set()
                await client.close()

        self.thread = threading.Thread(target=aio, args=(generate(),), daemon=True)
        self.thread.start()
        assert started.wait(30)


def error(resp: Any, status: int) -> str:
    assert resp.status_code == status, resp.text
    message: str = resp.json()["error"]["message"]
    return message


def test_what_cannot_be_started_is_refused_with_the_reason(
    client: TestClient[Any], tokens: dict[Role, str], tmp_path: Path
) -> None:
    start = "/admin/v1/replicas"
    assert "positive integers" in error(client.post(start, json={"model": MODEL, "version": "v1"}), 400)
    assert "count" in error(client.post(start, json={"model": MODEL, "version": "1", "count": 0}), 400)
    assert "has no version" in error(client.post(start, json={"model": MODEL, "version": "9"}), 404)
    assert "not a local folder" in error(client.post(start, json={"model": MODEL, "version": "2"}), 400)
    other = tmp_path / "other_weights"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"not the version's weights")
    body = {"model": MODEL, "version": "1", "checkpoint": str(other)}
    assert "digests to" in error(client.post(start, json=body), 400)
    body["checkpoint"] = "relative/path"
    assert "absolute" in error(client.post(start, json=body), 400)
    viewer = bearer(tokens[Role.VIEWER])
    assert client.post(start, json={"model": MODEL, "version": "1"}, headers=viewer).status_code == 403
    assert client.get(start, headers=viewer).status_code == 200
    assert replicas(client) == {}  # nothing was registered or started


def test_an_external_replica_is_registered_checked_at_once_and_removed_not_stopped(
    client: TestClient[Any], replica: TritonServer
) -> None:
    body = {"endpoint": replica.grpc_url, "model": MODEL, "version": "1"}
    assert "metrics_url" in error(
        client.put("/admin/v1/replicas/ext-1", json={**body, "metrics_url": "h:8002"}), 400
    )
    assert "ext-1" not in replicas(client)
    resp = client.put("/admin/v1/replicas/ext-1", json={**body, "metrics_url": replica.metrics_url})
    assert resp.status_code == 200, resp.text
    assert resp.json()["state"] == "ready" and resp.json()["local"] is False
    assert resp.json()["metrics_url"] == replicas(client)["ext-1"]["metrics_url"] == replica.metrics_url
    assert "not started by this control plane" in error(client.post("/admin/v1/replicas/ext-1/stop"), 409)
    assert client.post("/admin/v1/replicas/ext-1/drain").json()["state"] == "draining"
    assert client.delete("/admin/v1/replicas/ext-1").status_code == 204
    assert "ext-1" not in replicas(client)
    assert client.delete("/admin/v1/replicas/ext-1").status_code == 404
    bad = client.put(
        "/admin/v1/replicas/ext-2", json={"endpoint": replica.grpc_url, "model": MODEL, "version": "7"}
    )
    assert bad.status_code == 404


def test_replicas_left_by_an_earlier_run_are_removed_at_start(
    settings: Settings, tokens: dict[Role, str], dev_checkpoint: Path
) -> None:
    register_versions(settings, dev_checkpoint, **{"1": dev_checkpoint.as_uri()})

    async def register_ghost() -> None:
        registry = SqliteRegistry(settings.sqlite_path)
        await registry.open()
        try:
            await registry.register_replica(
                "ghost-1", endpoint="127.0.0.1:1", model=MODEL, version="1", actor="test",
                state=ReplicaState.READY,
            )  # fmt: skip
        finally:
            await registry.close()

    asyncio.run(register_ghost())
    (settings.state_dir / "replicas" / "ghost-1" / "model_repository").mkdir(parents=True)
    with TestClient(create_app(settings, health_interval_s=60)) as client:
        client.headers.update(bearer(tokens[Role.VIEWER]))
        deadline = time.monotonic() + 10
        while "ghost-1" in replicas(client):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert not (settings.state_dir / "replicas" / "ghost-1").exists()
