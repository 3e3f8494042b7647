"""What the gateway adds to time-to-first-token, against calling Triton directly.

One request at a time (no queueing); the same prompt length, 4 output tokens. Two measurements:

* **Same request** (the headline): the client's TTFT through the gateway minus the replica's TTFT for
  that very request, which the gateway reports in its ``Server-Timing`` header (``replica-ttft``: from
  just before it builds the gRPC request to the first token, i.e. what a direct gRPC client sees). The
  replica's own variance (scheduling on shared cores, tens of ms at p99 here) cancels out.
* **Alternating** (the cross-check): gateway and direct gRPC requests alternate, so both see the same
  machine state; quotes each path's p50/p99 and their differences.

The gateway path uses a minimal HTTP/1.1 client over one keep-alive connection (``--client raw``) so the
figure is the gateway's, not an HTTP library's; ``--client httpx`` shows what httpx itself adds.

    .venv/bin/python -m bench.gateway_overhead --base-url http://127.0.0.1:8080 --grpc-url 127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient

from bench.report import pct, write_measured
from sluice.triton.client import GenerateStream, request_tensors


@dataclass(frozen=True)
class Sample:
    ttft_ms: float  # as the client saw it
    replica_ttft_ms: float  # from the gateway's Server-Timing header


def replica_ttft_ms(server_timing: str) -> float:
    for part in server_timing.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name == "replica-ttft":
            return float(dur)
    raise ValueError(f"no replica-ttft in Server-Timing: {server_timing!r}")


def _body(model: str, prompt: list[int], max_tokens: int) -> bytes:
    req = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    return json.dumps(req).encode()


class GatewayClient(Protocol):
    max_tokens: int

    async def ttft(self, prompt: list[int]) -> Sample: ...
    async def close(self) -> None: ...


class RawClient:
    """HTTP/1.1 over one keep-alive connection: write the request, parse the chunked SSE reply."""

    def __init__(self, base_url: str, api_key: str, model: str) -> None:
        url = urlsplit(base_url)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self._api_key, self._model = api_key, model
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.max_tokens = 4

    async def ttft(self, prompt: list[int]) -> Sample:
        if self._conn is None:
            self._conn = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._conn
        body = _body(self._model, prompt, self.max_tokens)
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self._host}\r\n"
            f"Authorization: Bearer {self._api_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sent = time.perf_counter()
        writer.write(head + body)
        status, *header_lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        if " 200 " not in status:
            raise RuntimeError(f"gateway answered {status}")
        headers = dict(line.split(": ", 1) for line in header_lines if ": " in line)
        first = None
        while True:  # chunked transfer encoding: size line, data, CRLF; size 0 ends the body
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if first is None and b'"text":"' in data and b'"text":""' not in data:
                first = time.perf_counter()
            if size == 0:
                break
        if first is None:
            raise RuntimeError("no text chunk")
        return Sample((first - sent) * 1000, replica_ttft_ms(headers["server-timing"]))

    async def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()


class HttpxClient:
    def __init__(self, base_url: str, api_key: str, model: str) -> None:
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60)
        self._model = model
        self.max_tokens = 4

    async def ttft(self, prompt: list[int]) -> Sample:
        sent = time.perf_counter()
        first = None
        async with self._http.stream(
            "POST", "/v1/completions", content=_body(self._model, prompt, self.max_tokens)
        ) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if first is None and line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        first = time.perf_counter()
        if first is None:
            raise RuntimeError("no text chunk")
        return Sample((first - sent) * 1000, replica_ttft_ms(resp.headers["server-timing"]))

    async def close(self) -> None:
        await self._http.aclose()


async def direct_ttft_ms(
    client: grpcclient.InferenceServerClient, model: str, prompt: list[int], max_tokens: int
) -> float:
    sent = time.perf_counter()
    first = None
    async with GenerateStream(
        client, model, request_tensors(prompt, max_tokens, temperature=0.0, cache_scope="bench")
    ) as stream:
        async for chunk in stream:
            if first is None and chunk.token_ids:
                first = time.perf_counter()
    assert first is not None, "no tokens"
    return (first - sent) * 1000


async def run(args: argparse.Namespace) -> list[str]:
    rng = np.random.default_rng(args.seed)
    gateway: GatewayClient = (RawClient if args.client == "raw" else HttpxClient)(
        args.base_url, args.api_key, args.model
    )
    gateway.max_tokens = args.max_tokens
    grpc = grpcclient.InferenceServerClient(args.grpc_url)
    samples: list[Sample] = []
    direct_ms: list[float] = []
    try:
        for i in range(args.requests + args.warmup):
            prompt = rng.integers(3, 8192, args.prompt_len).tolist()
            sample = await gateway.ttft(prompt)
            direct = await direct_ttft_ms(
                grpc, args.model, prompt[::-1], args.max_tokens
            )  # distinct: no prefix-cache hit
            if i >= args.warmup:
                samples.append(sample)
                direct_ms.append(direct)
    finally:
        await gateway.close()
        await grpc.close()
    gateway_ms = [s.ttft_ms for s in samples]
    same = [s.ttft_ms - s.replica_ttft_ms for s in samples]
    paired = [g - d for g, d in zip(gateway_ms, direct_ms, strict=True)]
    return [
        f"client {args.client}, {len(samples)} requests each way, "
        f"prompt {args.prompt_len} tokens, {args.max_tokens} output tokens",
        "",
        "| measure | p50 ms | p99 ms |",
        "|---|---:|---:|",
        f"| **added by the gateway, same request** | **{pct(same, 50):.2f}** | **{pct(same, 99):.2f}** |",
        f"| TTFT direct to Triton (alternating) | {pct(direct_ms, 50):.2f} | {pct(direct_ms, 99):.2f} |",
        f"| TTFT through the gateway (alternating) | {pct(gateway_ms, 50):.2f} | {pct(gateway_ms, 99):.2f} |",
        f"| gateway minus direct, percentile by percentile | "
        f"{pct(gateway_ms, 50) - pct(direct_ms, 50):.2f} | {pct(gateway_ms, 99) - pct(direct_ms, 99):.2f} |",
        f"| gateway minus direct, pair by pair | {pct(paired, 50):.2f} | {pct(paired, 99):.2f} |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--grpc-url", default="127.0.0.1:8001")
    ap.add_argument("--api-key", default="sk-acme-dev")
    ap.add_argument("--model", default="sluice-tiny")
    ap.add_argument("--client", choices=["raw", "httpx"], default="raw")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--write-docs", action="store_true", help="replace this bench's section of docs/benchmarks.md"
    )
    args = ap.parse_args()
    lines = asyncio.run(run(args))
    print("\n".join(lines))
    if args.write_docs:
        command = (
            f"python -m bench.gateway_overhead --client {args.client} --requests {args.requests} "
            f"--prompt-len {args.prompt_len} --max-tokens {args.max_tokens} --write-docs"
        )
        write_measured("gateway-overhead", command, lines)


if __name__ == "__main__":
    main()
