"""Degradation under persistent overload (issue 12 deliverable 6), driven by the official openai client: a
model driven into overload (a replica whose KV cache holds one long stream, so the dispatch gate runs one
at a time while a backlog of them waits) takes its configured fallbacks on the requests admitted while the
overload lasts (Sluice-Degraded header, capped output, the batch class, the counter, the gauge,
telemetry), and no more once the load is gone and exit_after_s has passed. Over the in-process engine for
the cap and the class; over a real tritonserver serving two models, routed by the registry, for the alias
to the smaller one. A bad configuration stops the gateway at start, saying what is wrong."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from harness import MODEL, RunningGateway, start_gateway, wait_until
from metrics_text import read_metric
from openai.types import Completion
from ports import free_ports

from cpu_engine.client import InProcessEngineClient
from cpu_engine.config import EngineConfig
from cpu_engine.devckpt import write_checkpoint
from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.settings import SettingsError, load_settings
from sluice.stores.registry.base import ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

CAP_TOKENS = 8
FALLBACKS = {
    MODEL: {
        "max_tokens_cap": CAP_TOKENS,
        "to_batch": True,
        "overload_wait_s": 0.3,
        "enter_after_s": 0.5,
        "exit_after_s": 1.0,
    }
}
NUM_BACKLOG = 8
BACKLOG_TOKENS = 120
# 12 blocks of 16 tokens: one backlog stream (its prompt + 120 tokens reserved) and small requests fit,
# two backlog streams do not.
TINY_KV_BLOCKS = 12


@pytest.fixture(scope="module")
def gateway(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    # A replica of tiny capacity: its KV holds one backlog stream (and a few small requests), so the
    # dispatch gate lets one stream run at a time and the rest wait in the gateway's queue.
    engine = InProcessEngineClient(dev_checkpoint, MODEL, EngineConfig(num_kv_blocks=TINY_KV_BLOCKS))
    gateway = start_gateway(
        tmp_path_factory.mktemp("gateway_degradation"),
        dev_checkpoint,
        engine=engine,
        max_prompt_tokens=256,
        max_output_tokens=256,
        degradation=json.dumps(FALLBACKS),
    )
    yield gateway
    gateway.stop()


def _metric(gateway: RunningGateway, family: str, **labels: str) -> float:
    return read_metric(gateway.base_url + "/metrics", family, **labels)


def _output_tokens(completion: Completion) -> int:
    assert completion.usage is not None
    return completion.usage.completion_tokens


def _batch_ttft_count(gateway: RunningGateway) -> float:
    family = "sluice_gateway_time_to_first_token_seconds_count"
    return _metric(gateway, family, model=MODEL, request_class="batch")


def _backlog(gateway: RunningGateway, num_tokens: list[int]) -> list[threading.Thread]:
    """Long interactive streams, all admitted at once (before the overload they cause begins); each
    appends its output tokens to ``num_tokens``."""
    client = gateway.client()

    def stream() -> None:
        chunks = client.completions.create(
            model=MODEL, prompt="load", max_tokens=BACKLOG_TOKENS, stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "service_tier": "default"},
        )  # fmt: skip
        num_tokens.extend(c.usage.completion_tokens for c in chunks if c.usage is not None)

    threads = [threading.Thread(target=stream) for _ in range(NUM_BACKLOG)]
    for thread in threads:
        thread.start()
    return threads


def test_fallbacks_apply_while_the_model_is_overloaded_and_only_then(gateway: RunningGateway) -> None:
    client = gateway.client()

    # Not overloaded: served as asked.
    def keyed() -> Any:  # with an Idempotency-Key: sent again during the overload, it is replayed
        return client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=20, extra_body={"ignore_eos": True},
            extra_headers={"Idempotency-Key": "degradation-replay"},
        )  # fmt: skip

    raw = keyed()
    first = raw.parse()
    assert "sluice-degraded" not in raw.headers and _output_tokens(first) == 20
    assert _metric(gateway, "sluice_gateway_degraded_mode", model=MODEL) == 0

    backlog_tokens: list[int] = []
    backlog = _backlog(gateway, backlog_tokens)
    wait_until(
        lambda: _metric(gateway, "sluice_gateway_degraded_mode", model=MODEL) == 1, 20, "overload to begin"
    )
    batch_before = _batch_ttft_count(gateway)

    # Three requests arrive while the backlog waits (at once: each is degraded or not at its admission).
    def moved() -> Any:  # no class chosen: capped and moved to batch (non-streaming)
        return client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=50, extra_body={"ignore_eos": True}
        )

    def interactive() -> Any:  # streaming, interactive chosen: capped, keeps its class
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=40, stream=True,
            service_tier="default", stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return raw.headers, list(raw.parse())

    def under_cap() -> Any:  # asking for no more than the cap: only the class moves
        return client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=CAP_TOKENS, extra_body={"ignore_eos": True}
        )

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(probe) for probe in (moved, interactive, under_cap, keyed)]
        raw, (stream_headers, chunks), raw_under, raw_replay = (f.result(timeout=60) for f in futures)
    completion = raw.parse()
    assert raw.headers["sluice-degraded"] == f"max_tokens_cap={CAP_TOKENS}, to_batch"
    assert _output_tokens(completion) == CAP_TOKENS and completion.model == MODEL
    assert stream_headers["sluice-degraded"] == f"max_tokens_cap={CAP_TOKENS}"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == CAP_TOKENS
    assert raw_under.headers["sluice-degraded"] == "to_batch"
    assert _output_tokens(raw_under.parse()) == CAP_TOKENS
    replay = raw_replay.parse()  # the stored result, as it was: not capped, no header
    assert (
        replay.id == first.id and _output_tokens(replay) == 20 and "sluice-degraded" not in raw_replay.headers
    )

    assert _batch_ttft_count(gateway) == batch_before + 2  # the two moved ran as batch
    # Counted at admission: the replay too (it was admitted with them before its stored result was found).
    assert _metric(gateway, "sluice_gateway_degraded_total", model=MODEL, action="max_tokens_cap") == 3
    assert _metric(gateway, "sluice_gateway_degraded_total", model=MODEL, action="to_batch") == 3
    records = {r["request_id"]: r for r in gateway.telemetry()}
    assert records[completion.id]["degraded"] == f"max_tokens_cap={CAP_TOKENS}, to_batch"
    assert records[completion.id]["output_tokens"] == CAP_TOKENS

    # The load goes away; exit_after_s later the model is served as asked again.
    for thread in backlog:
        thread.join(60)
    assert backlog_tokens == [BACKLOG_TOKENS] * NUM_BACKLOG  # admitted before the overload: not capped
    wait_until(
        lambda: _metric(gateway, "sluice_gateway_degraded_mode", model=MODEL) == 0, 10, "overload to end"
    )
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=20, extra_body={"ignore_eos": True}
    )
    after = raw.parse()
    assert "sluice-degraded" not in raw.headers and _output_tokens(after) == 20
    assert {r["request_id"]: r for r in gateway.telemetry()}[after.id]["degraded"] is None
    assert _metric(gateway, "sluice_gateway_degraded_total", model=MODEL, action="to_batch") == 3


def test_a_bad_configuration_stops_the_gateway_at_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_STATE_DIR=str(tmp_path), SLUICE_DEGRADATION='{"sluice-tiny": {"max_token_cap": 64}}')
    done = subprocess.run(
        [sys.executable, "-m", "gateway"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "SLUICE_DEGRADATION=" in done.stderr, done.stderr
    assert "model 'sluice-tiny': unknown field(s) max_token_cap; known: alias_to," in done.stderr


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"sluice-tiny": {"max_tokens_cap": 0}}', "max_tokens_cap must be an integer >= 1, got 0"),
        ('{"sluice-tiny": {"to_batch": true, "exit_after_s": -5}}', "exit_after_s must be a finite number"),
        ("{sluice-tiny", "not valid JSON"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(value: str, says: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(degradation=value)  # what the gateway's start reads its settings with
    assert "SLUICE_DEGRADATION=" in str(refused.value) and says in str(refused.value)


# ----- alias to a smaller model: a gateway following the registry, two models on one tritonserver -----
SMALL = "sluice-nano"
ACTOR = "test-degradation"


@pytest.fixture(scope="module")
def fleet(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """sluice-tiny and sluice-nano (other weights), version 1 each, served by one tritonserver and routed
    by the registry; sluice-tiny degrades to sluice-nano."""
    root = tmp_path_factory.mktemp("degradation_alias")
    checkpoints = {MODEL: dev_checkpoint, SMALL: write_checkpoint(root / "nano", seed=1)}
    repo = root / "repo"
    for name, checkpoint in checkpoints.items():
        num_kv_blocks = TINY_KV_BLOCKS if name == MODEL else 256  # the big model is the tiny replica
        render_model_repository(
            repo,
            CpuEngineModelSettings(
                checkpoint_dir=checkpoint, model_name=name, num_kv_blocks=num_kv_blocks, stats_interval_ms=20
            ),
        )
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        TritonServerConfig(
            model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
            state_dir=root / "triton", shm_prefix=f"sluice_degrade_{os.getpid()}_",
            exit_timeout_s=1, stop_timeout_s=10,
        )
    )  # fmt: skip
    state_dir = root / "state"
    state_dir.mkdir()
    gateway = None
    try:
        server.start()
        asyncio.run(_seed_registry(SqliteRegistry(state_dir / "sluice.db"), checkpoints, server))
        alias = {MODEL: {**FALLBACKS[MODEL], "alias_to": SMALL}}
        gateway = start_gateway(
            state_dir, dev_checkpoint, engine_client="triton", routing="registry",
            registry_poll_interval_s=1.0, max_prompt_tokens=256, max_output_tokens=256,
            degradation=json.dumps(alias),
        )  # fmt: skip
        running = gateway
        wait_until(lambda: running.gw.router.pools.num_in_rotation == 2, 30.0, "both models' replicas")
        yield gateway
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()


async def _seed_registry(
    registry: SqliteRegistry, checkpoints: dict[str, Path], server: TritonServer
) -> None:
    await registry.open()
    try:
        for name, checkpoint in checkpoints.items():
            await registry.create_model(name, actor=ACTOR)
            await registry.add_version(
                name, "1", artifact_uri=checkpoint.as_uri(), weights_digest=weights_digest(checkpoint),
                build_config={}, actor=ACTOR,
            )  # fmt: skip
            await registry.set_version_state(name, "1", VersionState.WARMING, actor=ACTOR)
            await registry.set_version_state(name, "1", VersionState.SERVING, actor=ACTOR)
            await registry.register_replica(
                f"{name}-r1", endpoint=server.grpc_url, model=name, version="1", actor=ACTOR,
                state=ReplicaState.READY, metrics_url=server.metrics_url,
            )  # fmt: skip
            await registry.set_route(name, {"1": 10_000}, actor=ACTOR)
    finally:
        await registry.close()


def test_an_overloaded_model_is_served_by_its_alias_until_the_overload_ends(fleet: RunningGateway) -> None:
    client = fleet.client()
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="hello", max_tokens=4)
    assert "sluice-degraded" not in raw.headers and raw.parse().model == MODEL

    backlog_tokens: list[int] = []
    backlog = _backlog(fleet, backlog_tokens)
    wait_until(lambda: _metric(fleet, "sluice_gateway_degraded_mode", model=MODEL) == 1, 30, "overload")
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=50, extra_body={"ignore_eos": True}
    )
    aliased = raw.parse()
    # The smaller model served it, at its own version, capped and as batch as configured.
    assert raw.headers["sluice-degraded"] == f"alias_to={SMALL}, max_tokens_cap={CAP_TOKENS}, to_batch"
    assert aliased.model == SMALL and aliased.system_fingerprint == f"{SMALL}:1"
    assert _output_tokens(aliased) == CAP_TOKENS
    assert fleet.usage_row(aliased.id)["model"] == SMALL
    assert _metric(fleet, "sluice_gateway_degraded_total", model=MODEL, action="alias_to") == 1

    for thread in backlog:
        thread.join(60)
    assert backlog_tokens == [BACKLOG_TOKENS] * NUM_BACKLOG
    wait_until(lambda: _metric(fleet, "sluice_gateway_degraded_mode", model=MODEL) == 0, 10, "the end")
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="hello", max_tokens=4)
    assert "sluice-degraded" not in raw.headers and raw.parse().model == MODEL
