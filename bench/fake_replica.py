"""A FAKE replica: a minimal Triton-protocol gRPC server (``ModelStreamInfer`` and the health and metadata
calls the gateway makes) that streams tokens at a fixed cadence with no engine behind it. For measuring
the gateway alone (bench/gateway_capacity.py): what it costs per streamed token, and how many streams it
carries, without an engine competing for the cores.

Each request gets ``request_output_len`` tokens, ``tokens_per_message`` to a response, one response every
``tokens_per_message x interval_s`` from the request's arrival (the first at once), carrying the CPU
engine model's output tensors (``sluice.wire``; what
model_repository/cpu_engine/1/replica_converters.py ``response_tensors`` builds): ``output_ids`` INT32
[1, 1, T] and ``sequence_length`` INT32 [1, 1], and on the last response ``finish_reason`` ("length"),
``num_prompt_tokens`` and ``num_cached_tokens``. The stream then ends, as Triton ends it. A request the
gateway cancels stops at its next send.

Responses are built once per shape and shared (the fake must cost little per message: its CPU is
reported beside the gateway's). ``FakeStats`` (shared memory) counts what it sent and how late its
timer woke, so a benchmark can tell the fake's own jitter from what the gateway adds.

    .venv/bin/python -m bench.fake_replica --port 9001     # serve until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

MODEL_VERSION = "1"
# Timer lateness histogram: LATE_BUCKET_US wide buckets, the last one open-ended.
LATE_BUCKET_US = 100
LATE_BUCKETS = 1000
# A cycle of ordinary token ids (the bench passes words of the checkpoint's tokenizer instead).
DEFAULT_TOKEN_IDS = tuple(range(1000, 1064))


class FakeStats:
    """Counters in shared memory, written by the fake's one thread, read by the bench process:
    tokens and messages sent, streams begun and ended, and the histogram of the timer's lateness. One
    slot the bench writes: ``TOKENS_PER_MESSAGE`` (0: the config's), taken by each stream that starts, at
    the config's message period."""

    TOKENS, MESSAGES, STREAMS, ENDED, CANCELLED, TOKENS_PER_MESSAGE = range(6)

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        # NOTE: Any: ctypes arrays of int64 (typeshed's SynchronizedArray is not what lock=False returns).
        self.counters: Any = ctx.Array("q", 6, lock=False)
        self.late: Any = ctx.Array("q", LATE_BUCKETS, lock=False)

    def snapshot(self) -> tuple[list[int], list[int]]:
        return list(self.counters), list(self.late)


def late_percentile_us(before: Sequence[int], after: Sequence[int], q: float) -> float:
    """The ``q``th percentile (0-100) of the timer's lateness between two ``late`` snapshots, in µs (the
    upper edge of its bucket); 0 with no sends."""
    counts = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(counts)
    if total == 0:
        return 0.0
    rank, seen = q / 100 * total, 0
    for i, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return float((i + 1) * LATE_BUCKET_US)
    return float(LATE_BUCKETS * LATE_BUCKET_US)


def _tensor(name: str, datatype: str, shape: list[int]) -> Any:
    out = service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype)
    out.shape.extend(shape)
    return out


def _int32s(values: Sequence[int]) -> bytes:
    return b"".join(int(v).to_bytes(4, "little", signed=True) for v in values)


def token_response(token_ids: Sequence[int], final: tuple[str, int, int] | None = None) -> Any:
    """One ``ModelStreamInferResponse`` carrying ``token_ids``; ``final`` (finish reason, prompt tokens,
    cached tokens) adds the last response's totals, as the CPU engine model's response_tensors does."""
    infer = service_pb2.ModelInferResponse(model_name="fake", model_version=MODEL_VERSION)
    infer.outputs.extend(
        [_tensor("output_ids", "INT32", [1, 1, len(token_ids)]), _tensor("sequence_length", "INT32", [1, 1])]
    )
    infer.raw_output_contents.extend([_int32s(token_ids), _int32s([len(token_ids)])])
    if final is not None:
        reason, num_prompt, num_cached = final
        infer.outputs.extend(
            [
                _tensor("finish_reason", "BYTES", [1, 1]),
                _tensor("num_prompt_tokens", "INT32", [1, 1]),
                _tensor("num_cached_tokens", "INT32", [1, 1]),
            ]
        )
        encoded = reason.encode()
        infer.raw_output_contents.extend(
            [len(encoded).to_bytes(4, "little") + encoded, _int32s([num_prompt]), _int32s([num_cached])]
        )
    return service_pb2.ModelStreamInferResponse(infer_response=infer)


def _input_int(request: Any, name: str, default: int) -> int:
    for i, tensor in enumerate(request.inputs):
        if tensor.name == name:
            raw = request.raw_input_contents[i] if i < len(request.raw_input_contents) else b""
            return int.from_bytes(raw[:4], "little", signed=True) if raw else default
    return default


@dataclass(frozen=True)
class FakeConfig:
    interval_s: float = 0.040  # per token
    tokens_per_message: int = 1
    token_ids: tuple[int, ...] = DEFAULT_TOKEN_IDS


class FakeReplica(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, config: FakeConfig, stats: FakeStats | None = None) -> None:
        self.config = config
        self.stats = stats
        self._by_size: dict[int, list[Any]] = {}

    def _messages(self, k: int) -> list[Any]:
        """Every message of ``k`` tokens a stream can send, by its position in the id cycle (shared)."""
        messages = self._by_size.get(k)
        if messages is None:
            ids = self.config.token_ids
            messages = [token_response([ids[(i + j) % len(ids)] for j in range(k)]) for i in range(len(ids))]
            self._by_size[k] = messages
        return messages

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelMetadataResponse(name=request.name, versions=[MODEL_VERSION], platform="fake")

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        request = await anext(aiter(request_iterator), None)  # one request per stream, as the gateway sends
        if request is None:
            return
        num_tokens = max(1, _input_int(request, "request_output_len", 16))
        num_prompt = _input_int(request, "input_lengths", 0)
        counters = self.stats.counters if self.stats is not None else None
        # NOTE: the message period stays the config's when the bench sets the tokens a message: more
        # tokens at the same message rate (what separates a message's cost from a token's).
        period_s = self.config.interval_s * self.config.tokens_per_message
        k = (
            counters[FakeStats.TOKENS_PER_MESSAGE] if counters is not None else 0
        ) or self.config.tokens_per_message
        messages = self._messages(k)
        late = self.stats.late if self.stats is not None else None
        if counters is not None:
            counters[FakeStats.STREAMS] += 1
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        sent, i = 0, 0
        try:
            while sent < num_tokens:
                due_s = start_s + i * period_s
                now_s = loop.time()
                if due_s > now_s:
                    await asyncio.sleep(due_s - now_s)
                    now_s = loop.time()
                n = min(k, num_tokens - sent)
                if sent + n >= num_tokens:
                    ids = self.config.token_ids
                    last = [ids[(sent + j) % len(ids)] for j in range(n)]
                    message = token_response(last, ("length", num_prompt, 0))
                elif n == k:
                    message = messages[sent % len(messages)]
                else:  # pragma: no cover - only the last message is short
                    message = token_response(self.config.token_ids[:n])
                if counters is not None and late is not None:
                    late[min(int((now_s - due_s) * 1e6) // LATE_BUCKET_US, LATE_BUCKETS - 1)] += 1
                    counters[FakeStats.TOKENS] += n
                    counters[FakeStats.MESSAGES] += 1
                yield message
                sent += n
                i += 1
        finally:
            if counters is not None:
                counters[FakeStats.ENDED if sent >= num_tokens else FakeStats.CANCELLED] += 1


async def serve(port: int, config: FakeConfig, stats: FakeStats | None = None) -> None:
    """Serve on 127.0.0.1:``port`` until cancelled (or SIGTERM / SIGINT)."""
    server = grpc.aio.server(
        options=[("grpc.max_concurrent_streams", 1 << 20), ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=None,
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeReplica(config, stats), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop(grace=0.5)


def run_process(port: int, config: FakeConfig, stats: FakeStats, cpus: set[int] | None) -> None:
    """A ``multiprocessing`` target: the fake in a process of its own (on ``cpus``, if given)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(port, config, stats))


def start_process(
    port: int, config: FakeConfig, stats: FakeStats, cpus: set[int] | None = None
) -> mp.process.BaseProcess:
    """Start the fake in a spawned process; returns once its port accepts connections."""
    proc = mp.get_context("spawn").Process(
        target=run_process, args=(port, config, stats, cpus), name="fake-replica", daemon=True
    )
    proc.start()
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError):
            import socket

            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.terminate()
            raise RuntimeError("the fake replica did not start")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9001)
    ap.add_argument("--interval-ms", type=float, default=40.0, help="per token")
    ap.add_argument("--tokens-per-message", type=int, default=1)
    args = ap.parse_args(argv)
    config = FakeConfig(args.interval_ms / 1000, args.tokens_per_message)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
