"""A gateway following the registry (SLUICE_ROUTING=registry) over real tritonservers serving two versions
of the dev model (the dev checkpoint written with two seeds), driven by the official openai client and
by registry writes made the way the control plane makes them:

- a 10% canary gets its share of conversations, each conversation stays on its version, and growing the
  canary to 50% keeps the canary's conversations on it;
- a rollback (one registry write) sends new requests to the old version within a second while the
  canary's streams in flight finish;
- a replica whose Triton serves other weights than the registry's version never gets a request, even
  when the registry (wrongly) calls it ready;
- each replica's load (free KV tokens, in the gateway's metrics) is read from the metrics URL the registry
  names for it;
- an admin token is refused by the OpenAI API;
- registry changes while 32 streams run drop none of them.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway, wait_until
from metrics_text import read_metric
from ports import free_ports
from prometheus_client.parser import text_string_to_metric_families

from cpu_engine.devckpt import write_checkpoint
from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.policy.rollout import conversation_key
from sluice.stores.registry.base import Registry, ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.stores.tenants.base import dev_tenant
from sluice.weights_digest import weights_digest

ACTOR = "test-release-manager"
T = TypeVar("T")


@dataclass
class Fleet:
    gateway: RunningGateway
    registry: Registry
    loop: asyncio.AbstractEventLoop  # the registry's (a loop of its own, in a thread)
    servers: dict[str, TritonServer]  # replica id -> its server

    def write(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a registry call on the registry's loop; wait until the gateway routes by its result."""
        result = asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)
        generation = asyncio.run_coroutine_threadsafe(self.registry.generation(), self.loop).result(10)
        follower = self.gateway.gw.follower
        assert follower is not None
        wait_until(lambda: follower.generation >= generation, 2.0, f"the gateway at generation {generation}")
        return result

    def route(self, weights_bp: dict[str, int], **states: VersionState) -> None:
        self.write(self.registry.set_route(MODEL, weights_bp, actor=ACTOR, version_states=states or None))

    def version_of(self, conversation: str) -> str:
        """The version a request of acme in ``conversation`` goes to now (the router's own choice)."""
        key = conversation_key(conversation, None, "r")
        return self.gateway.gw.router.route(MODEL, dev_tenant("acme"), key).version


def _server(repo: Path, state_dir: Path, tag: str) -> TritonServer:
    http, grpc, metrics = free_ports(3)
    config = TritonServerConfig(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=state_dir,
        shm_prefix=f"sluice_routing_{os.getpid()}_{tag.replace('-', '_')}_",
        exit_timeout_s=1,
        stop_timeout_s=10,
    )
    server = TritonServer(config)
    server.start()
    return server


@pytest.fixture(scope="module")
def fleet(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("registry_routing")
    checkpoints = {"1": dev_checkpoint, "2": write_checkpoint(root / "ckpt-seed1", seed=1)}
    digests = {v: weights_digest(c) for v, c in checkpoints.items()}
    # r-bad serves version 2 by name with version 1's weights: ready in Triton, the wrong digest.
    layout = {"r1": ("1", checkpoints["1"]), "r2": ("2", checkpoints["2"]), "r-bad": ("2", checkpoints["1"])}
    servers: dict[str, TritonServer] = {}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="registry-loop", daemon=True)
    thread.start()
    state_dir = root / "state"
    state_dir.mkdir()
    registry = SqliteRegistry(state_dir / "sluice.db")
    gateway = None
    try:
        for replica_id, (version, checkpoint) in layout.items():
            settings = CpuEngineModelSettings(
                checkpoint_dir=checkpoint, model_version=int(version), num_kv_blocks=256, stats_interval_ms=20
            )
            repo = root / f"repo-{replica_id}"
            render_model_repository(repo, settings)
            servers[replica_id] = _server(repo, root / "triton", replica_id)

        async def seed() -> None:
            await registry.open()
            await registry.create_model(MODEL, actor=ACTOR)
            for version, checkpoint in checkpoints.items():
                await registry.add_version(
                    MODEL, version, artifact_uri=checkpoint.as_uri(), weights_digest=digests[version],
                    build_config={"seed": int(version) - 1}, actor=ACTOR,
                )  # fmt: skip
                await registry.set_version_state(MODEL, version, VersionState.WARMING, actor=ACTOR)
                await registry.set_version_state(MODEL, version, VersionState.SERVING, actor=ACTOR)
            for replica_id in ("r1", "r2"):
                await registry.register_replica(
                    replica_id, endpoint=servers[replica_id].grpc_url, model=MODEL,
                    version=layout[replica_id][0], actor=ACTOR, state=ReplicaState.READY,
                    metrics_url=servers[replica_id].metrics_url,
                )  # fmt: skip
            await registry.set_route(MODEL, {"1": 10_000, "2": 0}, actor=ACTOR)

        asyncio.run_coroutine_threadsafe(seed(), loop).result(30)
        gateway = start_gateway(
            state_dir,
            dev_checkpoint,
            engine_client="triton",
            routing="registry",
            registry_poll_interval_s=1.0,
            max_prompt_tokens=256,
            max_output_tokens=256,
        )
        fleet = Fleet(gateway, registry, loop, servers)
        wait_until(lambda: gateway.gw.router.pools.num_in_rotation == 2, 10.0, "both replicas in rotation")
        yield fleet
    finally:
        if gateway is not None:
            gateway.stop()
        asyncio.run_coroutine_threadsafe(registry.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        for server in servers.values():
            server.stop()


def _complete(gateway: RunningGateway, conversation: str, max_tokens: int = 1) -> httpx.Response:
    with gateway.http() as http:
        return http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True},
            headers={"Authorization": f"Bearer {ACME_KEY}", "X-Conversation-Id": conversation},
        )


def test_responses_name_the_version_that_served_them(fleet: Fleet) -> None:
    fleet.route({"1": 10_000, "2": 0})
    client = fleet.gateway.client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="hello", max_tokens=2)
    completion = raw.parse()
    assert raw.headers["sluice-model-version"] == "1" and completion.system_fingerprint == f"{MODEL}:1"
    assert fleet.gateway.usage_row(completion.id)["model_version"] == "1"
    [record] = [r for r in fleet.gateway.telemetry() if r["request_id"] == completion.id]
    assert record["replica"] == fleet.servers["r1"].grpc_url and record["model_version"] == "1"


def test_a_ten_percent_canary_is_sticky_and_keeps_its_conversations_at_fifty(fleet: Fleet) -> None:
    fleet.route({"1": 9_000, "2": 1_000})
    conversations = [f"conv-{i}" for i in range(1_000)]
    at_ten = {c: fleet.version_of(c) for c in conversations}  # the router's own choice
    assert 70 <= Counter(at_ten.values())["2"] <= 130  # 10 +- 3% of 1,000 conversations
    # Through the API, the first request of 200 of them (50 on the canary) goes where the router says.
    # NOTE: not all 1,000: ~1 min of a slow CI host for what 200 show.
    on_canary = [c for c in conversations if at_ten[c] == "2"][:50]
    through_api = on_canary + [c for c in conversations if c not in on_canary][:150]
    with ThreadPoolExecutor(8) as pool:
        served = list(
            pool.map(lambda c: _complete(fleet.gateway, c).headers["sluice-model-version"], through_api)
        )
    assert dict(zip(through_api, served, strict=True)) == {c: at_ten[c] for c in through_api}
    # Through the API: each of 40 conversations, asked twice, stays where the router put it.
    sample = conversations[:30] + [c for c in conversations if at_ten[c] == "2"][:10]
    for conversation in sample:
        versions = {_complete(fleet.gateway, conversation).headers["sluice-model-version"] for _ in range(2)}
        assert versions == {at_ten[conversation]}, conversation
    fleet.route({"1": 5_000, "2": 5_000})
    at_fifty = {c: fleet.version_of(c) for c in conversations}
    assert all(at_fifty[c] == "2" for c in conversations if at_ten[c] == "2")
    assert 400 <= Counter(at_fifty.values())["2"] <= 600
    canary = next(c for c in sample if at_ten[c] == "2")
    assert _complete(fleet.gateway, canary).headers["sluice-model-version"] == "2"


def test_a_rollback_moves_new_requests_within_a_second_while_streams_finish(fleet: Fleet) -> None:
    fleet.route({"1": 5_000, "2": 5_000})
    on_canary = [c for c in (f"rb-{i}" for i in range(200)) if fleet.version_of(c) == "2"][:4]
    client = fleet.gateway.client()
    results: dict[str, tuple[int, str | None, str]] = {}

    def stream(conversation: str) -> None:
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=120, stream=True, extra_body={"ignore_eos": True},
            extra_headers={"X-Conversation-Id": conversation},
        )  # fmt: skip
        chunks = list(raw.parse())
        text_chunks = [c for c in chunks if c.choices]
        finish = text_chunks[-1].choices[0].finish_reason
        results[conversation] = (len(text_chunks), finish, raw.headers["sluice-model-version"])

    threads = [threading.Thread(target=stream, args=(c,)) for c in on_canary]
    for t in threads:
        t.start()
    canary_scheduler = fleet.gateway.gw.router.pools.scheduler(MODEL, "2")
    assert canary_scheduler is not None
    wait_until(lambda: canary_scheduler.num_in_flight >= len(on_canary), 10, "the canary's streams running")
    began = time.monotonic()
    # One write: version 1 takes everything back, version 2 drains.
    asyncio.run_coroutine_threadsafe(
        fleet.registry.set_route(
            MODEL, {"1": 10_000, "2": 0}, actor=ACTOR, version_states={"2": VersionState.DRAINING}
        ),
        fleet.loop,
    ).result(10)
    while _version_or_refused(_complete(fleet.gateway, on_canary[0])) != "1":
        assert time.monotonic() - began < 1.0, "new requests still went to the rolled-back version after 1 s"
        time.sleep(0.02)
    for t in threads:
        t.join(60)
    assert {c: r[1:] for c, r in results.items()} == {c: ("length", "2") for c in on_canary}
    # Back to serving for the tests after this one.
    fleet.route({"1": 5_000, "2": 5_000}, **{"2": VersionState.SERVING})
    wait_until(lambda: fleet.gateway.gw.router.pools.num_in_rotation == 2, 5.0, "version 2 back in rotation")


def _version_or_refused(resp: httpx.Response) -> str:
    """The version that served it; "refused" for a request that waited at the rolled-back version when it
    left routing (503 ``model_unavailable``: a retry is routed afresh)."""
    if resp.status_code == 503:
        assert resp.json()["error"]["code"] == "model_unavailable", resp.text
        return "refused"
    assert resp.status_code == 200, resp.text
    return resp.headers["sluice-model-version"]


def _num_inferences(server: TritonServer) -> float:
    return read_metric(server.metrics_url, "nv_inference_request_success", model=MODEL) + read_metric(
        server.metrics_url, "nv_inference_request_failure", model=MODEL
    )


def test_a_replica_serving_other_weights_never_gets_a_request(fleet: Fleet) -> None:
    bad = fleet.servers["r-bad"]
    # The registry wrongly says ready (as a broken health check might): the gateway verifies for itself.
    fleet.write(
        fleet.registry.register_replica(
            "r-bad", endpoint=bad.grpc_url, model=MODEL, version="2", actor=ACTOR, state=ReplicaState.READY
        )
    )
    fleet.route({"2": 10_000, "1": 0})
    try:
        for i in range(12):
            assert _complete(fleet.gateway, f"bad-{i}").headers["sluice-model-version"] == "2"
        assert _num_inferences(bad) == 0
        with fleet.gateway.http() as http:
            report = http.get("/readyz").json()
        assert "serves weights" in report["replicas"]["r-bad"]["refused"]
        assert report["replicas"]["r-bad"]["in_rotation"] is False
    finally:
        fleet.write(fleet.registry.remove_replica("r-bad", actor=ACTOR))
        fleet.route({"1": 5_000, "2": 5_000})


def _kv_free_tokens(gateway: RunningGateway, version: str, replica: str) -> float | None:
    """The gateway's gauge of a replica's free KV tokens; None while it has no sample."""
    with gateway.http() as http:
        text = http.get("/metrics").text
    labels = {"model": MODEL, "version": version, "replica": replica}
    return next(
        (
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "sluice_gateway_replica_kv_free_tokens"
            for sample in family.samples
            if sample.labels == labels
        ),
        None,
    )


def _triton_kv_free_tokens(metrics_url: str) -> float:
    free_blocks = read_metric(metrics_url, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="free")
    return free_blocks * read_metric(
        metrics_url, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per"
    )


class _FakeMetrics(BaseHTTPRequestHandler):
    """A metrics endpoint reporting 7 free KV blocks of 16 tokens: not what any test replica reports."""

    TEXT = "".join(
        f'nv_trt_llm_kv_cache_block_metrics{{model="{MODEL}",kv_cache_block_type="{kind}"}} {value}\n'
        for kind, value in (("max", 256), ("free", 7), ("used", 249), ("tokens_per", 16))
    ) + "".join(
        f'nv_trt_llm_request_metrics{{model="{MODEL}",request_type="{kind}"}} 0\n'
        for kind in ("active", "waiting")
    )

    def do_GET(self) -> None:
        body = self.TEXT.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_each_replicas_load_is_read_from_its_registered_metrics_url(fleet: Fleet) -> None:
    fleet.route({"1": 5_000, "2": 5_000})
    for replica_id, version in (("r1", "1"), ("r2", "2")):
        server = fleet.servers[replica_id]
        expected = _triton_kv_free_tokens(server.metrics_url)  # idle: every block free
        assert expected > 0
        wait_until(
            lambda: _kv_free_tokens(fleet.gateway, version, server.grpc_url) == expected,  # noqa: B023
            5.0,
            f"the gateway's gauge of {replica_id}'s free KV tokens at {expected:g}",
        )


def test_a_replica_registered_with_another_metrics_url_is_read_from_that_one(fleet: Fleet) -> None:
    """A changed target is a new admission: the old one drains (its client closes once idle) and the new
    client, reading the new URL, takes the requests."""
    fleet.route({"1": 5_000, "2": 5_000})
    fake = ThreadingHTTPServer(("127.0.0.1", 0), _FakeMetrics)
    threading.Thread(target=fake.serve_forever, name="fake-metrics", daemon=True).start()
    r1 = fleet.servers["r1"]

    def register_r1(metrics_url: str) -> None:
        fleet.write(
            fleet.registry.register_replica(
                "r1", endpoint=r1.grpc_url, model=MODEL, version="1", actor=ACTOR, state=ReplicaState.READY,
                metrics_url=metrics_url,
            )
        )  # fmt: skip

    try:
        register_r1(f"http://127.0.0.1:{fake.server_address[1]}/metrics")
        wait_until(
            lambda: _kv_free_tokens(fleet.gateway, "1", r1.grpc_url) == 7 * 16,
            5.0,
            "r1 read from the new URL",
        )
    finally:
        register_r1(r1.metrics_url)
        fake.shutdown()
        fake.server_close()
        wait_until(lambda: fleet.gateway.gw.router.pools.num_in_rotation == 2, 10.0, "r1 back in rotation")
    wait_until(
        lambda: _kv_free_tokens(fleet.gateway, "1", r1.grpc_url) == _triton_kv_free_tokens(r1.metrics_url),
        5.0,
        "r1 read from its own metrics again",
    )


def test_the_openai_api_refuses_an_admin_token(fleet: Fleet) -> None:
    client = openai.OpenAI(
        base_url=fleet.gateway.base_url + "/v1", api_key="sladm-dev-platform-admin", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model=MODEL, prompt="hello", max_tokens=1)


def test_registry_changes_while_32_streams_run_drop_none(fleet: Fleet) -> None:
    fleet.route({"1": 5_000, "2": 5_000})
    client = fleet.gateway.client()
    outcomes: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def stream(i: int) -> None:
        chunks = list(
            client.completions.create(
                model=MODEL, prompt="hello", max_tokens=48, stream=True, extra_body={"ignore_eos": True},
                extra_headers={"X-Conversation-Id": f"s32-{i}"}, stream_options={"include_usage": True},
            )
        )  # fmt: skip
        usage = chunks[-1].usage
        finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
        with lock:
            outcomes.append((usage.completion_tokens if usage else -1, finish))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for weights in ({"1": 9_000, "2": 1_000}, {"1": 2_000, "2": 8_000}, {"1": 5_000, "2": 5_000}):
        fleet.route(weights)
        time.sleep(0.2)
    for t in threads:
        t.join(120)
    assert sorted(outcomes) == [(48, "length")] * 32
