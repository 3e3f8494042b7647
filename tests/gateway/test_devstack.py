"""`make run`'s process: tritonserver, the control plane and the gateway come up together; the registry
holds the dev model's version 1 serving on replica local-1, which the control plane verifies and the
gateway routes to; the openai client is served; one Ctrl-C (SIGINT) stops everything, leaving no process
behind and local-1 out of the registry. Its banner gives the admin API and its dev token; its log says what
runs, warns that the dev keys are on, and stays quiet while it serves. And its registration is idempotent:
a second run finds what the first registered; other weights under version 1 are refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import openai
import pytest
from ports import free_port
from proc_table import processes_mentioning

from gateway.devstack import DevStackError, register_dev_model
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.registry.base import Registry, ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

REPO_ROOT = Path(__file__).resolve().parents[2]
METRICS_8002 = "http://127.0.0.1:8002/metrics"


def test_devstack_serves_and_one_sigint_stops_everything(
    dev_checkpoint: Path, model_repository: Path, tmp_path: Path, three_free_ports: list[int]
) -> None:
    http, grpc, metrics = three_free_ports
    gateway, control_plane = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_STATE_DIR=str(tmp_path / "state"),
        SLUICE_CHECKPOINT_DIR=str(dev_checkpoint),
        SLUICE_GATEWAY_PORT=str(gateway),
        SLUICE_CONTROL_PLANE_PORT=str(control_plane),
        SLUICE_TRITON_GRPC_URL=f"127.0.0.1:{grpc}",
        SLUICE_TRITON_METRICS_URL=f"http://127.0.0.1:{metrics}/metrics",
        SLUICE_REPLICA_POLL_INTERVAL_MS="50",  # 20 reads a second: any per-read log line would show
        SLUICE_DEV_TENANTS="true",  # as `make run` sets it
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.devstack", "--model-repository", str(model_repository),
         "--triton-http-port", str(http)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    marker = str(tmp_path / "state")  # in the tritonserver's and the stub's command lines
    assert proc.stderr is not None
    stderr_lines: list[str] = []
    announced = threading.Event()

    def read_stderr(stream: IO[str]) -> None:
        for line in stream:
            stderr_lines.append(line)
            if line.startswith("Sluice is up"):
                announced.set()

    reader = threading.Thread(target=read_stderr, args=(proc.stderr,), daemon=True)
    reader.start()
    try:
        assert announced.wait(90), "the dev stack did not say it is up"
        # a new user's first request, the moment the banner shows: answered (it was refused, then 503)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway}/v1", api_key="sk-acme-dev")
        reply = client.chat.completions.create(
            model="sluice-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        assert processes_mentioning(marker), "tritonserver should be running"
        admin = httpx.Client(
            base_url=f"http://127.0.0.1:{control_plane}/admin/v1",
            headers={"Authorization": f"Bearer {DEV_ADMIN_TOKEN}"},
        )
        (local,) = admin.get("/replicas").json()["replicas"]
        assert (local["replica_id"], local["state"], local["endpoint"], local["metrics_url"]) == (
            "local-1",
            "ready",
            f"127.0.0.1:{grpc}",
            f"http://127.0.0.1:{metrics}/metrics",
        )
        # The gateway reads local-1's load from that URL (its KV gauge has a sample for the replica).
        gauges = httpx.get(f"http://127.0.0.1:{gateway}/metrics").text.splitlines()
        assert any(
            line.startswith("sluice_gateway_replica_kv_free_tokens{")
            and f'replica="127.0.0.1:{grpc}"' in line
            for line in gauges
        ), [line for line in gauges if "kv_free_tokens" in line]
        (model,) = admin.get("/models").json()["models"]
        assert model["route"] == [{"version": "1", "weight_bp": 10_000}]
        assert [(v["version"], v["state"]) for v in model["versions"]] == [("1", "serving")]
        children = children_of(proc.pid)  # tritonserver and the control plane
        assert len(children) == 2, children
        time.sleep(0.5)  # serving, idle: the replica is read ~10 times meanwhile
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while (processes_mentioning(marker) or alive(children)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(marker) == [] and alive(children) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        banner = "".join(stderr_lines)
    assert "sk-acme-dev" in banner and "sk-globex-dev" in banner and "curl" in banner
    assert f"control plane (admin API): http://127.0.0.1:{control_plane}/admin/v1" in banner
    assert f"dev admin token (platform-admin): {DEV_ADMIN_TOKEN}" in banner
    log_lines = [line for line in banner.splitlines() if " INFO " in line or " WARNING " in line]
    assert any(
        "gateway up: routing following the model registry" in line and "dev tenants ON" in line
        for line in log_lines
    )
    assert any("registry: sluice-tiny version 1" in line and "replica local-1" in line for line in log_lines)
    assert any(
        "replica local-1 (sluice-tiny version 1" in line and "starting -> ready" in line for line in log_lines
    )
    assert any("WARNING" in line and "must not be used in production" in line for line in log_lines)
    # One terminal, two services: each line says whose it is.
    assert {"[gateway]", "[control-plane]"} <= {tag for line in log_lines for tag in line.split()[3:4]}
    assert not [line for line in log_lines if "/metrics" in line or "HTTP Request" in line]
    assert registered_replicas(tmp_path / "state" / "sluice.db") == []  # local-1 left with its tritonserver


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not zombies)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


def registered_replicas(db: Path) -> list[str]:
    async def read() -> list[str]:
        registry = SqliteRegistry(db)
        await registry.open()
        try:
            return [r.replica_id for r in await registry.list_replicas()]
        finally:
            await registry.close()

    return asyncio.run(read())


@pytest.fixture
def registry(tmp_path: Path, aio: Any) -> Iterator[Registry]:
    registry = SqliteRegistry(tmp_path / "sluice.db")
    aio(registry.open())
    yield registry
    aio(registry.close())


def test_the_dev_registration_is_idempotent(registry: Registry, dev_checkpoint: Path, aio: Any) -> None:
    aio(
        register_dev_model(
            registry, "sluice-tiny", dev_checkpoint, "127.0.0.1:8001", metrics_url=METRICS_8002
        )
    )
    first = aio(registry.snapshot())
    (version,) = first.versions
    assert (version.version, version.state, version.weights_digest) == (
        "1",
        VersionState.SERVING,
        weights_digest(dev_checkpoint),
    )
    assert version.artifact_uri == dev_checkpoint.resolve().as_uri()
    assert first.route("sluice-tiny") is not None and first.route("sluice-tiny").split_pct() == {"1": 100.0}  # type: ignore[union-attr]
    (replica,) = first.replicas
    assert (replica.replica_id, replica.endpoint, replica.state, replica.metrics_url) == (
        "local-1",
        "127.0.0.1:8001",
        ReplicaState.STARTING,
        METRICS_8002,
    )

    metrics_9002 = "http://127.0.0.1:9002/metrics"  # the next `make run`, on other ports
    aio(
        register_dev_model(
            registry, "sluice-tiny", dev_checkpoint, "127.0.0.1:9001", metrics_url=metrics_9002
        )
    )
    second = aio(registry.snapshot())
    assert (second.models, second.versions, second.routes) == (first.models, first.versions, first.routes)
    assert [(r.replica_id, r.endpoint, r.metrics_url) for r in second.replicas] == [
        ("local-1", "127.0.0.1:9001", metrics_9002)
    ]
    assert second.generation == first.generation + 1  # only the replica, a new process, re-registered


def test_other_weights_under_version_1_are_refused(
    registry: Registry, dev_checkpoint: Path, tmp_path: Path, aio: Any
) -> None:
    aio(
        register_dev_model(
            registry, "sluice-tiny", dev_checkpoint, "127.0.0.1:8001", metrics_url=METRICS_8002
        )
    )
    generation = aio(registry.generation())
    retrained = tmp_path / "retrained"
    shutil.copytree(dev_checkpoint, retrained)
    (retrained / "notes.txt").write_text("other weights")
    with pytest.raises(DevStackError) as refused:
        aio(
            register_dev_model(registry, "sluice-tiny", retrained, "127.0.0.1:8001", metrics_url=METRICS_8002)
        )
    message = str(refused.value)
    assert weights_digest(retrained) in message and weights_digest(dev_checkpoint) in message
    assert "make clean" in message and "new version" in message
    assert aio(registry.generation()) == generation  # nothing written


def test_make_run_turns_the_dev_tenants_on_unless_told_otherwise() -> None:
    dry_run = subprocess.run(["make", "-n", "run"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert "SLUICE_DEV_TENANTS=${SLUICE_DEV_TENANTS:-true} exec" in dry_run.stdout
