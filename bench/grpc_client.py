"""What the gateway's gRPC client costs before any Sluice code runs, against a FAKE replica
(bench/fake_replica.py: Triton's gRPC protocol, no engine): client CPU per request start and per
streamed message, this process pinned to one core (``--client-cpu``), the fake on another.

- **starting a stream**: a 2-token request, ``--concurrency`` at a time, the fake sending at once: through
  tritonclient's ``stream_infer`` (an async iterator of request dicts, its own task to consume it, a write
  and a half-close) against ``sluice.triton.client``'s ``open_stream`` (``ModelStreamInfer`` made as a
  unary-stream call, the request built straight into its protobuf: one batch). What
  ``GenerateStream`` did before and does now.
- **receiving a message**: ``--streams`` concurrent 64-token requests, one token per message every
  ``--interval-ms`` (25 tok/s: the seed's stream), CPU per message received (the start included, 1/64 of
  it): grpc.aio (grpcio, what the gateway uses) against grpclib (pure-Python asyncio gRPC over h2), the
  two maintained asyncio gRPC clients on PyPI. grpclib is not a dependency: it is measured when installed
  (``.venv/bin/pip install grpclib``) and left out otherwise.

Both read the same responses and decode them with ``chunk_from_response``.

    flock /tmp/sluice-bench.lock .venv/bin/python -m bench.grpc_client [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import service_pb2

from bench import fake_replica
from bench.report import cpu_description, cpu_flags, write_section
from sluice.triton.client import (
    MODEL_STREAM_INFER,
    GenerateStream,
    chunk_from_response,
    infer_request,
    open_stream,
    request_tensors,
    to_infer_inputs,
)

MODEL = "sluice-tiny"
PROMPT = list(range(3, 35))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tensors(max_tokens: int) -> dict[str, Any]:
    return request_tensors(PROMPT, max_tokens, cache_scope="bench", priority=1)


async def cpu_per_call_us(one: Callable[[int], Awaitable[None]], n: int, concurrency: int) -> float:
    """Client CPU per call of ``one``, ``n`` calls ``concurrency`` at a time, after a discarded warm-up."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> None:
        async with gate:
            await one(i)

    await asyncio.gather(*(gated(i) for i in range(min(n, concurrency))))
    began = cpu_s()
    await asyncio.gather(*(gated(i) for i in range(n)))
    return (cpu_s() - began) / n * 1e6


async def start_us(port: int, how: str, n: int, concurrency: int) -> float:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

    async def via_tritonclient(i: int) -> None:
        # What GenerateStream did before: tritonclient's stream over an async iterator of request dicts.
        request = {"model_name": MODEL, "inputs": to_infer_inputs(tensors(2)), "request_id": f"r{i}"}

        async def one_request() -> Any:
            yield request

        async for response in client.stream_infer(one_request())._grpc_call:
            chunk_from_response(response)

    async def via_open_stream(i: int) -> None:
        async with GenerateStream(client, MODEL, tensors(2), f"r{i}") as stream:
            async for chunk in stream:
                if chunk.finish_reason is not None:
                    stream.finished()

    try:
        return await cpu_per_call_us(via_tritonclient if how == "old" else via_open_stream, n, concurrency)
    finally:
        await client.close()


async def receive_us(port: int, library: str, streams: int, requests: int, tokens: int) -> float:
    """Client CPU per message received, ``streams`` 64-token requests at a time."""
    if library == "grpc.aio":
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

        async def one(i: int) -> None:
            async for response in open_stream(client, infer_request(MODEL, tensors(tokens), f"r{i}"), None):
                chunk_from_response(response)

        try:
            return await cpu_per_call_us(one, requests, streams) / tokens
        finally:
            await client.close()
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    channel = Channel("127.0.0.1", port)

    async def one_grpclib(i: int) -> None:
        async with channel.request(
            MODEL_STREAM_INFER,
            Cardinality.STREAM_STREAM,
            service_pb2.ModelInferRequest,
            service_pb2.ModelStreamInferResponse,
        ) as stream:
            await stream.send_message(infer_request(MODEL, tensors(tokens), f"r{i}"), end=True)
            async for response in stream:
                chunk_from_response(response)

    try:
        return await cpu_per_call_us(one_grpclib, requests, streams) / tokens
    finally:
        channel.close()


def with_fake(
    interval_s: float, fake_cpu: int, run: Callable[[int], Coroutine[Any, Any, float]], port: int
) -> float:
    stats = fake_replica.FakeStats()
    proc = fake_replica.start_process(port, fake_replica.FakeConfig(interval_s=interval_s), stats, {fake_cpu})
    try:
        return asyncio.run(run(port))
    finally:
        proc.terminate()
        proc.join(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9021)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--fake-cpu", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000, help="stream starts per round")
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--streams", type=int, default=200, help="concurrent streams for the receive")
    ap.add_argument("--interval-ms", type=float, default=40.0)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {args.client_cpu})
    libraries = ["grpc.aio"] + (["grpclib"] if importlib.util.find_spec("grpclib") else [])
    starts: dict[str, list[float]] = {"old": [], "new": []}
    receives: dict[str, list[float]] = {lib: [] for lib in libraries}
    for i in range(args.rounds):
        for how in starts:
            us = with_fake(
                0.0,
                args.fake_cpu,
                partial(start_us, how=how, n=args.requests, concurrency=args.concurrency),
                args.port,
            )
            starts[how].append(us)
            print(f"round {i + 1}: start, {how}: {us:.0f} µs", flush=True)
        for lib in libraries:
            us = with_fake(
                args.interval_ms / 1000,
                args.fake_cpu,
                partial(receive_us, library=lib, streams=args.streams, requests=4 * args.streams, tokens=64),
                args.port,
            )
            receives[lib].append(us)
            print(f"round {i + 1}: receive, {lib}: {us:.1f} µs a message", flush=True)

    def cell(values: list[float], digits: int = 0) -> str:
        return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    lines = [
        "| client CPU | µs, median (min-max) |",
        "|---|---:|",
        f"| a 2-token stream, tritonclient's `stream_infer` (before) | {cell(starts['old'])} |",
        f"| a 2-token stream, `open_stream` (unary-stream, request built directly) | {cell(starts['new'])} |",
        *(
            f"| a message received, {lib}, {args.streams} streams at {1000 / args.interval_ms:.0f} tok/s | "
            f"{cell(receives[lib], 1)} |"
            for lib in libraries
        ),
    ]
    print("\n".join(lines))
    if args.write_docs:
        body = [
            "```\nflock /tmp/sluice-bench.lock .venv/bin/python -m bench.grpc_client --write-docs\n```",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_description()} (flags: {cpu_flags()}): this "
            f"process pinned to CPU {args.client_cpu}, the FAKE replica (bench/fake_replica.py) on CPU "
            f"{args.fake_cpu}; {args.rounds} rounds, alternating. Stream starts: {args.requests} requests of "
            f"2 tokens, {args.concurrency} at a time, the fake answering at once. Receive: "
            f"{4 * args.streams} requests of 64 tokens, {args.streams} at a time, one token a message every "
            f"{args.interval_ms:g} ms; CPU per message, the request's start included (1/64 of it).",
            "",
            *lines,
        ]
        write_section("grpc-client", "\n".join(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
