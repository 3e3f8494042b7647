"""``sluice top`` over a real stack: the control plane as a process (``python -m control_plane.service``,
SQLite state, the dev admin token), one real tritonserver replica registered through the admin API, and a
gateway routing by the registry (tests/gateway/harness.py) that streams requests from the official openai
client while ``sluice top --once --json`` reads them all: the replica is ready with its running and
waiting counts and KV occupancy, and the version has a TTFT p95 and tokens/s from this window."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_plane_process import running_control_plane

from control_plane.cli.main import main
from replicas.launcher import TritonServer
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.registry.base import VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

# NOTE: the gateway harness lives beside the gateway's tests; pytest puts that folder on sys.path only
# when it collects them, so a run of this folder alone adds it here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from harness import MODEL, RunningGateway, start_gateway, wait_until

ACTOR = "test"
NUM_STREAMS = 3


def _seed_registry(state_dir: Path, checkpoint: Path) -> None:
    """``sluice-tiny`` version 1 (the dev checkpoint), serving, with all the traffic."""

    async def seed() -> None:
        registry = SqliteRegistry(state_dir / "sluice.db")
        await registry.open()
        try:
            await registry.create_model(MODEL, actor=ACTOR)
            await registry.add_version(
                MODEL, "1", artifact_uri=checkpoint.as_uri(), weights_digest=weights_digest(checkpoint),
                build_config={}, actor=ACTOR,
            )  # fmt: skip
            await registry.set_version_state(MODEL, "1", VersionState.WARMING, actor=ACTOR)
            await registry.set_version_state(MODEL, "1", VersionState.SERVING, actor=ACTOR)
            await registry.set_route(MODEL, {"1": 10_000}, actor=ACTOR)
        finally:
            await registry.close()

    asyncio.run(seed())


@pytest.fixture
def control_plane(clean_env: Path, dev_checkpoint: Path) -> Iterator[str]:
    """The control plane as a process over a seeded registry; its URL."""
    clean_env.mkdir(parents=True)
    _seed_registry(clean_env, dev_checkpoint)
    with running_control_plane(clean_env) as running:
        yield running.url


@pytest.fixture
def gateway(
    control_plane: str, clean_env: Path, dev_checkpoint: Path, replica: TritonServer
) -> Iterator[RunningGateway]:
    """``replica`` registered through the admin API, and a gateway routing to it by the registry."""
    answer = httpx.put(
        f"{control_plane}/admin/v1/replicas/r1",
        json={
            "endpoint": replica.grpc_url,
            "model": MODEL,
            "version": "1",
            "metrics_url": replica.metrics_url,
        },
        headers={"Authorization": f"Bearer {DEV_ADMIN_TOKEN}"},
        timeout=30,
    )
    assert answer.status_code == 200 and answer.json()["state"] == "ready", answer.text
    running = start_gateway(
        clean_env, dev_checkpoint, engine_client="triton", routing="registry", registry_poll_interval_s=0.5,
        max_prompt_tokens=256, max_output_tokens=256,
    )  # fmt: skip
    try:
        wait_until(lambda: running.gw.router.pools.num_in_rotation == 1, 10.0, "the replica in rotation")
        yield running
    finally:
        running.stop()


def _stream_until(
    gateway: RunningGateway, stop: threading.Event, done: list[str], errors: list[BaseException]
) -> None:
    """Stream completions one after another until ``stop``; each finished one's id into ``done``."""
    client = gateway.client()
    try:
        while not stop.is_set():
            stream = client.completions.create(
                model=MODEL, prompt="hello there", max_tokens=24, stream=True, extra_body={"ignore_eos": True}
            )
            done.append([chunk.id for chunk in stream][-1])
    except BaseException as exc:  # the test fails on it, after the threads are joined
        errors.append(exc)


def test_top_once_json_reads_the_whole_stack(
    control_plane: str, gateway: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    stop = threading.Event()
    done: list[str] = []
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_stream_until, args=(gateway, stop, done, errors)) for _ in range(NUM_STREAMS)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(done) >= NUM_STREAMS or bool(errors), 30.0, "the first streams to finish")
        sources = [
            "--admin-url",
            control_plane,
            "--token",
            DEV_ADMIN_TOKEN,
            "--gateway",
            f"{gateway.base_url}/metrics",
        ]
        code = main(["top", "--once", "--json", "--interval", "2", *sources])
        out, err = capsys.readouterr()
        table_code = main(["top", "--once", "--interval", "1", *sources])
        table = capsys.readouterr().out
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert code == 0 and table_code == 0 and not errors, (err, errors)
    view = json.loads(out)
    assert [s for s in view["sources"] if s["error"] is not None] == []
    version, replica = view["rows"]
    assert (replica["replica"], replica["state"], replica["health"]) == ("r1", "ready", "")
    assert isinstance(replica["num_running"], int) and isinstance(replica["num_waiting"], int)
    # NOTE: + 1: the control plane's health probe (one token) may be on the replica at that moment.
    assert replica["num_running"] + replica["num_waiting"] <= NUM_STREAMS + 1
    assert replica["kv_used_pct"] is not None and 0 <= replica["kv_used_pct"] <= 100
    assert replica["tokens_per_s"] > 0
    assert (version["model"], version["version"], version["replica"], version["state"]) == (
        MODEL, "1", "", "1/1 ready",
    )  # fmt: skip
    assert version["ttft_p95_ms"] is not None and version["ttft_p95_ms"] > 0
    assert version["itl_p95_ms"] is not None and version["itl_p95_ms"] > 0
    assert version["tokens_per_s"] == replica["tokens_per_s"]
    assert view["gateway_output_tokens_per_s"] > 0 and 1.5 <= view["window_s"] <= 10
    print(table)
    header, version_line, replica_line = table.splitlines()[2:5]
    assert header.split()[:3] == ["MODEL", "VERSION", "REPLICA"]
    assert version_line.split()[:5] == [MODEL, "1", "(all)", "1/1", "ready"]
    assert replica_line.split()[:2] == ["r1", "ready"]
