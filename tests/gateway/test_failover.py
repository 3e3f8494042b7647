"""Failover end to end (issue 12, deliverable 4): two real tritonservers serving version 1 of the dev model,
a gateway routing by a PostgreSQL registry (its usage ledger in the same database), the control plane's
health checker over that registry, and 40 streams from the official openai client in flight when one
replica's whole process group (tritonserver and its Python backend stub) is killed with SIGKILL.

The replicas run at most 4 sequences each and the gateway leaves at most 4 more waiting in each. The replica
is frozen (SIGSTOP) mid-generation first, so at the kill some requests are producing on it, some wait inside
it without a token, and the rest wait in the gateway. Then:

- every request ends within a bound: it completes, or (its client had read text from the dead replica) its
  stream ends with an error event the SDK raises; none that had no token fails, as those are re-dispatched
  (and so is one with tokens whose text had not gone out yet: CI once froze the replica on only such);
- the ledger holds exactly one usage row per request, with the tokens and outcome its telemetry record
  names (the errored streams billed for what they produced);
- the requests re-dispatched after the kill finished on the surviving replica;
- once the health checker failed the dead replica in the registry, a new batch goes only to the survivor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import openai
import psycopg
import pytest
from harness import MODEL, RunningGateway, start_gateway, wait_until
from metrics_text import read_metric
from ports import free_ports
from prometheus_client import CollectorRegistry

from gateway.scheduling.scheduler import ModelScheduler
from replicas.health import HealthChecker, ReplicaStates
from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.stores.registry.base import ReplicaState, VersionState
from sluice.stores.registry.postgres import PostgresRegistry
from sluice.weights_digest import weights_digest

ACTOR = "test-failover"
NUM_STREAMS = 40  # a loaded suite needs several tries before the streams run out (seen: one in 30 s)
MAX_TOKENS = 256  # long enough that requests pile up inside the replicas faster than they drain
HEALTH_INTERVAL_S = 1.0
T = TypeVar("T")


@dataclass
class Fleet:
    gateway: RunningGateway
    registry: PostgresRegistry
    loop: asyncio.AbstractEventLoop  # the registry's and the health checker's (a loop of its own)
    servers: dict[str, TritonServer]  # replica id -> its server
    database: str

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)


@dataclass
class StreamResult:
    first_token_s: float | None = None  # time.monotonic() of its first text
    num_text_chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None  # the SDK's error, if the stream ended with one
    request_id: str = ""
    usage_tokens: int | None = None


def _server(repo: Path, state_dir: Path, tag: str) -> TritonServer:
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        TritonServerConfig(
            model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics, state_dir=state_dir,
            shm_prefix=f"sluice_failover_{os.getpid()}_{tag}_", exit_timeout_s=1, stop_timeout_s=10,
        )
    )  # fmt: skip
    server.start()
    return server


@pytest.fixture
def fleet(database: str, dev_checkpoint: Path, tmp_path: Path) -> Iterator[Fleet]:
    repo = tmp_path / "repo"
    render_model_repository(
        repo,
        CpuEngineModelSettings(
            checkpoint_dir=dev_checkpoint, num_kv_blocks=256, max_num_running=4, stats_interval_ms=20
        ),
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="registry-loop", daemon=True)
    thread.start()
    registry = PostgresRegistry(database, pool_max_size=3)
    # NOTE: a probe waits behind the busy replica's running sequences: a generous timeout, so only the
    # dead replica fails its checks. The liveness check's timeout outlasts the test's freeze attempts
    # (2 s, _freeze_a_busy_replica): a replica frozen while the test looks for the right moment, then let
    # go, must not be failed meanwhile (under a loaded suite it was, and no replica was left to freeze).
    health = HealthChecker(
        ReplicaStates(registry), CollectorRegistry(), interval_s=HEALTH_INTERVAL_S,
        check_timeout_s=4.0, probe_timeout_s=20.0,
    )  # fmt: skip
    servers: dict[str, TritonServer] = {}
    gateway = None

    def call(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    try:
        for replica_id in ("r1", "r2"):
            servers[replica_id] = _server(repo, tmp_path / "triton", replica_id)
        call(_seed(registry, dev_checkpoint, servers))
        call(health.start())
        gateway = start_gateway(
            tmp_path / "gateway",
            dev_checkpoint,
            engine_client="triton",
            routing="registry",
            database_url=database,
            registry_poll_interval_s=1.0,
            max_prompt_tokens=256,
            max_output_tokens=256,
            max_waiting_per_replica=4,
            itl_target_ms=10_000,  # a loaded 2-core machine must not shut the ITL gate
        )
        wait_until(lambda: gateway.gw.router.pools.num_in_rotation == 2, 15.0, "both replicas in rotation")
        yield Fleet(gateway, registry, loop, servers, database)
    finally:
        if gateway is not None:
            gateway.stop()
        call(health.close())
        call(registry.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        for server in servers.values():
            server.stop()


async def _seed(registry: PostgresRegistry, checkpoint: Path, servers: dict[str, TritonServer]) -> None:
    await registry.open()
    await registry.create_model(MODEL, actor=ACTOR)
    await registry.add_version(
        MODEL, "1", artifact_uri=checkpoint.as_uri(), weights_digest=weights_digest(checkpoint),
        build_config={"seed": 0}, actor=ACTOR,
    )  # fmt: skip
    await registry.set_version_state(MODEL, "1", VersionState.WARMING, actor=ACTOR)
    await registry.set_version_state(MODEL, "1", VersionState.SERVING, actor=ACTOR)
    for replica_id, server in servers.items():
        await registry.register_replica(
            replica_id, endpoint=server.grpc_url, model=MODEL, version="1", actor=ACTOR,
            state=ReplicaState.READY, metrics_url=server.metrics_url,
        )  # fmt: skip
    await registry.set_route(MODEL, {"1": 10_000}, actor=ACTOR)


def _stream(client: openai.OpenAI, outcome: StreamResult) -> None:
    try:
        stream = client.completions.create(
            model=MODEL, prompt="hello", max_tokens=MAX_TOKENS, stream=True, extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            outcome.request_id = chunk.id
            if chunk.usage is not None:
                outcome.usage_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.text and outcome.first_token_s is None:
                    outcome.first_token_s = time.monotonic()
                outcome.num_text_chunks += bool(choice.text)
                outcome.finish_reason = choice.finish_reason or outcome.finish_reason
    except openai.APIError as exc:  # an error event after text, or an HTTP error before any
        outcome.error = f"{type(exc).__name__}: {exc}"


def _ledger(database: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(database) as conn:
        return conn.execute("SELECT request_id, output_tokens, status FROM usage").fetchall()


def _producing(server: TritonServer) -> bool:
    """Running 3 sequences or more of its 4, as its engine reports them (every 20 ms)."""
    metric = "nv_trt_llm_request_metrics"
    active = read_metric(server.metrics_url, metric, model=MODEL, request_type="active")  # waiting included
    waiting = read_metric(server.metrics_url, metric, model=MODEL, request_type="waiting")
    return active - waiting >= 3


def _holds_both(scheduler: ModelScheduler, endpoint: str, until_s: float) -> bool:
    """Whether, before ``until_s``, the gateway holds on ``endpoint`` a request with tokens and one
    without (polled every 0.5 ms: the second lasts a few ms)."""
    while time.monotonic() < until_s:
        with_tokens, without = scheduler.in_flight_at(endpoint)
        if with_tokens and without:
            return True
        time.sleep(0.0005)
    return False


def _fails_and_redispatches(
    held: tuple[frozenset[str], frozenset[str]], outcomes: list[StreamResult]
) -> bool:
    """Whether a kill now both fails a stream and re-dispatches a request: ``held`` (what the gateway holds
    on the frozen replica: the ids with a first token, without) has a request whose text its client has
    read, and one with no token. A request with tokens but no text sent yet (the output screen or an
    unfinished character held it back) is re-dispatched like one without: the client has seen nothing."""
    with_tokens, without = held
    streaming = {o.request_id for o in outcomes if o.first_token_s is not None}
    return bool(with_tokens & streaming) and bool(without)


def _freeze_a_busy_replica(fleet: Fleet, outcomes: list[StreamResult], deadline_s: float) -> str:
    """Stop (SIGSTOP) a replica mid-generation and return its id, once the gateway holds on it, frozen,
    both a stream whose text its client has read and a request with no token: at the kill the first fails
    after its text and the second is re-dispatched.

    NOTE: a replica cannot simply be killed when its engine reports requests running and waiting: on a fast
    CPU the engine makes a stream's 256 tokens in a fraction of a second, well before the gateway has read
    them, so a kill "mid-generation" found every stream on it already whole in the gateway's buffers (and
    its waiting requests live for milliseconds). Frozen, what it has sent is read and released within a
    moment; what stays in flight on it did not get all its tokens and never will.
    """
    scheduler = fleet.gateway.gw.router.pools.scheduler(MODEL, "1")
    assert scheduler is not None
    tried: list[tuple[str, int, int]] = []  # (replica, requests with tokens and without held when let go)
    while time.monotonic() < deadline_s:
        producing = [rid for rid, server in fleet.servers.items() if _producing(server)]
        if not producing:
            time.sleep(0.01)
            continue
        replica_id = producing[0]
        server = fleet.servers[replica_id]
        assert server.pid is not None
        # Frozen the moment the gateway holds both on it: a request waits on a replica only between its
        # dispatch and its first token (the gateway sends no more than the replica runs), a few ms on a
        # fast CPU, which a freeze at an arbitrary moment rarely meets (seen: 15 tries in 30 s, none).
        if not _holds_both(scheduler, server.grpc_url, until_s=min(deadline_s, time.monotonic() + 1.0)):
            continue
        os.killpg(server.pid, signal.SIGSTOP)  # tritonserver and its Python backend stub
        # Settled: what the gateway holds on it unchanged for 0.3 s (its buffered tokens read).
        held, settled_s, frozen_until_s = (
            scheduler.in_flight_at(server.grpc_url),
            time.monotonic(),
            time.monotonic() + 2,
        )
        while time.monotonic() < frozen_until_s:
            time.sleep(0.02)
            now = scheduler.in_flight_at(server.grpc_url)
            if now != held:
                held, settled_s = now, time.monotonic()
            elif time.monotonic() - settled_s >= 0.3:
                if _fails_and_redispatches(held, outcomes):
                    return replica_id
                break  # settled without both (the waiting one got its first token first): try again at once
        os.killpg(server.pid, signal.SIGCONT)  # its streams ended or none waits on it: look again
        tried.append((replica_id, len(held[0]), len(held[1])))
    raise AssertionError(
        f"no replica could be frozen with a stream producing and a request waiting on it; tried {tried}"
    )


def test_killing_one_of_two_replicas_with_40_streams_in_flight(fleet: Fleet) -> None:
    gateway = fleet.gateway
    client = gateway.client(timeout=60)
    outcomes = [StreamResult() for _ in range(NUM_STREAMS)]
    threads = [threading.Thread(target=_stream, args=(client, o), daemon=True) for o in outcomes]
    for t in threads:
        t.start()

    dead_id = _freeze_a_busy_replica(fleet, outcomes, deadline_s=time.monotonic() + 30)
    (survivor_id,) = set(fleet.servers) - {dead_id}
    dead, survivor = fleet.servers[dead_id], fleet.servers[survivor_id]
    assert dead.pid is not None
    os.killpg(dead.pid, signal.SIGKILL)  # tritonserver and its Python backend stub, frozen as they were
    killed_s = time.monotonic()
    for t in threads:
        t.join(timeout=max(1.0, killed_s + 45 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a request hung after the replica died"

    errored = [o for o in outcomes if o.error is not None]
    completed = [o for o in outcomes if o.error is None]
    assert all(o.finish_reason == "length" and o.usage_tokens == MAX_TOKENS for o in completed), completed
    # Streams producing on the dead replica end with an error: an event after their text, which the SDK
    # raises, or, for one whose tokens had made no text yet (held back, e.g. the start of a multi-byte
    # character), no event had been sent: a 500 engine_error (seen once in a loaded suite).
    assert errored, "no stream producing on the dead replica failed"
    assert all(o.first_token_s is not None or "engine_error" in (o.error or "") for o in errored), errored

    # Written in each request's ``finally``, the usage row last: maybe just after its response ended.
    wait_until(lambda: len(_ledger(fleet.database)) >= NUM_STREAMS, 10, "every request's usage row")
    records = {r["request_id"]: r for r in gateway.telemetry()}
    assert len(records) == NUM_STREAMS and {o.request_id for o in completed} <= set(records)
    failed = [r for r in records.values() if r["outcome"] == "failed"]
    assert len(failed) == len(errored)
    # Only a request that had tokens from the dead replica failed: any without a token was re-dispatched
    # (or was still queued in the gateway) and completed.
    assert all(r["output_tokens"] > 0 and r["failed_replicas"] == [dead.grpc_url] for r in failed), failed
    rows = _ledger(fleet.database)
    assert sorted(r[0] for r in rows) == sorted(records)  # one usage row per request, none twice
    for request_id, output_tokens, status in rows:
        record = records[request_id]
        assert (output_tokens, status) == (record["output_tokens"], record["outcome"]), record

    redispatched = [r for r in records.values() if r["num_dispatches"] > 1]
    metrics_url = gateway.base_url + "/metrics"
    assert read_metric(metrics_url, "sluice_gateway_redispatches_total") == sum(
        r["num_dispatches"] - 1 for r in records.values()
    )
    assert read_metric(metrics_url, "sluice_gateway_replica_suspensions_total") >= 1
    assert redispatched, "no request waiting inside the dead replica was re-dispatched"
    assert all(
        r["outcome"] == "finished"
        and r["replica"] == survivor.grpc_url
        and dead.grpc_url in r["failed_replicas"]
        for r in redispatched
    ), redispatched

    # The control plane fails it within a health round; the gateway follows and drains it.
    def dead_failed() -> bool:
        return fleet.call(fleet.registry.get_replica(dead_id)).state == ReplicaState.FAILED

    wait_until(dead_failed, 10 * HEALTH_INTERVAL_S, "the health check failing the dead replica")
    wait_until(lambda: gateway.gw.router.pools.num_in_rotation == 1, 5.0, "the gateway draining it")
    after = [client.completions.create(model=MODEL, prompt="hello", max_tokens=2).id for _ in range(8)]
    records = {r["request_id"]: r for r in gateway.telemetry()}
    assert {records[i]["replica"] for i in after} == {survivor.grpc_url}
    assert {records[i]["num_dispatches"] for i in after} == {1}
