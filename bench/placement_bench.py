"""Prefix-affinity placement against the baselines (issue 12): the prefix-cache hit rate, TTFT and tok/s
of the same closed-loop workload through a gateway routing by the registry over local tritonservers, one
gateway per ``SLUICE_ROUTER_PLACEMENT`` (``score``, ``least_loaded``, ``random``).

Workload: ``--tenants`` tenants x ``--prompts-per-tenant`` system prompts of ``--system-tokens`` tokens,
each request one of them (uniformly) + a random user suffix of ``--suffix-tokens``, ``--output-tokens``
out (ignore_eos), ``--concurrency`` streams in a closed loop, ``--requests`` per run. Every run draws
fresh system prompts (same shape, same request order within a round), so no run finds another's prefixes
in a replica's cache; runs alternate between placements, the order rotated each round.

Each replica's KV (``--kv-blocks``, 16 tokens a block) holds about a third of all the system prompts
beside its running work: a replica that sees every prompt (random, least loaded) evicts them, one that
sees its own share (affinity) keeps them. The hit rate is the replicas' own count: cached / prompt
tokens over the run's requests (the gateway's telemetry ``cached_tokens``, from each final response's
``num_cached_tokens``); TTFT and tok/s are the client's.

    .venv/bin/python -m bench.placement_bench [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.e2e_bench import plain_prompt_ids
from bench.placement_workload import (
    RunResult,
    Workload,
    comparison,
    hit_rate,
    make_workload,
    max_hit_rate,
    summary_table,
    tenant_ids,
)
from bench.report import cpu_description, cpu_flags, pct, write_measured
from bench.servers import REPO_ROOT, http_ok, http_text, log, proc_id, stop_tree
from cpu_engine.devckpt import write_checkpoint
from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.settings import Settings
from sluice.stores.openers import open_tenant_store
from sluice.stores.registry.base import ReplicaState, VersionState
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.stores.tenants.base import dev_tenant
from sluice.weights_digest import weights_digest

SECTION = "placement"
PLACEMENTS = ("score", "least_loaded", "random")
MODEL = "sluice-tiny"
ACTOR = "placement-bench"


# ----- the servers -----
def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def start_replica(root: Path, checkpoint: Path, replica_id: str, num_kv_blocks: int) -> TritonServer:
    """A tritonserver serving the dev checkpoint as version 1, its engine on one thread."""
    repo = root / f"repo-{replica_id}"
    settings = CpuEngineModelSettings(
        checkpoint_dir=checkpoint, model_version=1, num_kv_blocks=num_kv_blocks, stats_interval_ms=50
    )
    render_model_repository(repo, settings)
    http, grpc, metrics = _free_ports(3)
    config = TritonServerConfig(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=root / "triton",
        shm_prefix=f"sluice_placement_{os.getpid()}_{replica_id}_",
        ready_timeout_s=180.0,
        exit_timeout_s=1,
        stop_timeout_s=10,
        engine_num_threads=1,  # three replicas share a small machine: none may take every core
    )
    server = TritonServer(config)
    server.start()
    return server


def api_key(tenant_id: str) -> str:
    return f"sk-{tenant_id}"


async def seed_state(
    settings: Settings, servers: dict[str, TritonServer], checkpoint: Path, tenants: Sequence[str]
) -> None:
    """The registry (one version, ``servers`` its ready replicas, all traffic on it) and ``tenants``."""
    registry = SqliteRegistry(settings.sqlite_path)
    await registry.open()
    try:
        await registry.create_model(MODEL, actor=ACTOR)
        await registry.add_version(
            MODEL, "1", artifact_uri=checkpoint.as_uri(), weights_digest=weights_digest(checkpoint),
            build_config={"seed": 0}, actor=ACTOR,
        )  # fmt: skip
        for state in (VersionState.WARMING, VersionState.SERVING):
            await registry.set_version_state(MODEL, "1", state, actor=ACTOR)
        for replica_id, server in servers.items():
            await registry.register_replica(
                replica_id, endpoint=server.grpc_url, model=MODEL, version="1", actor=ACTOR,
                state=ReplicaState.READY, metrics_url=server.metrics_url,
            )  # fmt: skip
        await registry.set_route(MODEL, {"1": 10_000}, actor=ACTOR)
    finally:
        await registry.close()
    store = await open_tenant_store(settings)
    try:
        for tenant_id in tenants:
            await store.put_tenant(dev_tenant(tenant_id))
            await store.add_key(tenant_id, api_key(tenant_id))
    finally:
        await store.close()


class Gateway:
    """``python -m gateway`` following the registry under ``state_dir`` with one placement rule, in its
    own session; ``stop()`` sends SIGTERM, then SIGKILLs what is left of its tree."""

    def __init__(self, state_dir: Path, checkpoint: Path, placement: str, log_dir: Path) -> None:
        self.placement = placement
        self.port = _free_ports(1)[0]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.telemetry_path = state_dir / f"telemetry-{placement}.jsonl"
        self.log_path = log_dir / f"gateway-{placement}.log"
        self._env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
            "SLUICE_STATE_DIR": str(state_dir),
            "SLUICE_CHECKPOINT_DIR": str(checkpoint),
            "SLUICE_GATEWAY_PORT": str(self.port),
            "SLUICE_ENGINE_CLIENT": "triton",
            "SLUICE_ROUTING": "registry",
            "SLUICE_REGISTRY_POLL_INTERVAL_S": "1",
            "SLUICE_TELEMETRY_PATH": str(self.telemetry_path),
            "SLUICE_ROUTER_PLACEMENT": placement,
        }
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gateway"],
                cwd=REPO_ROOT,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_routing(self, num_replicas: int, timeout_s: float = 120.0) -> None:
        """Until it answers and reads the load of all ``num_replicas`` replicas (its metrics name each)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is None or self._proc.poll() is not None:
                raise RuntimeError(f"gateway {self.placement} exited:\n{self.log_path.read_text()[-3000:]}")
            if http_ok(f"{self.base_url}/readyz"):
                metrics = http_text(f"{self.base_url}/metrics")
                lines = [
                    m for m in metrics.splitlines() if m.startswith("sluice_gateway_replica_kv_free_tokens{")
                ]
                if len(lines) >= num_replicas:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway {self.placement} did not see {num_replicas} replicas")
            time.sleep(0.5)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        root = proc_id(proc.pid) if proc.returncode is None else None
        if root is not None:
            stop_tree(root, signal.SIGTERM, 20.0, proc.poll)
        proc.wait()


# ----- a run -----
@dataclass(frozen=True)
class Sent:
    request_id: str  # the completion id (the telemetry's request_id)
    ttft_ms: float
    num_output_tokens: int


async def one_request(client: httpx.AsyncClient, tenant_id: str, prompt: list[int], max_tokens: int) -> Sent:
    body = {
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {api_key(tenant_id)}"}
    sent_s = time.perf_counter()
    first_s: float | None = None
    request_id, num_tokens = "", 0
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            request_id = chunk.get("id", request_id)
            if first_s is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first_s = time.perf_counter()
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
    if first_s is None or not request_id:
        raise RuntimeError("a stream ended without a token or an id")
    return Sent(request_id, (first_s - sent_s) * 1000, num_tokens)


async def drive(
    base_url: str, workload: Workload, concurrency: int, max_tokens: int
) -> tuple[list[Sent], float]:
    """The workload's items in order through ``concurrency`` closed-loop streams; (results, seconds)."""
    pending = list(reversed(workload.items))
    sent: list[Sent] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as client:

        async def stream() -> None:
            while pending:
                item = pending.pop()
                sent.append(await one_request(client, item.tenant_id, workload.prompt(item), max_tokens))

        began_s = time.perf_counter()
        await asyncio.gather(*(stream() for _ in range(concurrency)))
        return sent, time.perf_counter() - began_s


def read_records(path: Path, request_ids: set[str], timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """The telemetry records of ``request_ids`` (its writer thread appends them shortly after each ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        records = [r for r in map(json.loads, lines) if r["request_id"] in request_ids]
        if len(records) == len(request_ids):
            return records
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(request_ids) - len(records)} telemetry records missing in {path}")
        time.sleep(0.2)


def measure(
    gateway: Gateway, workload: Workload, args: argparse.Namespace, round_index: int, names: dict[str, str]
) -> RunResult:
    """One run of ``workload`` through ``gateway``; ``names``: each replica's endpoint -> its id."""
    sent, elapsed_s = asyncio.run(drive(gateway.base_url, workload, args.concurrency, args.output_tokens))
    records = read_records(gateway.telemetry_path, {s.request_id for s in sent})
    ttfts_ms = [s.ttft_ms for s in sent]
    result = RunResult(
        placement=gateway.placement,
        round_index=round_index,
        hit_rate=hit_rate(records),
        ttft_p50_ms=pct(ttfts_ms, 50),
        ttft_p95_ms=pct(ttfts_ms, 95),
        tokens_per_s=sum(s.num_output_tokens for s in sent) / elapsed_s,
        num_requests=len(sent),
        num_by_replica=dict(Counter(names.get(r["replica"], r["replica"]) for r in records)),
    )
    log(
        f"round {round_index} {gateway.placement}: hit {100 * result.hit_rate:.1f}%, TTFT p50 "
        f"{result.ttft_p50_ms:.0f} p95 {result.ttft_p95_ms:.0f} ms, {result.tokens_per_s:.0f} tok/s, "
        f"{elapsed_s:.1f} s"
    )
    return result


# ----- the benchmark -----
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--prompts-per-tenant", type=int, default=3)
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--suffix-tokens", type=int, default=8)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=384, help="per run")
    ap.add_argument("--kv-blocks", type=int, default=160, help="per replica, 16 tokens each")
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--write-docs", action="store_true", help=f"write section {SECTION!r} of docs/benchmarks.md"
    )
    args = ap.parse_args(argv)
    args.placements = args.placements.split(",")
    if unknown := set(args.placements) - set(PLACEMENTS):
        ap.error(f"unknown placements {sorted(unknown)}; known: {', '.join(PLACEMENTS)}")
    if min(args.replicas, args.rounds, args.concurrency, args.requests, args.kv_blocks) < 1:
        ap.error("replicas, rounds, concurrency, requests and kv-blocks must be >= 1")
    return args


@dataclass(frozen=True)
class Fleet:
    gateways: dict[str, Gateway]  # placement -> its gateway
    names: dict[str, str]  # replica endpoint (as the telemetry names it) -> replica id
    checkpoint: Path


@contextlib.contextmanager
def running_fleet(root: Path, args: argparse.Namespace) -> Iterator[Fleet]:
    """Replicas, the registry and tenants, and one gateway per placement, all stopped on the way out."""
    checkpoint = write_checkpoint(root / "checkpoint", seed=0)
    servers: dict[str, TritonServer] = {}
    gateways: dict[str, Gateway] = {}
    try:
        ids = [f"r{i + 1}" for i in range(args.replicas)]
        for replica_id in ids:
            # NOTE: one after another from this thread: a server dies with the thread that started it
            # (the launcher's parent-death signal), so a pool's worker threads would take them down.
            servers[replica_id] = start_replica(root, checkpoint, replica_id, args.kv_blocks)
        log(f"{len(servers)} replicas ready")
        for placement in args.placements:
            # NOTE: a state directory (registry, tenants, usage outbox) per gateway: a gateway holds its
            # outbox alone; each directory's registry names the same replicas.
            state_dir = root / f"state-{placement}"
            state_dir.mkdir()
            settings = Settings(state_dir=state_dir, checkpoint_dir=checkpoint)
            asyncio.run(seed_state(settings, servers, checkpoint, tenant_ids(args.tenants)))
            gateways[placement] = Gateway(state_dir, checkpoint, placement, root)
            gateways[placement].start()
        for gateway in gateways.values():
            gateway.wait_routing(len(servers))
        log(f"gateways ready: {', '.join(f'{p} {g.base_url}' for p, g in gateways.items())}")
        yield Fleet(gateways, {s.grpc_url: replica_id for replica_id, s in servers.items()}, checkpoint)
    finally:
        for gateway in gateways.values():
            gateway.stop()
        for server in servers.values():
            server.stop()


def run_rounds(args: argparse.Namespace, fleet: Fleet) -> list[RunResult]:
    """Every placement once a round, in a rotated order; each run with its own system prompts."""
    pool = plain_prompt_ids(fleet.checkpoint)
    results: list[RunResult] = []
    for round_index in range(args.rounds):
        shift = round_index % len(args.placements)
        order = args.placements[shift:] + args.placements[:shift]  # rotated: no placement always goes first
        for placement in order:
            run_seed = (args.seed * 1_000 + round_index) * len(PLACEMENTS) + PLACEMENTS.index(placement)
            workload = make_workload(
                pool, args.tenants, args.prompts_per_tenant, args.system_tokens, args.suffix_tokens,
                args.requests, prompts_seed=run_seed, items_seed=args.seed * 1_000 + round_index,
            )  # fmt: skip
            results.append(measure(fleet.gateways[placement], workload, args, round_index, fleet.names))
    return results


def report_lines(args: argparse.Namespace, results: list[RunResult]) -> list[str]:
    return [
        f"CPU: {cpu_description()} (flags: {cpu_flags()}); {args.replicas} tritonservers with the dev "
        f"checkpoint, engine on 1 thread each, {args.kv_blocks} KV blocks of 16 tokens per replica; "
        f"one gateway per placement (SLUICE_ROUTER_PLACEMENT), routing by the registry.",
        "",
        f"Workload: {args.tenants} tenants x {args.prompts_per_tenant} system prompts of "
        f"{args.system_tokens} tokens + a {args.suffix_tokens}-token random suffix, "
        f"{args.output_tokens} tokens out, "
        f"{args.concurrency} closed-loop streams, {args.requests} requests a run, {args.rounds} rounds "
        "(fresh system prompts every run). Median over the rounds [min-max]; hit rate = cached / prompt "
        "tokens as the replicas report them; TTFT and tok/s at the client.",
        "",
        *summary_table(results, args.placements),
        "",
        f"{comparison(results, args.placements)} The most a request can hit is "
        f"{100 * max_hit_rate(args.system_tokens, args.suffix_tokens):.0f}% (its system prompt's full "
        "blocks); each run also starts with every prompt cold. The dev model's prefill is cheap, so a hit "
        "saves less TTFT here than with a real model; the three replicas, the gateways and the client "
        "share the machine's cores.",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench.placement_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    with (
        tempfile.TemporaryDirectory(prefix="sluice-placement-") as tmp,
        running_fleet(Path(tmp), args) as fleet,
    ):
        results = run_rounds(args, fleet)
    lines = report_lines(args, results)
    print("\n".join(lines))
    if args.write_docs:
        write_measured(SECTION, command.strip(), lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
