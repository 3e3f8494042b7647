"""The CPU engine behind a real tritonserver, over gRPC streaming: what a gateway would see.

Closed loop: C streams in flight (one gRPC stream per request through tritonclient.grpc.aio), a new one
starts when one finishes; each has a distinct random prompt (no prefix-cache hits) and generates exactly
the requested tokens (ignore_eos, greedy). TTFT is from sending the request to the first response;
inter-token latency (ITL) is the gap between consecutive responses of one stream (as vLLM's
benchmark_serving counts it), so read it together with tokens per response. Printed, not written anywhere.

    .venv/bin/python -m bench.replica_bench                       # starts its own server on free ports
    .venv/bin/python -m bench.replica_bench --grpc-url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcclient

from bench.report import pct
from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, optional_float, render_model_repository
from sluice.triton.client import GenerateStream, request_tensors


@dataclass
class Timeline:
    sent_s: float
    response_times_s: list[float] = field(default_factory=list)
    num_tokens: int = 0


async def run_load(
    grpc_url: str,
    model: str,
    concurrency: int,
    num_requests: int,
    prompt_len: int,
    output_len: int,
    seed: int,
) -> tuple[list[Timeline], float]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 8192, prompt_len).tolist() for _ in range(num_requests + 1)]
    client = grpcclient.InferenceServerClient(grpc_url)

    async def one(prompt: list[int]) -> Timeline:
        timeline = Timeline(time.perf_counter())
        tensors = request_tensors(prompt, output_len, ignore_eos=True, cache_scope="bench")
        async with GenerateStream(client, model, tensors, timeout_s=600) as stream:
            async for chunk in stream:
                timeline.response_times_s.append(time.perf_counter())
                timeline.num_tokens += len(chunk.token_ids)
        return timeline

    try:
        await one(prompts.pop())  # warm-up: first-call costs out of the measurement
        queue: asyncio.Queue[list[int]] = asyncio.Queue()
        for prompt in prompts:
            queue.put_nowait(prompt)
        timelines: list[Timeline] = []

        async def worker() -> None:
            while not queue.empty():
                timelines.append(await one(queue.get_nowait()))

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return timelines, time.perf_counter() - began
    finally:
        await client.close()


def scrape(metrics_url: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in urllib.request.urlopen(metrics_url, timeout=5).read().decode().splitlines():
        if line.startswith("sluice_engine_"):
            name = line.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def free_ports(count: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def report(
    timelines: list[Timeline], elapsed_s: float, before: dict[str, float], after: dict[str, float]
) -> None:
    ttft_ms = [(t.response_times_s[0] - t.sent_s) * 1000 for t in timelines]
    itl_ms = [float(d) * 1000 for t in timelines for d in np.diff(t.response_times_s)]
    num_tokens = sum(t.num_tokens for t in timelines)
    num_responses = sum(len(t.response_times_s) for t in timelines)
    steps = after.get("sluice_engine_steps_total", 0) - before.get("sluice_engine_steps_total", 0)
    step_ms = after.get("sluice_engine_step_ms_total", 0) - before.get("sluice_engine_step_ms_total", 0)
    preemptions = after.get("sluice_engine_preemptions_total", 0) - before.get(
        "sluice_engine_preemptions_total", 0
    )
    print(f"requests            {len(timelines)} in {elapsed_s:.1f} s")
    print(f"output tok/s        {num_tokens / elapsed_s:,.0f}")
    print(f"TTFT ms p50 / p95   {pct(ttft_ms, 50):.1f} / {pct(ttft_ms, 95):.1f}")
    print(f"ITL ms p50 / p95    {pct(itl_ms, 50):.1f} / {pct(itl_ms, 95):.1f}   (between responses)")
    print(f"responses/s         {num_responses / elapsed_s:,.0f}")
    print(f"tokens per response {num_tokens / num_responses:.2f}")
    if steps:
        print(
            f"engine steps        {steps:.0f}, mean {step_ms / steps:.1f} ms, {preemptions:.0f} preemptions"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", type=Path, default=Path(".sluice/models/sluice-tiny"))
    ap.add_argument("--grpc-url", help="use this running server instead of starting one")
    ap.add_argument("--metrics-url", help="its metrics endpoint (with --grpc-url)")
    ap.add_argument("--model", default=CpuEngineModelSettings.model_name)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--step-token-budget", type=int, default=CpuEngineModelSettings.step_token_budget)
    ap.add_argument(
        "--prefill-step-stretch",
        type=optional_float,
        default=CpuEngineModelSettings.prefill_step_stretch,
        help="a step with prefill takes at most about this many decode-only steps ('none': no limit)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(
        f"{args.concurrency} concurrent streams, {args.requests} requests, {args.prompt_len} prompt + "
        f"{args.output_len} output tokens (ignore_eos, greedy), {os.cpu_count()} cores"
    )
    load = (args.model, args.concurrency, args.requests, args.prompt_len, args.output_len, args.seed)
    if args.grpc_url:
        before = scrape(args.metrics_url) if args.metrics_url else {}
        timelines, elapsed = asyncio.run(run_load(args.grpc_url, *load))
        report(timelines, elapsed, before, scrape(args.metrics_url) if args.metrics_url else {})
        return
    with tempfile.TemporaryDirectory(prefix="replica-bench-") as tmp:
        num_blocks = args.concurrency * (args.prompt_len + args.output_len) // 16 + 256
        settings = CpuEngineModelSettings(
            checkpoint_dir=args.checkpoint_dir,
            num_kv_blocks=num_blocks,
            step_token_budget=args.step_token_budget,
            prefill_step_stretch=args.prefill_step_stretch,
        )
        render_model_repository(Path(tmp) / "repo", settings)
        http, grpc, metrics = free_ports(3)
        config = TritonServerConfig(
            model_repository=Path(tmp) / "repo",
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            state_dir=Path(tmp) / "state",
        )
        with TritonServer(config) as server:
            before = scrape(server.metrics_url)
            timelines, elapsed = asyncio.run(run_load(server.grpc_url, *load))
            report(timelines, elapsed, before, scrape(server.metrics_url))


if __name__ == "__main__":
    main()
